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
    assert not [p for p in members if os.path.exists(f"/proc/{p}") and _state(p) not in "ZX"]


def test_memory_over_the_limit_is_killed_in_the_group_alone(group):
    proc = _spawn(group, sys.executable, "-c",
                  "x = bytearray(256 * 1024 * 1024); x[::4096] = b'1' * len(x[::4096]); "
                  "print('ALLOCATED')")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == -9 and b"ALLOCATED" not in out  # the OOM killer, in this group


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "X"
    return stat[stat.rindex(")") + 2]
