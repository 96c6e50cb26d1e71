"""Hostile tool calls: each one fails or is cut off, the host is unharmed, the session says so."""

import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from envs.sandbox import SandboxPolicy
from envs.workspace import Workspace

REPO = Path(__file__).resolve().parents[2] / "envs" / "tasks" / "mini_swe" / "stack_pop" / "repo"
POLICY = SandboxPolicy(nprocs=32, file_size_mb=8, memory_mb=1024, cpu_s=10)


@pytest.fixture
def ws():
    w = Workspace(lambda dest: shutil.copytree(REPO, dest, dirs_exist_ok=True), policy=POLICY)
    yield w
    w.close()


def sh(ws, command, timeout_s=5.0):
    return ws.run(["bash", "-c", command], timeout_s, 2000)


def test_runs_as_nobody_in_its_folder(ws):
    out = sh(ws, "id -u; pwd; echo hi > note && cat note").output.split()
    assert out == ["65534", str(ws.path), "hi"]


def test_cannot_write_outside_the_folder(ws):
    marker = f"rollfleet-escape-{uuid.uuid4().hex}"
    res = sh(ws, f"echo x > /etc/{marker}; echo x > /var/{marker}; echo x > {ws.home}/{marker}")
    assert "Read-only file system" in res.output or "Permission denied" in res.output
    assert not Path("/etc", marker).exists() and not Path("/var", marker).exists()
    assert not (ws.home / marker).exists()


def test_cannot_read_home_secrets(ws, tmp_path):
    secret = Path("/root") / f".rollfleet-secret-{uuid.uuid4().hex}"
    secret.write_text("hunter2")
    try:
        res = sh(ws, f"cat {secret}; ls /root")
        assert "hunter2" not in res.output
        assert "No such file" in res.output
    finally:
        secret.unlink()


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


def test_fork_bomb_is_contained(ws):
    start = time.monotonic()
    res = sh(ws, "bomb() { bomb | bomb & }; bomb; sleep 2; echo survived", timeout_s=6)
    assert time.monotonic() - start < 15
    assert "Resource temporarily unavailable" in res.output or res.timed_out
    # The host can still start processes, and nothing of the bomb is left.
    assert subprocess.run(["true"], check=False).returncode == 0
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-u", "65534", "-f", "bomb"], capture_output=True)
    assert left.stdout == b""


def test_disk_filling_is_cut_at_the_file_size_limit(ws):
    res = sh(ws, "dd if=/dev/zero of=big bs=1M count=200 2>&1; ls -l big", timeout_s=20)
    assert "File size limit exceeded" in res.output or "File too large" in res.output
    assert (ws.path / "big").stat().st_size <= POLICY.file_size_mb * 1024 * 1024


def test_sleep_forever_is_killed(ws):
    start = time.monotonic()
    res = sh(ws, "sleep 1000 & sleep 1000", timeout_s=1)
    assert res.timed_out and res.exit_code is None
    assert time.monotonic() - start < 5
    left = subprocess.run(["pgrep", "-u", "65534", "-x", "sleep"], capture_output=True)
    assert left.stdout == b""


def test_huge_output_is_truncated(ws):
    res = sh(ws, "yes rollfleet | head -c 50000000", timeout_s=20)
    assert "truncated ...]" in res.output
    assert len(res.output) < 2500


def test_memory_is_bounded(ws):
    res = ws.run([ws.python(), "-c", "x = bytearray(4 * 1024**3); print('ALLOCATED')"], 10, 2000)
    assert "MemoryError" in res.output and "ALLOCATED" not in res.output


@pytest.mark.skipif(os.getuid() != 0, reason="dropping to the sandbox uid needs root")
def test_folder_belongs_to_the_sandbox_user(ws):
    assert ws.path.stat().st_uid == POLICY.uid
