"""Session cgroups on this host's real hierarchies: the limits bind even root, and removal
leaves no process and no group behind."""

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from envs import cgroups
from tests.procs import running

LAYOUT = cgroups.detect()
pytestmark = pytest.mark.skipif(LAYOUT is None, reason="no writable cgroup hierarchy here")

# A bounded tree of forks (3^5 = 363 processes at most, were no limit to apply): every process
# retries a refused fork until the group is killed, so the group is busy when it is.
TREE = """
import os, sys, time
forks = refused = 0
depth = 5
while depth and time.monotonic() < float(sys.argv[1]):
    try:
        if os.fork() == 0:
            depth -= 1
            forks = 0
            continue
        forks += 1
        if forks == 3:
            break
    except BlockingIOError:
        refused += 1
        time.sleep(0.01)
time.sleep(60)
"""


@pytest.fixture
def group():
    name = f"rf-test-{uuid.uuid4().hex[:8]}"
    dirs = cgroups.create(LAYOUT, name, nprocs=20, memory_bytes=64 * 1024 * 1024, cpu_cores=1.0)
    yield dirs
    cgroups.remove(dirs)
    assert not any(d.exists() for d in dirs)


def _spawn(dirs, *argv):
    return subprocess.Popen(argv, preexec_fn=lambda: cgroups.join(dirs), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_detects_what_this_host_offers():
    assert LAYOUT.version in ("v1", "v2")
    if LAYOUT.version == "v1":
        assert {"pids", "memory"} <= set(LAYOUT.bases)


def test_the_process_limit_binds_root_and_kill_leaves_nothing(group):
    assert os.getuid() == 0  # RLIMIT_NPROC would not stop root: only the group can
    proc = _spawn(group, sys.executable, "-c", TREE, str(time.monotonic() + 20))
    deadline = time.monotonic() + 10
    while len(cgroups.members(group)) < 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    members = cgroups.members(group)
    assert len(members) == 20  # the limit, reached and held
    cgroups.kill(group)
    proc.wait(timeout=5)
    assert not cgroups.members(group)
    assert not [p for p in members if running(p)]


def test_memory_over_the_limit_is_killed_in_the_group_alone(group):
    proc = _spawn(group, sys.executable, "-c",
                  "x = bytearray(256 * 1024 * 1024); x[::4096] = b'1' * len(x[::4096]); "
                  "print('ALLOCATED')")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == -9 and b"ALLOCATED" not in out  # the OOM killer, in this group


def test_the_cpu_ceiling_binds():
    """Two spinners for 1.5 s in a group held to 0.2 cores: throttled, at most ~0.3 s of CPU."""
    dirs = cgroups.create(LAYOUT, f"rf-test-{uuid.uuid4().hex[:8]}", nprocs=10,
                          memory_bytes=64 * 1024 * 1024, cpu_cores=0.2)
    try:
        cpu_stat = next((d / "cpu.stat" for d in dirs if (d / "cpu.stat").exists()), None)
        if cpu_stat is None:
            pytest.skip("no cpu controller in the session's groups")
        spin = ("import os, time\nos.fork()\nend = time.monotonic() + 1.5\n"
                "while time.monotonic() < end: pass\nos.write(1, b'%f\\n' % time.process_time())")
        out, _ = _spawn(dirs, sys.executable, "-c", spin).communicate(timeout=30)
        used = sum(float(x) for x in out.split())
        stat = dict(line.split()[:2] for line in cpu_stat.read_text().splitlines())
    finally:
        cgroups.remove(dirs)
    assert int(stat["nr_throttled"]) > 0 and used < 0.2 * 1.5 * 1.3 + 0.1, (used, stat)


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "X"
    return stat[stat.rindex(")") + 2]
