"""The mount namespace every sandbox starts from: the host's, without any session's tmpfs.

Each session's tmpfs is a mount in the host's table (envs/lease.py), so at 1,000 sessions that
table holds some 2,000 mounts. A sandbox start used to copy it whole (`unshare`) and detach the
sessions' mounts again: 6% of the host's CPU at 1,024 sessions (perf), most of it O(open
sessions). Now one holder process per host process keeps a private copy made once with every
session mount detached (`rollfleet-launch --hold`); a start clones its own session's mount
alone, enters a copy of the holder's namespace (a few dozen mounts) and puts the clone at its
stage (envs/launch.c). Mounts made on the host later never reach the template (it is private):
a session's own tmpfs goes to its sandbox as a clone, and every other folder a sandbox binds
is on a filesystem mounted before it. The holder ends when this process closes its end of the
holder's standard input (on any exit), or with `close()`.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from envs.launcher import launcher_path


class MountTemplate:
    """The holder, started on first use and again if it died; `session_mounts` lists the
    session mounts on the host at that moment."""

    def __init__(self, session_mounts: Callable[[], list[Path]]) -> None:
        self.session_mounts = session_mounts
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None

    def path(self) -> Path:
        """The template's namespace file."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._proc = _start(self.session_mounts())
            return Path(f"/proc/{self._proc.pid}/ns/mnt")

    def close(self) -> None:
        with self._lock:
            if self._proc is not None:
                self._proc.stdin.close()
                self._proc.wait()
                self._proc = None


def _start(detach: list[Path]) -> subprocess.Popen:
    tops = _outermost(detach)
    proc = subprocess.Popen([str(launcher_path()), "--hold", *map(str, tops)], env={},
                            cwd="/", stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        ready = proc.stdout.readline()
    except BaseException:
        proc.kill()
        raise
    if ready != b"ready\n":
        proc.kill()
        err = proc.stderr.read().decode(errors="replace").strip()
        proc.wait()
        raise OSError(f"the mount template did not start: {err or 'no reason given'}")
    proc.stdout.close()  # it says nothing after "ready"
    proc.stderr.close()
    return proc


def _outermost(points: list[Path]) -> list[Path]:
    """The points that are not under another one (detaching those takes the rest along)."""
    kept: list[Path] = []
    for point in sorted(set(points), key=lambda p: len(p.parts)):
        if not any(point.is_relative_to(top) for top in kept):
            kept.append(point)
    return kept
