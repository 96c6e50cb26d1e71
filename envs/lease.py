"""What one session holds on the host, given back on every exit path.

- A folder named for its owner (`rf.<pid>.<start time>.<prefix>...`), so a later start-up can
  tell a dead process's leftovers from a live one's (`sweep`).
- A size-limited tmpfs for the agent's files: writing past it fails with ENOSPC inside the
  sandbox, the host's disk is never touched. Its pages count against the session's memory.
- A uid of its own from the configured range, leased by a lock file (the kernel drops the lock
  when its holder dies), so per-uid counts such as RLIMIT_NPROC are this session's alone.
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
import re
import shutil
import tempfile
from pathlib import Path

from envs import cgroups
from envs.sandbox import SandboxPolicy

OWNER = re.compile(r"^rf\.(\d+)\.(\d+)\.")
GROUPS_FILE = "cgroups"  # in the session folder: the session's cgroup folders, one a line
UID_LOCKS = Path("/run/rollfleet/uids")
MOUNT_SOURCE = "rollfleet"  # the source of every session tmpfs in the mount table
MB = 1024 * 1024
_MS_NOSUID, _MS_NODEV, _MNT_DETACH = 2, 4, 2
_libc = ctypes.CDLL(None, use_errno=True)


class SessionLease:
    """One session's folder (`home`), its agent's files (`repo`), `uid` and cgroup `groups`."""

    def __init__(self, root: Path, prefix: str, policy: SandboxPolicy) -> None:
        pid = os.getpid()
        self.home = Path(tempfile.mkdtemp(prefix=f"rf.{pid}.{start_time(pid)}.{prefix}",
                                          dir=root))
        self.repo = self.home / "repo"
        self.repo.mkdir()
        self.uid: int | None = None  # None: commands keep the host process's uid
        self.groups: list[Path] = []
        self._uid_lock: int | None = None
        try:
            if policy.isolate and os.getuid() == 0:
                self.uid, self._uid_lock = _lease_uid(policy.uid_first, policy.uid_count)
                _mount_tmpfs(self.repo, f"size={policy.disk_mb}m,nr_inodes={policy.disk_files},"
                                        f"mode=0755,uid={self.uid},gid={self.uid}")
                layout = cgroups.detect() if policy.cgroup == "auto" else None
                if layout is not None:
                    planned = cgroups.folders(layout, self.home.name)
                    (self.home / GROUPS_FILE).write_text("".join(f"{d}\n" for d in planned))
                    self.groups = cgroups.create(layout, self.home.name, policy.nprocs,
                                                 (policy.memory_mb + policy.disk_mb) * MB,
                                                 policy.cpu_cores)
        except BaseException:
            self.close()
            raise

    def enter(self) -> None:
        """Join the session's cgroup (in a child process, before it execs)."""
        cgroups.join(self.groups)

    def close(self) -> None:
        """Kill what is left in the cgroup, unmount, remove the folder, give the uid back."""
        try:
            _release(self.home, self.groups)
        finally:
            if self._uid_lock is not None:
                os.close(self._uid_lock)
                self._uid_lock = None


def sweep(root: Path) -> list[Path]:
    """Remove what sessions of dead processes left: their folders under `root`, their disk
    mounts wherever they are, and their cgroups under this process's own. Anything of a live
    owner, or not named as a session, is kept. Returns the folders removed."""
    homes = {e for e in root.iterdir() if e.is_dir()} if root.is_dir() else set()
    homes |= {point.parent for point in _mounts(source=MOUNT_SOURCE)}
    removed = []
    for home in sorted(homes):
        if _dead_owner(home.name):
            listed = home / GROUPS_FILE
            _release(home, [Path(p) for p in listed.read_text().split()]
                     if listed.exists() else [])
            removed.append(home)
    groups: dict[str, list[Path]] = {}
    layout = cgroups.detect()
    for base in layout.bases.values() if layout else []:
        for group in base.iterdir():
            if group.is_dir() and _dead_owner(group.name):
                groups.setdefault(group.name, []).append(group)
    for dirs in groups.values():  # those whose folder went without them
        cgroups.remove(dirs)
    return removed


def _dead_owner(name: str) -> bool:
    owner = OWNER.match(name)
    return owner is not None and start_time(int(owner[1])) != int(owner[2])


def start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot): with the pid, names one process for good."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[19])


def _release(home: Path, groups: list[Path]) -> None:
    try:
        cgroups.remove(groups)
    finally:
        for point in sorted(_mounts(under=home), key=lambda p: len(p.parts), reverse=True):
            _unmount(point)
        shutil.rmtree(home, ignore_errors=True)


def _lease_uid(first: int, count: int) -> tuple[int, int]:
    """A uid of the range no live session holds, and the descriptor that holds its lock."""
    UID_LOCKS.mkdir(parents=True, exist_ok=True)
    offset = random.randrange(count)
    for i in range(count):
        uid = first + (offset + i) % count
        fd = os.open(UID_LOCKS / str(uid), os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return uid, fd
        except BlockingIOError:
            os.close(fd)
    raise OSError(errno.EAGAIN, f"all {count} sandbox uids from {first} are in use")


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


def _mounts(under: Path | None = None, source: str | None = None) -> list[Path]:
    """Mount points at or below `under`, or of the filesystem source `source`."""
    points = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, right = line.split(" - ", 1)
            point = Path(cgroups.unescape(left.split()[4]))
            below = under is not None and (point == under or under in point.parents)
            if below or right.split()[1] == source:
                points.append(point)
    return points
