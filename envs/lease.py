"""What one session holds on the host, given back on every exit path.

- A folder named for its owner (`rf.<pid>.<start time>.<prefix>...`), so a later start-up can
  tell a dead process's leftovers from a live one's (`sweep`).
- A size-limited tmpfs for the agent's files: writing past it fails with ENOSPC inside the
  sandbox, the host's disk is never touched. Its pages count against the session's memory.
  It is mounted in the scratch root's `rf-mounts` (one tmpfs holding every session's mount
  point), so that a sandbox can start without the other sessions' mounts: bwrap walks the whole
  mount table for each folder it binds, and with a tmpfs per live session that walk cost a
  sandbox start 40-70 ms of CPU at 1,000 sessions (measured here). Each sandbox starts in a copy
  of a template mount namespace holding no session's tmpfs (envs/mount_template.py), with a
  clone of its own session's tmpfs at STAGE (the launcher, envs/launch.c, does it).
- A uid of its own from the configured range, so per-uid counts such as RLIMIT_NPROC are this
  session's alone: leased by a lock on byte `uid` of one file (`UidLocks`; the kernel drops the
  locks of a process that dies).
- A cgroup (envs.cgroups) with the session's process, memory and CPU limits, where one is
  writable; its folders are recorded in the session folder for `sweep`.
Only as root with isolation on; otherwise the folder alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import random
import shutil
import struct
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from envs import cgroups
from envs.mount_template import MountTemplate
from envs.sandbox import SandboxPolicy, SandboxProcess, as_user, launch, limits, wrap
from rollfleet.owner import dead_owner, tag

OWNER = "rf."  # every session folder and cgroup: rf.<pid>.<start time>. (rollfleet.owner)
GROUPS_FILE = "cgroups"  # in the session folder: the session's cgroup folders, one a line
UID_LOCKS = Path("/run/rollfleet/uids.lock")  # byte `uid` locked while a session holds it
MOUNTS = "rf-mounts"  # in a scratch root: the tmpfs holding the session tmpfs mounts
# where a sandbox's own tmpfs waits, in the sandbox's mount namespace, while the others go
STAGE = Path("/run/rollfleet/stage")
MOUNT_SOURCE = "rollfleet"  # the source of every session tmpfs in the mount table
MB = 1024 * 1024
SHM = Path("/dev/shm")
SHM_ROOM = 1024 * MB  # free bytes /dev/shm needs to take the session folders
_MS_NOSUID, _MS_NODEV, _MNT_DETACH = 2, 4, 2
_libc = ctypes.CDLL(None, use_errno=True)


def scratch_root(configured: str | None) -> Path:
    """Where session folders live: `configured`, else /dev/shm when it is a tmpfs with
    SHM_ROOM free, else the system temp folder. Each session writes and removes a git index,
    git objects and a few folders; on a disk filesystem that is journal work for the kernel, on
    tmpfs none (README: the ceiling with homes on disk and in memory). The room check leaves out
    a container's 64 MB /dev/shm."""
    if configured:
        return Path(configured)
    if _fs_type(SHM) == "tmpfs":
        st = os.statvfs(SHM)
        if st.f_bavail * st.f_frsize >= SHM_ROOM and os.access(SHM, os.W_OK | os.X_OK):
            return SHM
    return Path(tempfile.gettempdir())


