"""Commands run isolated: bubblewrap namespaces, an unprivileged uid of the session's own, rlimits.

What is isolated: the network (a new, empty network namespace: even loopback servers of the host
are unreachable), the filesystem (the host's system folders read-only, nothing else of its root;
only the session's folder is writable; home folders, /tmp, the session folders' root and the
project checkout are hidden behind empty tmpfs mounts), processes (a new PID namespace, killed
with its parent), and resources: CPU seconds, address space, file size and open files per
process by rlimit, wall clock by the caller's timeout, which kills the whole process group. Per
session (envs.lease): a uid of its own, so the process limit (RLIMIT_NPROC; the kernel exempts
uid 0) counts this session alone; a cgroup for its processes, memory and CPU where the host
offers one; a size-limited filesystem for its files.

What is not: the read-only system folders still show files that any local user could read; disk
bandwidth and the page cache are shared.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs.launcher import launcher_path
from rollfleet.paths import ROOT

CGROUP_CHOICES = ("auto", "none")
# What programs need of the root: binaries, libraries, configuration. Each bound folder costs
# bwrap a pass over the mount table, which holds a tmpfs per live session: binding all of the
# root's ~20 entries cost 40 ms of CPU per sandbox start at 1,000 sessions (measured here), and
# exposed /sys, /boot and /srv besides.
SYSTEM_DIRS = ("/bin", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/sbin", "/usr",
               "/var")


class SandboxFailure(OSError):
    """bubblewrap itself could not set the sandbox up: the harness failed, not the agent."""


@dataclass(frozen=True)
class SandboxPolicy:
    isolate: bool = True  # false: plain subprocess in the folder (for debugging only)
    cpu_s: int = 60  # CPU seconds per process
    memory_mb: int = 2048  # address space per process; the session's cgroup: this + disk_mb
    nprocs: int = 64  # processes and threads of one session (its cgroup and its uid)
    cpu_cores: float = 1.0  # the session's CPU ceiling, in cores (cgroup); <= 0: none
    file_size_mb: int = 64  # largest file a process may write (RLIMIT_FSIZE)
    open_files: int = 256  # open files per process (RLIMIT_NOFILE)
    disk_mb: int = 512  # the session's files: a tmpfs of this size
    disk_files: int = 65536  # ... holding at most this many files and folders
    changes_mb: int = 16  # the largest diff of a session kept and scored; larger fails the agent
    cgroup: str = field(default="auto", metadata={"choices": CGROUP_CHOICES})  # none: uid only
    uid_first: int = 1_900_000_000  # sessions run as uids [first, first + count), one each;
    uid_count: int = 4096           # reserve them: no real user may own one
    # the root's folders a sandbox sees, read-only (where they exist; a symlink stays one)
    system: tuple[str, ...] = SYSTEM_DIRS
    # folders hidden behind empty tmpfs mounts
    hide: tuple[str, ...] = field(default_factory=lambda: _hidden_dirs())
    # folders under a hidden one shown read-only (the interpreter)
    expose: tuple[str, ...] = field(default_factory=lambda: _interpreter_dirs())
    # files read as empty inside (e.g. a task's unbroken source)
    mask: tuple[str, ...] = field(default_factory=lambda: _editable_finders())
    # one sandbox for the session's life, each command a fork and exec in it
    # (envs/session_sandbox.py); false: a new sandbox per command
    persistent: bool = True
    # a new sandbox per command: `python -S -m unittest` runs forked from a warm interpreter
    # into it (envs/unittest_forks.py) instead of exec'd; false: exec'd like any command
    warm_unittest: bool = True

    def __post_init__(self) -> None:
        if self.cgroup not in CGROUP_CHOICES:
            raise ValueError(f"cgroup must be one of {CGROUP_CHOICES}, not {self.cgroup!r}")


def _hidden_dirs() -> tuple[str, ...]:
    """Home folders, temp folders and this checkout (hidden tests and tasks live there)."""
    return ("/root", "/home", "/tmp", "/var/tmp", "/run", str(ROOT))


def _interpreter_dirs() -> tuple[str, ...]:
    """Folders the sandboxed Python needs even when they sit under a hidden folder."""
    dirs = {sys.base_prefix, sys.prefix, str(Path(sys.executable).resolve().parents[1])}
    return tuple(sorted(dirs))


def _editable_finders() -> tuple[str, ...]:
    """The .pth files of editable installs in the sandbox's Python: each imports a finder that
    maps packages into a checkout the sandbox hides, which cost every sandboxed Python start
    ~20 ms of its ~40 (measured here: this project's own, the venv's `pip install -e`)."""
    site = sysconfig.get_paths()["purelib"]
    return tuple(sorted(str(p) for p in Path(site).glob("__editable__*.pth")))


def bwrap_available() -> bool:
    return shutil.which("bwrap") is not None


def wrap(argv: list[str], workdir: Path, policy: SandboxPolicy,
         source: Path | None = None, capabilities: bool = True,
         info_fd: int | None = None) -> list[str]:
    """The bwrap command line that runs `argv` in `workdir` under `policy`; `source`: the
    folder bound at `workdir` (default: `workdir` itself). bwrap started as root leaves `argv`
    root's capabilities (`as_user` needs them to switch users); `capabilities=False` drops
    them all, for a command that stays root. `info_fd`: where bwrap says which host process
    is the sandbox's init (SandboxProcess)."""
    if not policy.isolate:
        return argv
    if not bwrap_available():
        raise RuntimeError("bubblewrap (bwrap) is not installed; run scripts/setup.sh")
    # No user namespace: bwrap mounts as root (it can read the interpreter under /root), then
    # `as_user` drops to a real unprivileged host uid, so RLIMIT_NPROC applies.
    hidden = [h for h in policy.hide if os.path.isdir(h)]
    args = ["bwrap", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session",
            *_system_binds(policy.system, hidden), "--dev", "/dev", "--proc", "/proc"]
    if not capabilities:
        args += ["--cap-drop", "ALL"]
    if info_fd is not None:
        args += ["--info-fd", str(info_fd)]
    for keep in policy.expose:  # an interpreter outside the system folders and hidden ones
        if os.path.isdir(keep) and not any(keep == d or _under(keep, d)
                                           for d in (*policy.system, *hidden)):
            args += ["--ro-bind", keep, keep]
    for root in hidden:
        args += ["--tmpfs", root]
        for keep in policy.expose:
            if _under(keep, root) and os.path.isdir(keep):
                args += _mount_point(keep, root) + ["--ro-bind", keep, keep]
    for path in policy.mask:
        if os.path.isfile(path):
            args += ["--ro-bind", "/dev/null", path]
    for root in hidden:
        if _under(str(workdir), root):
            args += _mount_point(str(workdir), root)
    args += ["--bind", str(source or workdir), str(workdir), "--chdir", str(workdir),
             "--setenv", "HOME", str(workdir), "--setenv", "TMPDIR", str(workdir), "--"]
    return args + argv


