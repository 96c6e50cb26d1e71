"""Child processes that cannot outlive the job.

Each server runs in its own process group (so stopping it takes its workers too) and is told by
the kernel to exit if the job dies without cleaning up (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import httpx

from rollfleet.owner import sweep_temp, temp_folder
from serving.errors import ServingError

_PR_SET_PDEATHSIG = 1
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the color codes Dynamo's logs carry
_EXCEPTION = re.compile(r"^(\w+\.)*\w+(Error|Exception): ")


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class ManagedProcess:
    """A server process with its output in a log file; `stop()` ends its whole process group."""

    def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str], log_path: Path,
                 cwd: Path | None = None, fatal: Sequence[str] = ()) -> None:
        """`fatal`: patterns of log lines that say the process will never serve, although it
        keeps running (a frontend retrying a model it cannot load, say)."""
        self.name = name
        self.log_path = log_path
        self.fatal = [re.compile(p) for p in fatal]
        self._scanned = 0  # bytes of the log read for fatal lines
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(
            list(argv), env=dict(env), cwd=cwd, stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def fatal_line(self) -> str | None:
        """The first log line (since the last look) that matches a fatal pattern."""
        if not self.fatal:
            return None
        try:
            with self.log_path.open("rb") as f:
                f.seek(self._scanned)
                data = f.read()
        except OSError:
            return None
        end = data.rfind(b"\n") + 1  # whole lines only
        self._scanned += end
        for line in data[:end].decode(errors="replace").splitlines():
            line = _ANSI.sub("", line).strip()
            if any(p.search(line) for p in self.fatal):
                return line
        return None

    def last_error(self) -> str:
        """The line of the log that names the error, for one-line reports: the first
        exception line of the tail that is not a wrapper pointing elsewhere ("see root cause
        above"), else the last line naming an error."""
        lines = _ANSI.sub("", self.log_tail(200)).splitlines()
        for line in lines:
            if _EXCEPTION.search(line) and "root cause" not in line:
                return line.strip()
        for line in reversed(lines):
            if "Error" in line or "error:" in line:
                return line.strip()
        return lines[-1].strip() if lines else "no output"

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the group, wait up to `grace_s`, then SIGKILL whatever is left."""
        try:
            if self.alive():
                _signal_group(self.proc.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=grace_s)
            # Workers of the group may outlive its leader; never leave them behind.
            _signal_group(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)
        finally:
            self._log.close()


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


SOCKET_FOLDERS = ("plane", "vllm")  # the kinds of `socket_folder`


def socket_folder(kind: str) -> Path:
    """A folder for a server's unix sockets, named for this process (`rollfleet-<kind>-<pid>.
    <start time>.`) so that `sweep_socket_folders` can tell when its owner is gone."""
    assert kind in SOCKET_FOLDERS, kind
    return temp_folder(f"rollfleet-{kind}-")


def sweep_socket_folders() -> list[Path]:
    """Remove the socket folders of jobs that no longer run (one killed with SIGKILL stops its
    servers, PR_SET_PDEATHSIG, but cannot remove their folders)."""
    return [p for kind in SOCKET_FOLDERS for p in sweep_temp(f"rollfleet-{kind}-")]


_handed_out: set[int] = set()  # ports free_port gave this process, never given twice
_handed_out_lock = threading.Lock()


def free_port(host: str = "127.0.0.1", below: int | None = None) -> int:
    """A port nothing listens on and this process has not been given before.

    The kernel may answer two binds to port 0 with the same port when nothing holds the first
    yet (a Mooncake master once got one port for RPC and metrics and served neither); `below`
    keeps the port under a limit (the kernel's picks are high)."""
    for _ in range(200):
        if below is None:
            with socket.socket() as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
        else:
            port = random.randrange(below // 2, below)
            if port_in_use(host, port):
                continue
        with _handed_out_lock:
            if port not in _handed_out:
                _handed_out.add(port)
                return port
    raise OSError(f"no free port{f' below {below}' if below else ''} on {host} that this "
                  "process was not given before")


def accepts(host: str, port: int) -> bool:
    """Whether something listens on (host, port) and takes a connection."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def port_in_use(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def wait_serving(process: ManagedProcess, what: str, ready: Callable[[httpx.Client], bool],
                 deadline: float, waiting_for: str, abort: threading.Event | None = None) -> None:
    """Poll `ready(http)` until it holds. A process that exits first, a deadline that passes, or
    `abort` being set is a ServingError naming `what` and its log; transport errors and bad
    JSON mean "not yet"."""
    with httpx.Client(timeout=2.0) as http:
        while time.monotonic() < deadline:
            if abort is not None and abort.is_set():
                raise ServingError(f"{what}: start-up abandoned, the cluster is stopping")
            if not process.alive():
                raise ServingError(f"{what} exited during start-up (code "
                                   f"{process.proc.returncode}): {process.last_error()} "
                                   f"[log: {process.log_path}]")
            fatal = process.fatal_line()
            if fatal is not None:
                raise ServingError(f"{what} cannot start: {fatal} [log: {process.log_path}]")
            try:
                if ready(http):
                    return
            except (httpx.TransportError, ValueError):
                pass
            time.sleep(0.5)
    raise ServingError(f"{what} never {waiting_for}; log {process.log_path}")


def wait_until(check, timeout_s: float, interval_s: float = 0.5) -> bool:
    """Poll `check()` until it returns True or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(interval_s)
    return False