class SessionLease:
    """One session's folder (`home`), its agent's files (`repo`), `uid` and cgroup `groups`."""

    def __init__(self, root: Path, prefix: str, policy: SandboxPolicy) -> None:
        self.home = Path(tempfile.mkdtemp(prefix=f"{OWNER}{tag()}{prefix}", dir=root))
        self.repo = self.home / "repo"  # a folder of the home, or the session's tmpfs
        self.uid: int | None = None  # None: commands keep the host process's uid
        self.groups: list[Path] = []
        self.mounts: Path | None = None  # rf-mounts, when the repo is the session's tmpfs
        self._uid_held = False
        try:
            if policy.isolate and os.getuid() == 0:
                self.uid = UIDS.lease(policy.uid_first, policy.uid_count)
                self._uid_held = True
                self.repo = _open_mount_point(root, self.home.name)
                self.mounts = self.repo.parent
                _mount_tmpfs(self.repo, f"size={policy.disk_mb}m,nr_inodes={policy.disk_files},"
                                        f"mode=0755,uid={self.uid},gid={self.uid}")
                layout = cgroups.detect() if policy.cgroup == "auto" else None
                if layout is not None:
                    planned = cgroups.folders(layout, self.home.name)
                    (self.home / GROUPS_FILE).write_text("".join(f"{d}\n" for d in planned))
                    self.groups = cgroups.create(layout, self.home.name, policy.nprocs,
                                                 (policy.memory_mb + policy.disk_mb) * MB,
                                                 policy.cpu_cores)
            else:
                self.repo.mkdir()
        except BaseException:
            self.close()
            raise

    def enter(self) -> None:
        """Join the session's cgroup (in a child process, before it execs)."""
        cgroups.join(self.groups)

    def start(self, argv: list[str], policy: SandboxPolicy, holder: bool = False,
              **popen: Any) -> SandboxProcess:
        """`argv` started as `command` runs it (`popen`: subprocess.Popen's arguments)."""
        return SandboxProcess(lambda info_fd: self.command(argv, policy, holder, info_fd),
                              policy.isolate, **popen)

    def command(self, argv: list[str], policy: SandboxPolicy, holder: bool = False,
                info_fd: int | None = None) -> list[str]:
        """`argv` as this session runs it: in its sandbox on its folder, as its uid, in its
        cgroups, under the policy's rlimits, apart from the other sessions' mounts. `holder`:
        `argv` only holds the sandbox open for a process that enters it later and drops to the
        session's uid itself (envs/unittest_forks.py): it stays root, without any capability,
        and runs no code of the agent's (no setpriv exec: 3% of the host's CPU at 1,024
        sessions, perf)."""
        apart = self.mounts is not None and policy.isolate
        inner = wrap(argv if holder else as_user(argv, self.uid), self.repo, policy,
                     STAGE if apart else None, capabilities=not holder, info_fd=info_fd)
        return launch(inner, self.groups, limits(policy),
                      (self.repo, TEMPLATE.path(), STAGE) if apart else None)

    def close(self) -> None:
        """Kill what is left in the cgroup, unmount, remove the folder, give the uid back."""
        try:
            _release(self.home, self.groups, self.repo if self.mounts else None)
        finally:
            if self._uid_held:
                UIDS.release(self.uid)
                self._uid_held = False


def sweep(root: Path) -> list[Path]:
    """Remove what sessions of dead processes left: their folders under `root`, their disk
    mounts wherever they are, and their cgroups under this process's own. Anything of a live
    owner, or not named as a session, is kept. Returns the folders removed."""
    homes = {e for e in root.iterdir() if e.is_dir()} if root.is_dir() else set()
    mounted = {point.parent.parent / point.name: point for point in _mounts(MOUNT_SOURCE)
               if point.parent.name == MOUNTS}
    removed = []
    for home in sorted(homes | set(mounted)):
        if dead_owner(home.name, OWNER):
            listed = home / GROUPS_FILE
            _release(home, [Path(p) for p in listed.read_text().split()]
                     if listed.exists() else [], mounted.get(home))
            removed.append(home)
    groups: dict[str, list[Path]] = {}
    layout = cgroups.detect()
    for base in layout.bases.values() if layout else []:
        for group in base.iterdir():
            if group.is_dir() and dead_owner(group.name, OWNER):
                groups.setdefault(group.name, []).append(group)
    for dirs in groups.values():  # those whose folder went without them
        cgroups.remove(dirs)
    return removed


def _release(home: Path, groups: list[Path], repo: Path | None) -> None:
    """`repo`: the session's tmpfs mount point in rf-mounts, if it has one."""
    try:
        cgroups.remove(groups)
    finally:
        if repo is not None:
            _close_mount_point(repo)
        shutil.rmtree(home, ignore_errors=True)


