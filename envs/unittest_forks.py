"""`python -S -m unittest ...` in a sandbox, forked from a warm interpreter instead of exec'd.

A sandboxed test run spent most of its CPU importing unittest (34 of 43 ms here), and such runs
(the hidden tests, `run_tests`) were most of the sandboxes' CPU at 1,024 sessions. bwrap still
builds each run's sandbox as for any command (`SessionLease.command`), holding `cat` as its command
(root without capabilities: it runs nothing of the agent's); once `cat` echoes a byte the sandbox
is set up, and the fork server (envs/unittest_fork_server.py, one per process) forks the run into
the namespaces of its init, its cgroups, rlimits and uid. Stopping the sandbox kills the run with
it (its PID namespace's init goes). Runs the server cannot reproduce exactly (another interpreter,
other flags, another locale or hash seed, another PYTHONPATH) are exec'd as before; so are runs in
a folder that holds a module named like one the server holds. Nothing of the agent runs between its
commands (each sandbox goes with its command), so the folder the host looks at is the one the run
sees.
"""

from __future__ import annotations

import marshal
import os
import select
import socket
import subprocess
import sys
import threading
from pathlib import Path

from envs.lease import SessionLease
from envs.sandbox import (
    SandboxFailure,
    SandboxPolicy,
    SandboxProcess,
    limits,
    stop,
    wait_exit,
)

SERVER_SOURCE = Path(__file__).with_name("unittest_fork_server.py").read_text()
# The server's own environment: a run is forked only where its environment agrees on every
# variable that shapes an interpreter's start (PYTHONPATH is the run's own: it sets sys.path).
SERVER_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0",
              "PYTHONDONTWRITEBYTECODE": "1"}
READY_S = 30.0  # bwrap sets a sandbox up in milliseconds; past this it is stuck
EXIT_GRACE_S = 10.0  # the run's parent outside the sandbox exits once the run has


def _shapes_start(name: str) -> bool:
    return (name.startswith(("PYTHON", "LC_")) or name == "LANG") and name != "PYTHONPATH"


class UnittestForks:
    """The process's fork server, started on first use; it ends when this process closes its
    end of the socket (on any exit)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen | None = None
        self._warm: frozenset[str] = frozenset()  # what the server holds, by top-level name

    @staticmethod
    def reproduces(argv: list[str], env: dict[str, str], cwd: Path) -> bool:
        """Whether a fork of the server is the interpreter `argv` would start in `cwd`."""
        return (argv[:4] == [sys.executable, "-S", "-m", "unittest"]
                and all(env.get(k) == v for k, v in SERVER_ENV.items() if _shapes_start(k))
                and not any(_shapes_start(k) and k not in SERVER_ENV for k in env)
                and env.get("PYTHONPATH", str(cwd)) == str(cwd))

    def serves(self, argv: list[str], env: dict[str, str], cwd: Path) -> bool:
        """Whether a fork of the server runs `argv` in `cwd` as its exec would: the same
        interpreter, and no file of `cwd` (first on sys.path) named like a module it holds."""
        if not self.reproduces(argv, env, cwd):
            return False
        with self._lock:
            try:
                if self._sock is None:
                    self._start()
            except OSError:
                return False  # exec'd, as before
            warm = self._warm
        return not any(name.partition(".")[0] in warm for name in os.listdir(cwd))

    def run(self, lease: SessionLease, policy: SandboxPolicy, argv: list[str],
            env: dict[str, str], timeout_s: float, out: int) -> tuple[int | None, bool]:
        """(exit status, or None at the timeout; timed out) of `argv` run in a new sandbox of
        `lease`, its output on `out`. SandboxFailure when the sandbox or the fork failed."""
        holder = lease.start(["cat"], policy, holder=True, cwd=lease.repo, env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=out,
                             start_new_session=True)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        reply, parent = b"", None  # the run's parent: the server's child that forked it
        try:
            init = self._ready(holder)
            if init is None:
                return 1, False  # the sandbox never came up: Workspace.run reads bwrap's words
            workdir = str(lease.repo)
            request = {"init": init, "groups": [str(g) for g in lease.groups],
                       "rlimits": limits(policy), "uid": lease.uid, "cwd": workdir,
                       "env": {**env, "HOME": workdir, "TMPDIR": workdir}, "argv": argv}
            self._send(marshal.dumps(request), [out, theirs.fileno()])
            theirs.close()  # the run's parent holds it now
            mine.settimeout(READY_S)
            try:
                parent = int(mine.recv(64) or 0) or None
            except TimeoutError:
                raise SandboxFailure("the unittest fork server does not fork") from None
            mine.settimeout(timeout_s)
            try:
                reply = mine.recv(4096) if parent else b""
            except TimeoutError:
                return None, True
        finally:
            holder.stdin.close()
            holder.stdout.close()
            stop(holder)  # and with its init, whatever of the run is left
            theirs.close()
            mine.close()
            if parent is not None:  # it reports, if it has not yet, and exits
                wait_exit(parent, EXIT_GRACE_S)
        if not reply:
            raise SandboxFailure("the unittest fork server died under a run")
        if reply.startswith(b"setup "):
            raise SandboxFailure(f"entering the sandbox: {reply[6:].decode(errors='replace')}")
        return int(reply), False

    def _ready(self, holder: SandboxProcess) -> int | None:
        """The host pid of the sandbox's init once bwrap has set the sandbox up; None if it
        could not (it said why on the run's output)."""
        holder.stdin.write(b".")
        holder.stdin.flush()
        fd = holder.stdout.fileno()
        ready = select.poll()  # not select(): an actor's descriptors run past 1,024
        ready.register(fd, select.POLLIN)
        if not ready.poll(READY_S * 1000):
            raise SandboxFailure(f"the sandbox was not up after {READY_S:.0f} s")
        if not os.read(fd, 1):
            holder.wait()
            return None
        init = holder.init_pid()
        if init is None:
            raise SandboxFailure("the sandbox's bwrap did not say which process is its init")
        return init

    def _send(self, message: bytes, fds: list[int]) -> None:
        """To the server, started (again) if it is not running."""
        with self._lock:
            for attempt in range(2):
                if self._sock is None:
                    try:
                        self._start()
                    except OSError as exc:
                        raise SandboxFailure(str(exc)) from None
                try:
                    socket.send_fds(self._sock, [message], fds)
                    return
                except OSError:
                    if attempt:
                        raise SandboxFailure("the unittest fork server does not answer") from None
                    self._close()

    def _start(self) -> None:
        host, inner = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with inner:
            self._proc = subprocess.Popen(
                [sys.executable, "-S", "-c", SERVER_SOURCE, str(inner.fileno())], cwd="/",
                env=SERVER_ENV, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                pass_fds=(inner.fileno(),), start_new_session=True)
        self._sock = host
        try:
            host.settimeout(READY_S)
            self._warm = frozenset(marshal.loads(host.recv(1 << 20)))
            host.settimeout(None)
        except (OSError, EOFError, ValueError) as exc:
            self._close()
            raise OSError(f"the unittest fork server did not start: {exc}") from None

    def _close(self) -> None:
        sock, proc, self._sock, self._proc = self._sock, self._proc, None, None
        if sock is not None:
            sock.close()
        if proc is not None:  # it exits once its socket closes; one that is stuck does not
            proc.kill()
            proc.wait()


FORKS = UnittestForks()  # one server per process
