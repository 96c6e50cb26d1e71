"""Names that say which process owns a thing on the host (`<prefix><pid>.<start time>.`), so a
later start-up can tell a dead process's leftovers from a live one's: a pid alone is reused,
a pid and its start time name one process for good."""

from __future__ import annotations

import functools
import os
import re
import shutil
import tempfile
from pathlib import Path

_TAG = re.compile(r"(\d+)\.(\d+)\.")


def start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot); None if it is not running."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[19])


def tag() -> str:
    """This process's part of a name: `<pid>.<start time>.`."""
    return _tag(os.getpid())


@functools.cache  # by pid: a forked child names its own. Reading /proc for every session
def _tag(pid: int) -> str:  # folder was 3% of an actor's samples at 1,024 sessions (py-spy)
    return f"{pid}.{start_time(pid)}."


def dead_owner(name: str, prefix: str) -> bool:
    """Whether `name` is `prefix` + an owner's tag, and that owner no longer runs."""
    owner = _TAG.match(name, len(prefix)) if name.startswith(prefix) else None
    return owner is not None and start_time(int(owner[1])) != int(owner[2])


def temp_folder(prefix: str) -> Path:
    """A new folder in the system's temp folder, named for this process (short: unix socket
    paths must fit in 108 bytes, and a run folder can be deeper than that)."""
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{tag()}"))


def sweep_temp(prefix: str) -> list[Path]:
    """Remove the `temp_folder(prefix)` folders of processes that no longer run (a job killed
    with SIGKILL leaves its own); a live owner's are kept. Returns those removed."""
    root = Path(tempfile.gettempdir())
    gone = [p for p in root.glob(f"{prefix}*") if p.is_dir() and dead_owner(p.name, prefix)]
    for path in gone:
        shutil.rmtree(path, ignore_errors=True)
    return gone
