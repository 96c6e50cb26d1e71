"""A warm interpreter that has `unittest` imported and forks each `python -S -m unittest ...`
run into a sandbox bwrap has already built (envs/unittest_forks.py).

Importing unittest was most of a sandboxed test run's CPU (34 of a 43 ms run here). This server
(root, the host's namespaces, started once per process as `python -S -c <this source> <fd>`)
imports it once, with what a run imports later (argparse's `locale` and `shutil`), and freezes it
for the collector: a forked run then cost 13 ms of CPU against 23 with unittest alone imported
(roman_subtractive's hidden tests, unsandboxed, measured here). For each request it forks a child
that joins the command's cgroups, enters the namespaces of the sandbox's init (`setns`: cgroup,
ipc, uts, net, pid, mount) and sets its rlimits, then forks the run: a new process in the sandbox's
PID namespace, which drops to the session's uid (no groups, no capabilities, no new privileges),
takes the command's output descriptor, folder and environment, and runs unittest as `-m` would
(`runpy`). The child reports its pid, then the run's exit status, on the request's own socket. The
server's first message names the top-level modules it holds that a file could shadow: the host
forks no run whose folder holds one (a task may ship its own `pprint.py`; the warm module would be
the wrong one).
Only built-in and stdlib modules; the checkout is not importable from here.
"""

import ctypes
import gc
import locale  # noqa: F401 - and these two: what a run's argparse imports on its first parser
import marshal
import os
import resource
import runpy
import shutil  # noqa: F401 - (the terminal's width; it brings zlib, bz2 and lzma)
import signal
import socket
import sys
import unittest  # noqa: F401 - the warm part: what every run would import
import unittest.main  # noqa: F401

NAMESPACES = ("cgroup", "ipc", "uts", "net", "pid", "mnt")  # mnt last: /proc changes with it
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38
_libc = ctypes.CDLL(None, use_errno=True)
# top-level modules this interpreter holds that a file could have shadowed (built-ins cannot)
WARM = frozenset(name.partition(".")[0] for name in sys.modules) - set(sys.builtin_module_names)
STDLIB_PATH = list(sys.path[1:])  # sys.path[0] is the -c script's folder


def _check(result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _enter(request):
    """Join the command's cgroups, then its sandbox's namespaces, under its rlimits."""
    for group in request["groups"]:
        with open(f"{group}/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))
    fds = [os.open(f"/proc/{request['init']}/ns/{ns}", os.O_RDONLY | os.O_CLOEXEC)
           for ns in NAMESPACES]
    for ns, fd in zip(NAMESPACES, fds, strict=True):
        _check(_libc.setns(fd, 0), f"entering the sandbox's {ns} namespace")
        os.close(fd)
    for name, value in request["rlimits"].items():
        limit = getattr(resource, f"RLIMIT_{name.upper()}")
        resource.setrlimit(limit, (value, value))


def _become(request, out):
    """The run's process: its session, output, folder, user and environment."""
    os.setsid()
    os.dup2(os.open("/dev/null", os.O_RDONLY), 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.closerange(3, 1 << 16)
    os.chdir(request["cwd"])
    uid = request["uid"]
    if uid is not None:
        os.setgroups([])
        for cap in range(64):
            if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                break  # past the kernel's last capability
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    env = request["env"]
    os.environ.clear()
    os.environ.update(env)
    path = [os.getcwd(), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    sys.path[:] = [*path, *STDLIB_PATH]
    sys.argv[:] = ["-m", *request["argv"][4:]]  # as `python -S -m unittest ARGS` starts


def _serve(request, out, reply):
    """In the forked child: set up, fork the run, report its exit status. Returns only in the
    run's process (True). Its first message is its pid: the host waits for it to be gone."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.write(reply, b"%d" % os.getpid())
    try:
        _enter(request)
    except OSError as exc:
        os.write(reply, f"setup {exc}".encode())
        os._exit(1)
    run = os.fork()
    if run == 0:
        os.close(reply)
        try:
            _become(request, out)
        except OSError as exc:
            os.write(2, f"rollfleet-sandbox: the warm run could not start: {exc}\n".encode())
            os._exit(1)
        return True
    os.close(out)
    status = os.waitstatus_to_exitcode(os.waitpid(run, 0)[1])
    try:  # noqa: SIM105 - the host may have stopped waiting (a timeout)
        os.write(reply, b"%d" % (128 - status if status < 0 else status))
    except OSError:
        pass
    os._exit(0)


def main():
    """Serve until the host closes its end; True only in a run's process."""
    sock = socket.socket(fileno=int(sys.argv[1]))
    os.set_inheritable(sock.fileno(), False)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the runs' parents are reaped unasked
    sock.send(marshal.dumps(sorted(WARM)))
    # What the server holds leaves the collector's view: a run's collections then never walk
    # (and copy, page by page) the server's objects.
    gc.freeze()
    while True:
        message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 2)
        if not message:
            return False
        out, reply = fds
        sys.stdout.flush()
        if os.fork() == 0:
            sock.close()
            return _serve(marshal.loads(message), out, reply)
        os.close(out)
        os.close(reply)


def _run_unittest():
    """`python -m unittest` from here on, in a `__main__` holding none of this server."""
    run = runpy._run_module_as_main
    main_globals = globals()
    for name in [n for n in main_globals if n not in ("__name__", "__builtins__")]:
        del main_globals[name]
    run("unittest")


if __name__ == "__main__" and main():
    _run_unittest()
