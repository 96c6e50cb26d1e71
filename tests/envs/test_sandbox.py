"""Hostile tool calls: each one fails or is cut off, the host is unharmed, the session says so;
on both sandbox paths (a sandbox per command, and one per session: env.sandbox.persistent)."""

import os
import shutil
import socket
import subprocess
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from envs import EnvConfig, load
from envs.lease import TEMPLATE
from envs.sandbox import SandboxFailure, SandboxPolicy, stop, wait_exit
from envs.workspace import Workspace
from tests.procs import running

PROJECT = Path(__file__).resolve().parents[2]
TASK = PROJECT / "envs" / "tasks" / "mini_swe" / "stack_pop"
POLICY = SandboxPolicy(nprocs=32, file_size_mb=8, memory_mb=1024, cpu_s=10, disk_mb=24,
                       open_files=64)
AS_ROOT = pytest.mark.skipif(os.getuid() != 0, reason="the session uid and quota need root")

# Forks children that sleep until the limit refuses one, then reports how many it got.
FORK_UNTIL_REFUSED = """
import os, time
n = 0
try:
    while n < 1000:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
except OSError as exc:
    print("refused after", n, exc.errno)
"""


@pytest.fixture(params=[False, True], ids=["per-command", "persistent"])
def persistent(request) -> bool:
    return request.param


@pytest.fixture
def ws(persistent):
    w = Workspace(lambda dest: shutil.copytree(TASK / "repo", dest, dirs_exist_ok=True),
                  policy=replace(POLICY, persistent=persistent))
    yield w
    w.close()


def sh(ws, command, timeout_s=5.0):
    return ws.run(["bash", "-c", command], timeout_s, 2000)


@AS_ROOT
def test_runs_as_its_own_unprivileged_uid_in_its_folder(ws):
    out = sh(ws, "id -u; pwd; echo hi > note && cat note").output.split()
    assert out == [str(ws.lease.uid), str(ws.path), "hi"]
    assert POLICY.uid_first <= ws.lease.uid < POLICY.uid_first + POLICY.uid_count
    assert ws.path.stat().st_uid == ws.lease.uid


def test_cannot_write_outside_the_folder(ws):
    marker = f"rollfleet-escape-{uuid.uuid4().hex}"
    res = sh(ws, f"echo x > /etc/{marker}; echo x > /var/{marker}; echo x > {ws.home}/{marker}")
    assert "Read-only file system" in res.output or "Permission denied" in res.output
    assert not Path("/etc", marker).exists() and not Path("/var", marker).exists()
    assert not (ws.home / marker).exists()


def test_only_the_system_folders_of_the_root_are_seen(ws):
    """The root inside holds the system folders (sandbox.system), /dev, /proc, and the first
    folders of the hidden, exposed and session paths; not /sys, /boot or anything else."""
    seen = set(sh(ws, "ls -A /").output.split())
    paths = (*POLICY.system, *POLICY.hide, *POLICY.expose, str(ws.path))
    allowed = {Path(p).parts[1] for p in paths} | {"dev", "proc"}
    assert seen <= allowed and "usr" in seen and "etc" in seen, seen - allowed
    assert not {"sys", "boot", "srv"} & seen


@AS_ROOT
def test_hidden_folders_read_as_empty(ws):
    """Home folders, temp folders, /run, this checkout (tasks' hidden tests and solutions) and
    the other sessions' folders are empty inside; the interpreter alone is re-exposed."""
    secrets = [Path(d) / f".rollfleet-secret-{uuid.uuid4().hex}" for d in
               ("/root", "/tmp", "/var/tmp", "/run")]
    other = Workspace(lambda dest: (dest / "theirs.txt").write_text("hunter2"), policy=POLICY)
    for s in secrets:
        s.write_text("hunter2")
    try:
        probes = [*secrets, other.path / "theirs.txt", PROJECT / "README.md",
                  TASK / "hidden" / "test_hidden_stack.py", TASK / "solution" / "stack.py"]
        res = sh(ws, " ".join(f"cat {p};" for p in probes) + f" ls -A {PROJECT}")
        assert "hunter2" not in res.output and "def pop" not in res.output
        assert res.output.count("No such file") == len(probes)
        assert res.output.split()[-1] == ".venv"  # the interpreter, alone
    finally:
        for s in secrets:
            s.unlink()
        other.close()