def _system_binds(system: tuple[str, ...], hidden: list[str]) -> list[str]:
    """The system folders read-only, one by one. Never `/` whole: that takes in every other
    session's mounts under /tmp, and bwrap fails when one of them goes away while it remounts
    them read-only (1-3% of sandbox starts at 1,024 concurrent sessions)."""
    args: list[str] = []
    for path in system:
        if path in hidden or not os.path.lexists(path):
            continue
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        else:
            args += ["--ro-bind", path, path]
    return args


def as_user(argv: list[str], uid: int | None) -> list[str]:
    """`argv` run as `uid` (no groups, no capabilities, no way back); None: unchanged."""
    if uid is None:
        return argv
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs",
            "--inh-caps=-all", "--bounding-set=-all", "--", *argv]


def _under(path: str, root: str) -> bool:
    return path.startswith(root.rstrip("/") + "/")


def _mount_point(path: str, root: str) -> list[str]:
    """Traversable (0755) folders from `root` down to `path` (bwrap would make them 0700)."""
    args: list[str] = []
    parts = Path(path).relative_to(root).parts
    for i in range(1, len(parts) + 1):
        args += ["--perms", "0755", "--dir", str(Path(root, *parts[:i]))]
    return args


LAUNCH_FAILED = "rollfleet-sandbox: "  # how the launcher says it could not set a sandbox up


def setup_failure(output: str) -> SandboxFailure | None:
    """bwrap's or the launcher's own complaint opening a sandbox's output, as a failure of the
    harness (not of the agent's command); None if the output opens otherwise."""
    if output.startswith(("bwrap: ", LAUNCH_FAILED)):
        return SandboxFailure(output.strip().splitlines()[0])
    return None


