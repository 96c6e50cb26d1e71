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


def process_table() -> dict[int, str]:
    """Every process's command line, less those another pytest-xdist worker started (its
    name in their environment, or in their nearest ancestor's that has one: etcd, Mooncake
    and sandboxes start with a bare environment), so that a test running beside another
    never takes that one's engines for leftovers of its own."""
    me = os.environ.get(WORKER_ENV)
    table, parent, worker = {}, {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if me is not None:
                parent[pid] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        table[pid] = cmd.strip()
        if me is not None:
            worker[pid] = _worker_of(entry)
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


def _worker_of(proc: Path) -> str | None:
    """The pytest-xdist worker named in a process's environment (as it was at exec)."""
    prefix = f"{WORKER_ENV}=".encode()
    try:
        env = (proc / "environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return next((v[len(prefix):].decode() for v in env if v.startswith(prefix)), None)


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