def test_python_starts_with_its_packages_but_not_the_checkouts_import_hook(ws):
    """The editable install's finder maps packages into the hidden checkout: it is masked (20 ms
    of every sandboxed Python's ~40), site-packages stays importable."""
    probe = ("import sys, yaml; print(sorted(m for m in sys.modules if 'editable' in m), "
             "yaml.__name__)")
    host = subprocess.run([ws.python(), "-c", probe], capture_output=True, text=True, check=True)
    assert "__editable___rollfleet" in host.stdout  # this checkout is an editable install
    res = ws.run([ws.python(), "-c", probe], 10, 2000)
    assert res.output.split() == ["[]", "yaml"], res.output


def test_masked_task_files_cannot_be_read(persistent):
    """A stdlib task's unbroken module is on the read-only root; its copy would be the fix."""
    env = load(EnvConfig(suite="stdlib", max_tasks=1, sandbox={"persistent": persistent}))
    task = next(iter(env.tasks.values()))
    masked = task.repo.masked_paths()
    assert "import" in Path(masked[0]).read_text()
    with env.episode(task.task_id) as episode:
        res = episode.workspace.run(["bash", "-c", " ".join(f"cat {m};" for m in masked)], 5,
                                    4000)
    assert res.output.count("Permission denied") == len(masked) and "import" not in res.output


def test_no_network(ws):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        code = (f"import socket; s=socket.socket(); s.settimeout(2); "
                f"s.connect(('127.0.0.1', {port})); print('CONNECTED')")
        res = ws.run([ws.python(), "-c", code], 10, 2000)
    assert "CONNECTED" not in res.output
    assert "Connection refused" in res.output or "unreachable" in res.output


@AS_ROOT
def test_the_process_limit_applies(ws):
    res = ws.run([ws.python(), "-c", FORK_UNTIL_REFUSED], 10, 2000)
    assert not res.timed_out, res.output
    words = res.output.split()
    assert words[:2] == ["refused", "after"] and words[3] == "11", res.output  # EAGAIN
    assert POLICY.nprocs - 8 <= int(words[2]) < POLICY.nprocs  # bwrap and python count too


@AS_ROOT
def test_fork_bomb_is_contained(ws):
    sh(ws, "true")
    before = _processes_of(ws.lease.uid)  # the session's exec server, on the persistent path
    start = time.monotonic()
    res = sh(ws, "bomb() { bomb | bomb & }; bomb; sleep 2; echo survived", timeout_s=6)
    assert time.monotonic() - start < 15
    assert "fork: retry: Resource temporarily unavailable" in res.output
    # The host can still start processes, and nothing of the bomb is left.
    assert subprocess.run(["true"], check=False).returncode == 0
    assert _processes_of(ws.lease.uid) <= before