def limits(policy: SandboxPolicy) -> dict[str, int]:
    """The policy's rlimits, as prlimit's options name them (both soft and hard)."""
    mb = 1024 * 1024
    out = {"cpu": policy.cpu_s, "as": policy.memory_mb * mb, "fsize": policy.file_size_mb * mb,
           "nofile": policy.open_files, "core": 0}
    if policy.isolate:  # root is exempt; it binds once setpriv switches to the session uid
        out["nproc"] = policy.nprocs
    return out


def launch(argv: list[str], groups: list[Path], rlimits: dict[str, int],
           apart: tuple[Path, Path, Path] | None = None) -> list[str]:
    """`argv` started by the launcher (envs/launch.c): inside the cgroups `groups`, under
    `rlimits`, and with `apart` = (repo, template, stage) in a copy of the mount namespace
    `template` (envs/mount_template.py) with a clone of the mount at `repo` put at `stage`.
    Not a preexec_fn: with one, Python forks the whole calling process (an actor of some 600
    MB: 28 ms of CPU per start, measured here), without one it vforks (0.7 ms). Start it with
    `start_new_session=True`; the launcher execs `argv`, so the pid is argv's."""
    args = [str(launcher_path())]
    for group in groups:
        args += ["--cgroup", str(group)]
    args += [arg for name, value in rlimits.items() for arg in ("--rlimit", f"{name}={value}")]
    if apart is not None:
        args += ["--apart", *map(str, apart)]
    return [*args, "--", *argv]


def give_to_sandbox(path: Path, uid: int | None) -> None:
    """Make a session file or folder (recursively) belong to the session's uid."""
    if uid is None:
        return
    os.lchown(path, uid, uid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), uid, uid)


class SandboxProcess(subprocess.Popen):
    """A sandbox's outer process (the launcher, exec'd into bwrap) that knows the sandbox's
    init. bwrap's child is the PID-namespace init, which exits only once every process in the
    namespace is gone. bwrap itself exits as soon as the command does, while its init may still
    be killing what the command left (a fork bomb's thousands), and once bwrap is gone its
    list of children no longer names the init: so bwrap says which process it is, on a pipe
    (`--info-fd`), as it starts it."""

    def __init__(self, command: Callable[[int | None], list[str]], isolated: bool,
                 **popen: Any) -> None:
        """`command(info_fd)`: the command line, bwrap's told to report on `info_fd` (None when
        not `isolated`: no bwrap, nothing reports and nothing is handed down)."""
        read, write = os.pipe() if isolated else (None, None)
        try:
            fds = (*popen.pop("pass_fds", ()), *([write] if write is not None else []))
            super().__init__(command(write), pass_fds=fds, **popen)
        except BaseException:
            if read is not None:
                os.close(read)
            raise
        finally:
            if write is not None:
                os.close(write)
        self._report = read
        self._init: int | None = None

    def init_pid(self) -> int | None:
        """The host pid of the sandbox's init once bwrap has said it; None before, or when
        bwrap failed before starting one."""
        if self._init is None and self._report is not None:
            os.set_blocking(self._report, False)
            with contextlib.suppress(BlockingIOError):
                said = re.search(rb'"child-pid": (\d+)', os.read(self._report, 4096))
                if said:
                    self._init = int(said.group(1))
                    self.close_report()
        return self._init

    def close_report(self) -> None:
        if self._report is not None:
            os.close(self._report)
            self._report = None


def stop(proc: SandboxProcess) -> None:
    """Kill a sandbox's process group and wait until nothing in it runs: until its init has
    exited (bwrap's child while bwrap runs, if it never said)."""
    inner = [pid] if (pid := proc.init_pid()) is not None else _children(proc.pid)
    proc.close_report()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    _wait_gone(inner)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _wait_gone(pids: list[int], timeout_s: float = 10.0) -> None:
    """Until none of `pids` runs (a zombie has finished: its namespace is already empty)."""
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        wait_exit(pid, max(0.0, deadline - time.monotonic()))


def wait_exit(pid: int, timeout_s: float | None) -> bool:
    """True once process `pid` has exited (a zombie has), False at the timeout. The thread
    sleeps on a pidfd until then: Popen.wait(timeout) polls instead, waking at 1, 2, 4 ... 50
    ms to take the GIL, and sees an exit up to 50 ms late."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # gone and reaped
        return True
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(None if timeout_s is None else math.ceil(timeout_s * 1000)))
    finally:
        os.close(fd)
