"""Commands run isolated: bubblewrap namespaces, an unprivileged uid, and rlimits.

What is isolated: the network (a new, empty network namespace: even loopback servers of the host
are unreachable), the filesystem (read-only root; only the session's folder is writable; home
folders, /tmp and the project checkout are hidden behind empty tmpfs mounts), processes (a new PID
namespace, killed with its parent), and resources: CPU seconds, address space, process count,
file size and open files by rlimit, wall clock by the caller's timeout, which kills the whole
process group. Processes run as `nobody` on the host, so the process limit really applies (the
kernel exempts uid 0 from RLIMIT_NPROC).

What is not: total disk use is bounded per file (RLIMIT_FSIZE) and by the wall clock, not by a
quota; CPU time is per process; the read-only view of the root filesystem still shows system
files that any local user could read.
"""

from __future__ import annotations

import os
import resource
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

NOBODY = 65534


class SandboxFailure(OSError):
    """bubblewrap itself could not set the sandbox up: the harness failed, not the agent."""


@dataclass(frozen=True)
class SandboxPolicy:
    isolate: bool = True  # false: plain subprocess in the folder (for debugging only)
    cpu_s: int = 60
    memory_mb: int = 2048
    nprocs: int = 64
    file_size_mb: int = 64
    open_files: int = 256
    uid: int = NOBODY
    hide: tuple[str, ...] = field(default_factory=lambda: _hidden_dirs())
    expose: tuple[str, ...] = field(default_factory=lambda: _interpreter_dirs())
    mask: tuple[str, ...] = ()  # files that read as empty inside (e.g. a task's unbroken source)


def _hidden_dirs() -> tuple[str, ...]:
    """Home folders, temp folders and this checkout (hidden tests and tasks live there)."""
    project = str(Path(__file__).resolve().parents[1])
    return ("/root", "/home", "/tmp", "/var/tmp", "/run", project)


def _interpreter_dirs() -> tuple[str, ...]:
    """Folders the sandboxed Python needs even when they sit under a hidden folder."""
    dirs = {sys.base_prefix, sys.prefix, str(Path(sys.executable).resolve().parents[1])}
    return tuple(sorted(dirs))


def bwrap_available() -> bool:
    return shutil.which("bwrap") is not None


def wrap(argv: list[str], workdir: Path, policy: SandboxPolicy) -> list[str]:
    """The bwrap command line that runs `argv` in `workdir` under `policy`."""
    if not policy.isolate:
        return argv
    if not bwrap_available():
        raise RuntimeError("bubblewrap (bwrap) is not installed; run scripts/setup.sh")
    # No user namespace: bwrap mounts as root (it can read the interpreter under /root), then
    # setpriv drops to a real unprivileged host uid, so RLIMIT_NPROC applies.
    args = ["bwrap", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session",
            "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    hidden = [h for h in policy.hide if os.path.isdir(h)]
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
    args += ["--bind", str(workdir), str(workdir), "--chdir", str(workdir),
             "--setenv", "HOME", str(workdir), "--setenv", "TMPDIR", str(workdir), "--"]
    if os.getuid() == 0:
        args += ["setpriv", f"--reuid={policy.uid}", f"--regid={policy.uid}", "--clear-groups",
                 "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--"]
    return args + argv


def _under(path: str, root: str) -> bool:
    return path.startswith(root.rstrip("/") + "/")


def _mount_point(path: str, root: str) -> list[str]:
    """Traversable (0755) folders from `root` down to `path` (bwrap would make them 0700)."""
    args: list[str] = []
    parts = Path(path).relative_to(root).parts
    for i in range(1, len(parts) + 1):
        args += ["--perms", "0755", "--dir", str(Path(root, *parts[:i]))]
    return args


def limit_child(policy: SandboxPolicy):
    """A preexec_fn setting the rlimits (in the child, before bwrap; inherited past setpriv)."""
    def apply() -> None:
        os.setsid()
        mb = 1024 * 1024
        for res, value in ((resource.RLIMIT_CPU, policy.cpu_s),
                           (resource.RLIMIT_AS, policy.memory_mb * mb),
                           (resource.RLIMIT_FSIZE, policy.file_size_mb * mb),
                           (resource.RLIMIT_NOFILE, policy.open_files),
                           (resource.RLIMIT_CORE, 0)):
            resource.setrlimit(res, (value, value))
        if policy.isolate:  # root is exempt; it binds once setpriv switches to the sandbox uid
            resource.setrlimit(resource.RLIMIT_NPROC, (policy.nprocs, policy.nprocs))
    return apply


def give_to_sandbox(path: Path, policy: SandboxPolicy) -> None:
    """Make a session file or folder (recursively) writable by the sandbox uid."""
    if not policy.isolate or os.getuid() != 0:
        return
    os.lchown(path, policy.uid, policy.uid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), policy.uid, policy.uid)