@AS_ROOT
def test_stop_waits_for_the_init_bwrap_names_after_bwrap_is_gone(ws):
    """bwrap exits as soon as the command does, while the namespace's init may still be killing
    what the command left: stop() waits on the init that bwrap reported as it started it (pid 1
    of the sandbox's namespace, bwrap's child), found even once bwrap is gone."""
    proc = ws.lease.start(["bash", "-c", "for i in $(seq 20); do sleep 30 & done; read"],
                          ws.policy, cwd=ws.path, stdin=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 10
    while (init := proc.init_pid()) is None or len(_processes_of(ws.lease.uid)) < 21:
        assert time.monotonic() < deadline, "bwrap never said which process is its init"
        time.sleep(0.01)
    status = Path(f"/proc/{init}/status").read_text()
    assert f"PPid:\t{proc.pid}\n" in status and "\t1\n" in status.split("NSpid:")[1]
    proc.stdin.close()  # the command ends by itself; its 20 sleepers are left to the init
    assert wait_exit(proc.pid, 10)
    stop(proc)
    assert not running(init) and _processes_of(ws.lease.uid) == set()


def _processes_of(uid: int) -> set[int]:
    out = subprocess.run(["pgrep", "-u", str(uid)], capture_output=True, text=True).stdout
    return {int(pid) for pid in out.split()}


def test_cpu_seconds_are_bounded(persistent):
    w = Workspace(lambda dest: None, policy=SandboxPolicy(cpu_s=1, persistent=persistent))
    try:
        start = time.monotonic()
        res = w.run(["bash", "-c", "python3 -c 'while True: pass'; echo status=$?"], 20, 2000)
        assert time.monotonic() - start < 10 and not res.timed_out
        assert "Killed" in res.output and "status=137" in res.output  # at the CPU limit
    finally:
        w.close()


def test_open_files_are_bounded(ws):
    code = ("fs = []\ntry:\n    while len(fs) < 10000:\n        fs.append(open('/dev/null'))\n"
            "except OSError as exc:\n    print(len(fs), exc.errno)")
    opened, err = ws.run([ws.python(), "-c", code], 10, 2000).output.split()
    assert err == "24" and POLICY.open_files - 8 <= int(opened) < POLICY.open_files  # EMFILE


def test_one_file_is_cut_at_the_file_size_limit(ws):
    res = sh(ws, "dd if=/dev/zero of=big bs=1M count=200 2>&1; ls -l big", timeout_s=20)
    assert "File size limit exceeded" in res.output or "File too large" in res.output
    assert (ws.path / "big").stat().st_size <= POLICY.file_size_mb * 1024 * 1024


@AS_ROOT
def test_filling_the_disk_stops_at_the_session_quota(ws):
    """Files of 4 MB until the disk refuses: ENOSPC inside; the host's disk is not written."""
    res = sh(ws, "i=0; while head -c 4M /dev/zero > f$i; do i=$((i+1)); done; echo files=$i",
             timeout_s=20)
    assert "No space left on device" in res.output and not res.timed_out
    used = sum(p.stat().st_size for p in ws.path.iterdir())
    assert POLICY.disk_mb * 1024 * 1024 * 0.9 <= used <= POLICY.disk_mb * 1024 * 1024
    assert (ws.path / "f0").stat().st_dev != ws.home.stat().st_dev  # on the session's tmpfs
    assert sh(ws, "rm f0 && echo freed").output.strip() == "freed"  # the session can recover


def test_sleep_forever_is_killed(ws):
    start = time.monotonic()
    res = sh(ws, "sleep 1000 & sleep 1000", timeout_s=1)
    assert res.timed_out and res.exit_code is None
    assert time.monotonic() - start < 5
    uid = ws.lease.uid if ws.lease.uid is not None else os.getuid()
    left = subprocess.run(["pgrep", "-u", str(uid), "-x", "sleep"], capture_output=True)
    assert left.stdout == b""


def test_wait_exit_sees_an_exit_and_stops_at_the_timeout():
    """An exit is seen whether or not the caller reaped it (or could: a grandchild)."""
    quick = subprocess.Popen(["true"])
    assert wait_exit(quick.pid, 10) and quick.poll() == 0  # a zombie until reaped
    assert wait_exit(quick.pid, 10)  # reaped
    slow = subprocess.Popen(["sleep", "30"])
    try:
        assert not wait_exit(slow.pid, 0.2) and slow.poll() is None
    finally:
        slow.kill()
        slow.wait()
    parent = subprocess.Popen(["sh", "-c", "sleep 0.3 & echo $!; wait"], stdout=subprocess.PIPE)
    grandchild = int(parent.stdout.readline())
    assert wait_exit(grandchild, 10)
    parent.wait()


def test_huge_output_is_truncated(ws):
    res = sh(ws, "yes rollfleet | head -c 50000000", timeout_s=20)
    assert "truncated ...]" in res.output
    assert len(res.output) < 2500


def test_memory_is_bounded_per_process(ws):
    res = ws.run([ws.python(), "-c", "x = bytearray(4 * 1024**3); print('ALLOCATED')"], 10, 2000)
    assert "MemoryError" in res.output and "ALLOCATED" not in res.output


@AS_ROOT
def test_memory_is_bounded_per_session(persistent):
    """Three processes each under the per-process limit, together over the session's: the
    kernel kills in this session (its cgroup), and the host process is untouched."""
    policy = SandboxPolicy(memory_mb=160, disk_mb=16, persistent=persistent)
    w = Workspace(lambda dest: None, policy=policy)
    try:
        if not w.lease.groups:
            pytest.skip("no writable cgroup: the session's total memory is not bounded")
        hog = "x = bytearray(100 * 1024**2); x[::4096] = b'1' * len(x[::4096]); import time; " \
              "time.sleep(3); print('HELD')"
        res = w.run(["bash", "-c", f"for i in 1 2 3; do python3 -c \"{hog}\" & done; wait"], 30,
                    4000)
        assert res.output.splitlines().count("HELD") < 3 and "Killed" in res.output
    finally:
        w.close()


@AS_ROOT
def test_other_sessions_mounts_are_not_in_the_sandbox(ws, tmp_path):
    """A session's sandbox takes in none of the mounts other sessions hold under /tmp: bwrap
    remounts every mount it takes in, and one that vanished meanwhile failed the start."""
    other = tmp_path / "other-session"
    other.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(other)], check=True)
    try:
        res = sh(ws, "awk '{print $5}' /proc/self/mountinfo | grep '^/tmp/'")
    finally:
        subprocess.run(["umount", str(other)], check=True)
    assert res.exit_code == 0, res.output
    mounts = res.output.split()
    assert str(ws.path) in mounts  # the session's own folder is there
    assert not [m for m in mounts if m.startswith(str(tmp_path))], mounts