@contextlib.contextmanager
def _mounts_lock(root: Path) -> Iterator[None]:
    """Held while a session's mount point is made or removed, by any process: the first
    session under `root` mounts rf-mounts, the last one out unmounts it."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _open_mount_point(root: Path, name: str) -> Path:
    """An empty folder for a session's tmpfs in `root`'s rf-mounts, mounted first if need be
    (a small tmpfs holding nothing but such folders)."""
    mounts = root / MOUNTS
    with _mounts_lock(root):
        mounts.mkdir(exist_ok=True)
        if not os.path.ismount(mounts):
            _mount_tmpfs(mounts, "size=1m,nr_inodes=1048576,mode=0711")
        (mounts / name).mkdir()
    STAGE.mkdir(parents=True, exist_ok=True)
    return mounts / name


def _close_mount_point(point: Path) -> None:
    """Unmount a session's tmpfs and remove its folder; the last one out unmounts rf-mounts."""
    mounts = point.parent
    with _mounts_lock(mounts.parent):
        _unmount(point)
        with contextlib.suppress(FileNotFoundError):
            point.rmdir()
        if os.path.ismount(mounts) and _empty(mounts):
            _unmount(mounts)
            mounts.rmdir()


def _empty(mounts: Path) -> bool:
    """No session folder left in rf-mounts. It holds folders only, and a tmpfs folder's link
    count is 2 + its subfolders: one stat, where listing the folder read every live session's
    entry (3% of an actor's CPU at 1,024 sessions, perf)."""
    return os.stat(mounts).st_nlink <= 2 and not os.listdir(mounts)


class UidLocks:
    """The uids this process's sessions hold, each locked in UID_LOCKS by an open file
    description lock on its byte: another process's lock on it (or a lock through another
    open of the file) conflicts, and a process's locks go when it dies. One descriptor for
    every uid: a file per uid kept one open per session (265 of an actor's 417 at 1,024
    sessions), and every sandbox start copies and closes the descriptors of the process that
    starts it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._held: set[int] = set()  # locks of one description never conflict: kept here
        self._lock = threading.Lock()

    def lease(self, first: int, count: int) -> int:
        """A uid of the range no live session holds."""
        with self._lock:
            if self._fd is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(self.path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
            offset = random.randrange(count)
            for i in range(count):
                uid = first + (offset + i) % count
                if uid not in self._held and _ofd_lock(self._fd, uid, fcntl.F_WRLCK):
                    self._held.add(uid)
                    return uid
        raise OSError(errno.EAGAIN, f"all {count} sandbox uids from {first} are in use")

    def release(self, uid: int) -> None:
        with self._lock:
            if uid in self._held:
                _ofd_lock(self._fd, uid, fcntl.F_UNLCK)
                self._held.discard(uid)


def _ofd_lock(fd: int, byte: int, kind: int) -> bool:
    """Lock (or unlock) one byte without waiting; False if another holds it."""
    flock = struct.pack("hh4xqqi4x", kind, os.SEEK_SET, byte, 1, 0)  # struct flock, x86-64
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, flock)
        return True
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise


UIDS = UidLocks(UID_LOCKS)


def _mount_tmpfs(path: Path, options: str) -> None:
    if _libc.mount(MOUNT_SOURCE.encode(), os.fsencode(path), b"tmpfs", _MS_NOSUID | _MS_NODEV,
                   options.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mounting the session's tmpfs: {os.strerror(err)}", str(path))


def _unmount(path: Path) -> None:
    """Detach now; the kernel frees the tmpfs once nothing uses it."""
    if _libc.umount2(os.fsencode(path), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):  # not (or no longer) a mount point
            raise OSError(err, f"unmounting: {os.strerror(err)}", str(path))


def _mount_table() -> list[tuple[Path, str, str]]:
    """(mount point, filesystem type, source) of every mount this process sees, in order."""
    table = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, right = line.split(" - ", 1)
            fstype, source = right.split()[:2]
            table.append((Path(cgroups.unescape(left.split()[4])), fstype, source))
    return table


def _fs_type(path: Path) -> str | None:
    """The filesystem type mounted at `path` (the last mount there), if one is."""
    return next((fstype for point, fstype, _ in reversed(_mount_table()) if point == path), None)


def _mounts(source: str) -> list[Path]:
    """Mount points of the filesystem source `source`."""
    return [point for point, _, src in _mount_table() if src == source]


TEMPLATE = MountTemplate(lambda: _mounts(MOUNT_SOURCE))
