"""The template mount namespace sandboxes start from (envs/mount_template.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envs import lease
from envs.mount_template import MountTemplate
from envs.sandbox import SandboxPolicy, bwrap_available
from envs.workspace import Workspace
from tests.procs import running

AS_ROOT = pytest.mark.skipif(os.getuid() != 0 or not bwrap_available(),
                             reason="needs root and bwrap (scripts/setup.sh)")
POLICY = SandboxPolicy(persistent=False)


def _sources(pid: int) -> list[str]:
    return [line.split(" - ", 1)[1].split()[1]
            for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()]


def _gone(pid: int, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@AS_ROOT
def test_the_template_holds_no_session_mount():
    """Made while sessions are open, it holds none of their tmpfs; they stay on the host."""
    spaces = [Workspace(lambda dest: None, policy=POLICY) for _ in range(3)]
    template = MountTemplate(lambda: lease._mounts(lease.MOUNT_SOURCE))
    try:
        pid = int(template.path().parent.parent.name)
        assert lease.MOUNT_SOURCE not in _sources(pid)
        assert _sources(os.getpid()).count(lease.MOUNT_SOURCE) >= 3
    finally:
        template.close()
        for ws in spaces:
            ws.close()
    assert _gone(pid)


@AS_ROOT
def test_a_dead_holder_is_started_again():
    ws = Workspace(lambda dest: (dest / "f").write_text("mine\n"), policy=POLICY)
    try:
        assert ws.run(["cat", "f"], 30, 1000).output == "mine\n"
        first = int(lease.TEMPLATE.path().parent.parent.name)
        os.kill(first, signal.SIGKILL)
        assert _gone(first)
        assert ws.run(["cat", "f"], 30, 1000).output == "mine\n"
        assert int(lease.TEMPLATE.path().parent.parent.name) != first
    finally:
        ws.close()


@AS_ROOT
def test_the_holder_ends_with_its_owner():
    """Its owner killed, no close() called: the holder sees its input close and exits."""
    code = ("from envs import lease; print(lease.TEMPLATE.path().parent.parent.name, "
            "flush=True); import time; time.sleep(60)")
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                             cwd=Path(__file__).parents[2])
    try:
        holder = int(owner.stdout.readline())
        assert not _gone(holder, 0.2)
    finally:
        owner.kill()
        owner.wait()
    assert _gone(holder)
