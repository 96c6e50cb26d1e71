"""Runs inside a session's sandbox for the session's whole life (envs/session_sandbox.py).

The host sends one command per message on the socket whose descriptor is argv[1], with the
descriptor its output goes to; this server starts it in a process group of its own, waits for
it up to its timeout, then kills whatever of it is left (its group and every process it started
elsewhere in the sandbox's PID namespace) and answers with its exit status. Standard library
only: it is handed to the sandbox's interpreter as source text (the checkout is hidden there).
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

MAX_REQUEST = 1 << 20


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
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.001)


def _status(code: int) -> int:
    """As a shell reports it: 128 + the signal for a command a signal ended."""
    return 128 - code if code < 0 else code


def _run(request: dict, out: int, me: int) -> dict:
    try:
        child = subprocess.Popen(request["argv"], cwd=request["cwd"], env=request["env"],
                                 stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                 start_new_session=True)
    except OSError as exc:
        os.write(out, f"{request['argv'][0]}: {exc.strerror}\n".encode())
        return {"exit_code": 127, "timed_out": False}
    finally:
        os.close(out)
    try:
        code, timed_out = child.wait(request["timeout_s"]), False
    except subprocess.TimeoutExpired:
        code, timed_out = None, True
    with contextlib.suppress(OSError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    _clear(me)
    return {"exit_code": None if timed_out else _status(code), "timed_out": timed_out}


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    me = os.getpid()
    while True:
        message, fds, _, _ = socket.recv_fds(sock, MAX_REQUEST, 1)
        if not message:  # the host closed its end: the session is over
            return
        sock.send(json.dumps(_run(json.loads(message), fds[0], me)).encode())


if __name__ == "__main__":  # as `python -c <this source> <fd>`
    main()
