"""Runs inside a session's sandbox for the session's whole life (envs/session_sandbox.py).

The host sends one command per message on the socket whose descriptor is argv[1], with the
descriptor its output goes to; this server starts it in a session and process group of its own,
waits for it up to its timeout, then kills whatever of it is left (its group and every process
it started elsewhere in the sandbox's PID namespace) and answers with its exit status, or
`timeout`. It is handed to the sandbox's interpreter as source text (the checkout is hidden
there) and imports only built-in C modules (`_socket`, `marshal`, `os`, `select`, `sys`, `time`):
the socket, json and signal modules' own imports (enum, collections) would more than double its
start.
"""

import _socket
import marshal
import os
import select
import sys
import time

MAX_REQUEST = 1 << 20
SIGKILL = 9
FD_SIZE = 4  # a descriptor in SCM_RIGHTS data: a C int


def _receive(sock: _socket.socket) -> tuple[bytes, list[int]]:
    """One message and the descriptors sent with it."""
    fds = []
    data, ancillary, _, _ = sock.recvmsg(MAX_REQUEST, _socket.CMSG_SPACE(4 * FD_SIZE))
    for level, kind, payload in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds += [int.from_bytes(payload[i:i + FD_SIZE], sys.byteorder, signed=True)
                    for i in range(0, len(payload) - FD_SIZE + 1, FD_SIZE)]
    return data, fds


def _others(me: int) -> list[int]:
    """The namespace's live processes but its init (pid 1) and this server; zombies are gone
    already, only their parent has yet to reap them."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (1, me):
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if stat[stat.rindex(")") + 2] not in "ZX":
            pids.append(int(name))
    return pids


def _clear(me: int) -> None:
    """Kill every process but init and this server, until none is left (a fork bomb may
    still be forking while it is killed)."""
    for _ in range(1000):
        pids = _others(me)
        if not pids:
            return
        for pid in pids:
            try:  # noqa: SIM105 - contextlib is an import this server does without
                os.kill(pid, SIGKILL)
            except OSError:
                pass
        time.sleep(0.001)


def _start(request: dict, out: int) -> int:
    """The command's pid: a session of its own, `out` as stdout and stderr."""
    pid = os.fork()
    if pid == 0:
        argv = request["argv"]
        try:
            os.setsid()
            os.dup2(os.open("/dev/null", os.O_RDONLY), 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.close(out)
            os.chdir(request["cwd"])
            os.execvpe(argv[0], argv, request["env"])
        except OSError as exc:
            os.write(2, f"{argv[0]}: {exc.strerror}\n".encode())
        os._exit(127)
    os.close(out)
    return pid


def _run(request: dict, out: int, me: int) -> bytes:
    pid = _start(request, out)
    exited = os.pidfd_open(pid)
    waiting = select.poll()
    waiting.register(exited, select.POLLIN)
    ended = waiting.poll(max(0.0, request["timeout_s"]) * 1000)
    os.close(exited)
    try:  # noqa: SIM105 - as above
        os.killpg(pid, SIGKILL)  # what it left in its group
    except OSError:
        pass
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    _clear(me)
    if not ended:
        return b"timeout"
    return b"%d" % (128 - status if status < 0 else status)  # as a shell reports a signal


def main() -> None:
    sock = _socket.socket(fileno=int(sys.argv[1]))
    os.set_inheritable(sock.fileno(), False)
    me = os.getpid()
    while True:
        message, fds = _receive(sock)
        if not message:  # the host closed its end: the session is over
            return
        sock.send(_run(marshal.loads(message), fds[0], me))


if __name__ == "__main__":  # as `python -c <this source> <fd>`
    main()
