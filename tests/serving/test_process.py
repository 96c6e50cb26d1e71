import os
import sys
import time

from serving.process import ManagedProcess, free_port, port_in_use


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        return open(f"/proc/{pid}/stat").read().split()[2] != "Z"
    except OSError:
        return False


def test_stop_ends_the_whole_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    script = (f"import subprocess,time; p=subprocess.Popen(['sleep','300']); "
              f"open({str(pidfile)!r},'w').write(str(p.pid)); time.sleep(300)")
    proc = ManagedProcess("t", [sys.executable, "-c", script], dict(os.environ),
                          tmp_path / "log")
    deadline = time.time() + 10
    while not pidfile.exists() or not pidfile.read_text():
        assert time.time() < deadline
        time.sleep(0.05)
    child = int(pidfile.read_text())
    proc.stop(grace_s=2)
    assert not proc.alive()
    time.sleep(0.2)
    assert not _alive(child)


def test_last_error_names_the_failure(tmp_path):
    proc = ManagedProcess("t", [sys.executable, "-c", "raise ValueError('boom')"],
                          dict(os.environ), tmp_path / "log")
    proc.proc.wait(timeout=10)
    assert "ValueError: boom" in proc.last_error()
    proc.stop()


def test_port_in_use():
    import socket

    port = free_port()
    assert not port_in_use("127.0.0.1", port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert port_in_use("127.0.0.1", port)
