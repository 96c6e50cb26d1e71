"""Helpers for tests that must prove the job leaves no process behind."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

STARTED_BY_JOB = ("vllm", "EngineCore", "raylet", "gcs_server", "ray::", "wandb-core",
                  "dynamo", "mooncake", "etcd", "nats-server")


def running(pid: int) -> bool:
    """Whether process `pid` runs: a zombie has finished."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"  # the state follows the name, which may hold ")"


WORKER_ENV = "PYTEST_XDIST_WORKER"  # pytest-xdist sets it in each worker; children inherit it
SESSION_ENV = "ROLLFLEET_TEST_SESSION"  # the suite's pid (tests/conftest.py); children inherit it


def process_table() -> dict[int, str]:
    """The command line of every process this test session started, and of no other: it
    descends from the session, or carries the session's mark in its environment (a daemon
    that left its parent); less those another pytest-xdist worker of the session started (its
    name in their environment, or in their nearest ancestor's that has one: etcd, Mooncake
    and sandboxes start with a bare environment). A test never takes another program of the
    same user, or another test run, for leftovers of its own. Outside a test session: every
    process."""
    me, session = os.environ.get(WORKER_ENV), os.environ.get(SESSION_ENV)
    table, parent, worker, marked = {}, {}, {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            parent[pid] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        table[pid] = cmd.strip()
        marks = _marks(entry)
        worker[pid], marked[pid] = marks.get(WORKER_ENV), marks.get(SESSION_ENV)
    if session is not None:
        table = {pid: cmd for pid, cmd in table.items()
                 if _of_session(pid, int(session), session, parent, marked)}
    if me is None:
        return table
    # the workers themselves set the name after they started: they are the controller's children
    for pid in table:
        if parent[pid] == os.getppid():
            worker[pid] = me if pid == os.getpid() else f"not {me}"

    def owner(pid: int) -> str | None:
        seen = set()
        while pid in table and pid not in seen and worker[pid] is None:
            seen.add(pid)
            pid = parent[pid]
        return worker.get(pid)

    return {pid: cmd for pid, cmd in table.items() if owner(pid) in (None, me)}


def _of_session(pid: int, session_pid: int, session: str, parent: dict[int, int],
                marked: dict[int, str | None]) -> bool:
    """Whether `pid` is the session's: the session's mark in its environment or its nearest
    marked ancestor's, or the session among its ancestors."""
    seen = set()
    while pid in parent and pid not in seen:
        if pid == session_pid:
            return True
        if marked.get(pid) is not None:
            return marked[pid] == session
        seen.add(pid)
        pid = parent[pid]
    return False


def _marks(proc: Path) -> dict[str, str]:
    """The pytest-xdist worker and the test session named in a process's environment (as it
    was at exec)."""
    try:
        env = (proc / "environ").read_bytes().split(b"\0")
    except OSError:
        return {}
    out = {}
    for item in env:
        key, _, value = item.partition(b"=")
        if key in (WORKER_ENV.encode(), SESSION_ENV.encode()):
            out[key.decode()] = value.decode()
    return out


def children(pid: int) -> list[int]:
    """Direct children of `pid`, started from any of its threads."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def new_job_processes(before: dict[int, str]) -> list[str]:
    """Processes that did not exist in `before` and look like engines, Ray or wandb."""
    now = process_table()
    return [f"{pid}: {cmd[:120]}" for pid, cmd in now.items()
            if pid not in before and pid != os.getpid()
            and any(marker in cmd for marker in STARTED_BY_JOB)]


def listening(pids: set[int]) -> list[str]:
    """Local addresses the given processes listen on (TCP)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    return [line.split()[3] for line in out.splitlines()
            if any(f"pid={pid}," in line for pid in pids)]


def unix_socket_paths(pids: list[int]) -> set[str]:
    """Filesystem paths of the unix sockets the given processes hold open."""
    inodes: set[str] = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    paths = set()
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[6] in inodes and fields[7].startswith("/"):
            paths.add(fields[7])
    return paths


def temp_litter() -> set[str]:
    """What engines leave directly in the system's temp folder unless told otherwise: socket
    files (vLLM's ZMQ), `vllm_dist_*` file stores and `tmp*.json` files (Dynamo's logging
    configs)."""
    root = Path(tempfile.gettempdir())
    return {str(p) for p in root.iterdir() if p.is_socket()} | {
        str(p) for pattern in ("tmp*.json", "vllm_dist_*") for p in root.glob(pattern)}
