"""One sandbox for a session's whole life (`env.sandbox.persistent`), holding an exec server.

A sandbox per command costs a new bwrap (namespaces, some 30 mounts), setpriv and the command:
most of a trivial tool call's CPU. Here bwrap starts once, with envs/exec_server.py inside as
the session's uid; each command is then one fork and exec there, in a process group of its own,
and what it leaves is killed when it ends, as when its own sandbox went away. The isolation is
the same sandbox's (uid, cgroup, disk, network and PID namespaces, rlimits per process); what a
command changes outside its folder inside the sandbox (nothing is writable there but the folder)
cannot outlive it. An agent's command that kills the server (`kill -9 -1`) ends with status
137, and the next command starts a fresh sandbox on the same files.
"""

from __future__ import annotations

import contextlib
import marshal
import socket
import subprocess
import sys
from pathlib import Path

from envs.lease import SessionLease
from envs.sandbox import SandboxPolicy, SandboxProcess, setup_failure, stop

SERVER_SOURCE = (Path(__file__).with_name("exec_server.py")).read_text()
REPLY_GRACE_S = 10.0  # past a command's timeout, the server's answer is overdue: it is stuck
KILLED = 128 + 9  # a command whose server was killed under it: as a shell reports SIGKILL


class SessionSandbox:
    """A session's bwrap and the exec server inside it; started on the first command."""

    def __init__(self, lease: SessionLease, policy: SandboxPolicy) -> None:
        self.lease, self.policy = lease, policy
        self.workdir, self.home = lease.repo, lease.home
        self._proc: SandboxProcess | None = None
        self._sock: socket.socket | None = None

    def run(self, argv: list[str], env: dict[str, str], timeout_s: float,
            out: int) -> tuple[int | None, bool]:
        """(exit status or None at the timeout, timed out) of `argv`, its output on `out`."""
        sock = self._sock or self._start(env)
        request = {"argv": argv, "env": {**env, "HOME": str(self.workdir),
                                         "TMPDIR": str(self.workdir)},
                   "cwd": str(self.workdir), "timeout_s": timeout_s}
        try:
            socket.send_fds(sock, [marshal.dumps(request)], [out])
            sock.settimeout(timeout_s + REPLY_GRACE_S)
            reply = sock.recv(4096)
        except TimeoutError:
            self.close()
            return None, True
        except OSError:
            reply = b""
        if not reply:  # the server died under the command (killed by it, or out of memory)
            self._failed_start()
            self.close()
            return KILLED, False
        if reply == b"timeout":
            return None, True
        return int(reply), False

    def _start(self, env: dict[str, str]) -> socket.socket:
        host, inner = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [sys.executable, "-I", "-S", "-c", SERVER_SOURCE, str(inner.fileno())]
        with open(self.home / "exec-server.log", "ab") as log:
            self._proc = self.lease.start(
                argv, self.policy,
                cwd=self.workdir, env=env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, pass_fds=(inner.fileno(),), start_new_session=True)
        inner.close()
        self._sock = host
        return host

    def _failed_start(self) -> None:
        """SandboxFailure if bwrap itself could not set the sandbox up (it says so first)."""
        if self._proc is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=1.0)
        log = self.home / "exec-server.log"
        failure = setup_failure(log.read_text(errors="replace") if log.exists() else "")
        if failure is not None:
            self.close()
            raise failure

    def close(self) -> None:
        """Stop the sandbox: its init dies, and with it every process in its namespace."""
        sock, proc, self._sock, self._proc = self._sock, self._proc, None, None
        if sock is not None:
            sock.close()
        if proc is not None:
            stop(proc)
        with contextlib.suppress(OSError):
            (self.home / "exec-server.log").unlink()