def _mounts_bwrap_starts_from(ws) -> int:
    """Lines of the mount table of the namespace a session's bwrap starts in (the chain of
    execs before it keeps the pid: the pid is bwrap's once it runs)."""
    proc = ws.lease.start(["sleep", "10"], ws.policy, cwd=ws.path, start_new_session=True)
    try:
        deadline = time.monotonic() + 5
        while Path(f"/proc/{proc.pid}/comm").read_text().strip() != "bwrap":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        return len(Path(f"/proc/{proc.pid}/mountinfo").read_text().splitlines())
    finally:
        stop(proc)


@AS_ROOT
def test_a_sandbox_starts_apart_from_the_other_sessions_mounts(ws):
    """bwrap walks the mount table for each folder it binds: the namespace it starts in holds
    no other session's tmpfs, so a start costs the same with 1 or 40 sessions open, whether
    the template was made before they opened or while they were open (it detaches them)."""
    alone = _mounts_bwrap_starts_from(ws)
    others = [Workspace(lambda dest: None, policy=POLICY) for _ in range(40)]
    try:
        assert all(o.lease.mounts == ws.lease.mounts for o in others)
        assert _mounts_bwrap_starts_from(ws) == alone
        TEMPLATE.close()  # the next start makes the template with the 41 sessions' mounts up
        assert _mounts_bwrap_starts_from(ws) == alone
        assert sh(ws, "cat stack.py").exit_code == 0  # its own files are there
    finally:
        for o in others:
            o.close()


def test_what_a_command_leaves_running_ends_with_it(ws):
    """Even a daemon of its own session (setsid) is gone once its command returns. (The
    sleeps are told apart by a duration no other process on the host sleeps: counting every
    `sleep` of the uid took another program's for the sandbox's.)"""
    mine = f"sleep 1000.{os.getpid()}"
    # the command returns once both run (a loaded host may not have exec'd them yet: then the
    # check below would pass with nothing killed)
    res = sh(ws, f"setsid -f {mine}; {mine} & until [ $(pgrep -c -f -x '{mine}') = 2 ]; "
                 "do sleep 0.01; done; echo started")
    assert res.output == "started\n" and res.exit_code == 0
    left = subprocess.run(["pgrep", "-f", "-x", mine], capture_output=True)
    assert left.stdout == b""


def test_a_persistent_sandbox_starts_once_per_session():
    """Every command runs in the same sandbox (its PID namespace's init started once); a
    command that kills the exec server (every process of the session's uid) ends with 137, and
    the next runs in a new sandbox on the same files."""
    w = Workspace(lambda dest: None, policy=replace(POLICY, persistent=True))
    started = "awk '{print $22}' /proc/1/stat"  # when the namespace's init started
    try:
        inits = {sh(w, f"{started} | tee init").output for _ in range(3)}
        assert len(inits) == 1
        killed = sh(w, "kill -9 -1; sleep 1")
        assert killed.exit_code == 137 and not killed.timed_out
        again = sh(w, f"cat init; {started}").output.splitlines()
        assert again[0] == inits.pop().strip() != again[1]
    finally:
        w.close()


def test_a_sandbox_that_cannot_start_is_a_sandbox_failure(persistent, monkeypatch):
    """bwrap's own complaint (here a stand-in that says what bwrap says) is the error: the
    harness failed, not the agent."""
    bwrap_says = "echo 'bwrap: Creating new namespace failed: No space left on device' >&2; exit 1"
    monkeypatch.setattr("envs.lease.wrap",
                        lambda argv, workdir, policy, source, capabilities=True, info_fd=None: [
                            "sh", "-c", bwrap_says])
    w = Workspace(lambda dest: None, policy=replace(POLICY, persistent=persistent))
    try:
        with pytest.raises(SandboxFailure, match="^bwrap: Creating new namespace failed"):
            w.run(["true"], 5, 1000)
    finally:
        w.close()
