import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from serving.process import (
    ManagedProcess,
    free_port,
    port_in_use,
    socket_folder,
    sweep_socket_folders,
)
from tests.procs import running


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
    assert not running(child)


def test_a_server_dies_with_a_sigkilled_job(tmp_path):
    """No handler runs in a SIGKILLed job: the kernel ends its servers (PR_SET_PDEATHSIG);
    the socket folder it made stays until the next start sweeps it (a live job's stays)."""
    pidfile = tmp_path / "server.pid"
    job = subprocess.Popen([sys.executable, "-c", (
        "import os, sys, time; from pathlib import Path; "
        "from serving.process import ManagedProcess, socket_folder; "
        "folder = socket_folder('vllm'); "
        f"p = ManagedProcess('s', ['sleep', '300'], dict(os.environ), "
        f"Path({str(tmp_path)!r}) / 'log'); "
        f"Path({str(pidfile)!r}).write_text(f'{{p.pid}} {{folder}}'); time.sleep(300)")],
        cwd=Path(__file__).resolve().parents[2])
    deadline = time.time() + 30
    while not pidfile.exists() or not pidfile.read_text():
        assert time.time() < deadline and job.poll() is None
        time.sleep(0.05)
    server, folder = int(pidfile.read_text().split()[0]), Path(pidfile.read_text().split()[1])
    assert running(server) and folder.is_dir()
    mine = socket_folder("plane")
    try:
        assert folder not in sweep_socket_folders()  # its owner still runs
        job.kill()
        job.wait()
        deadline = time.time() + 5
        while running(server) and time.time() < deadline:
            time.sleep(0.05)
        assert not running(server)
        assert folder.is_dir()
        assert folder in sweep_socket_folders() and not folder.exists()
        assert mine.is_dir()
    finally:
        shutil.rmtree(mine)


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


def test_free_port_never_hands_out_one_port_twice(monkeypatch):
    """The kernel may answer two binds to port 0 with one port (CI once gave a Mooncake master
    the same port for RPC and metrics); a fake kernel that always answers the same port twice."""
    import socket

    real = socket.socket
    answers = iter([41001, 41001, 41002, 41002, 41003])

    class Kernel(real):
        def getsockname(self):
            return ("127.0.0.1", next(answers))

    monkeypatch.setattr(socket, "socket", Kernel)
    assert [free_port(), free_port(), free_port()] == [41001, 41002, 41003]
