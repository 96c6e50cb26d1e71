"""A cgroup per session: process, memory and CPU limits that bind that session alone, and a kill
that leaves none of its processes behind.

Detected at runtime: cgroup v1 where writable `pids` and `memory` hierarchies are mounted (with
`cpu` and `freezer` where present), else cgroup v2 where the host process's own group can hand
`pids` and `memory` to child groups, else none (the sandbox then relies on a uid per session).
A session's groups are children of the host process's own groups, so limits set above it still
apply. Everything here works on a session's list of group folders, so a later start-up can
remove the groups of a dead process from that list alone.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

V1_CONTROLLERS = ("pids", "memory", "cpu", "freezer")
V1_REQUIRED = ("pids", "memory")


@dataclass(frozen=True)
class Layout:
    version: str  # "v1" or "v2"
    bases: dict[str, Path]  # controller -> the host process's own group (v2: one, keyed "")

    def describe(self) -> str:
        if self.version == "v2":
            return f"cgroup v2 under {self.bases['']}"
        return f"cgroup v1 ({', '.join(self.bases)})"


@functools.cache
def detect() -> Layout | None:
    """Where session groups can be made on this host, or None."""
    own = _own_groups()
    mounts = _cgroup_mounts()
    bases = {}
    for ctrl in V1_CONTROLLERS:
        for root, point, fstype, options in mounts:
            if fstype == "cgroup" and ctrl in options and ctrl in own:
                base = _inside(point, root, own[ctrl])
                if base is not None and os.access(base, os.W_OK):
                    bases[ctrl] = base
    if all(c in bases for c in V1_REQUIRED):
        return Layout("v1", bases)
    for root, point, fstype, _ in mounts:
        if fstype == "cgroup2" and "" in own:
            base = _inside(point, root, own[""])
            if base is not None and _delegate_v2(base):
                return Layout("v2", {"": base})
    return None


def _own_groups() -> dict[str, str]:
    """Controller -> this process's group path (v2's unified group keyed "")."""
    groups = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for ctrl in controllers.split(",") if controllers else [""]:
            groups[ctrl] = path
    return groups


def _cgroup_mounts() -> list[tuple[str, str, str, set[str]]]:
    """(root, mount point, type, super options) of every cgroup mount."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, right = line.split(" - ", 1)
        fields, (fstype, _, options) = left.split(), right.split()[:3]
        if fstype in ("cgroup", "cgroup2"):
            out.append((fields[3], unescape(fields[4]), fstype, set(options.split(","))))
    return out


def unescape(field: str) -> str:
    """A mountinfo path (spaces and the like are written as octal escapes)."""
    return field.encode().decode("unicode_escape").encode("latin-1").decode()


def _inside(point: str, root: str, group: str) -> Path | None:
    """The folder of `group` under a mount of the hierarchy's `root` at `point`."""
    root = root.rstrip("/")
    if group != root and not group.startswith(root + "/"):
        return None
    base = Path(point, group[len(root):].lstrip("/"))
    return base if base.is_dir() else None


def _delegate_v2(base: Path) -> bool:
    """True if children of `base` get pids and memory (enabling them where allowed: a group
    holding processes other than the root cannot, by cgroup v2's no-internal-process rule)."""
    try:
        offered = set((base / "cgroup.controllers").read_text().split())
        if not {"pids", "memory"} <= offered or not os.access(base, os.W_OK):
            return False
        enabled = set((base / "cgroup.subtree_control").read_text().split())
        missing = ({"pids", "memory", "cpu"} & offered) - enabled
        if missing:
            _write(base / "cgroup.subtree_control", " ".join(f"+{c}" for c in sorted(missing)))
        return True
    except OSError:
        return False


def folders(layout: Layout, name: str) -> list[Path]:
    """The folders of the session group `name`, one per hierarchy."""
    return [base / name for base in layout.bases.values()]


def create(layout: Layout, name: str, nprocs: int, memory_bytes: int,
           cpu_cores: float) -> list[Path]:
    """Make the session's groups with their limits; returns their folders."""
    dirs = folders(layout, name)
    try:
        for d in dirs:
            d.mkdir()
        _limit(layout.version, dict(zip(layout.bases, dirs, strict=True)), nprocs,
               memory_bytes, cpu_cores)
    except BaseException:
        remove(dirs)
        raise
    return dirs


def _limit(version: str, dirs: dict[str, Path], nprocs: int, memory_bytes: int,
           cpu_cores: float) -> None:
    if version == "v2":
        d = dirs[""]
        _write(d / "pids.max", str(nprocs))
        _write(d / "memory.max", str(memory_bytes))
        if (d / "memory.swap.max").exists():
            _write(d / "memory.swap.max", "0")
        if cpu_cores > 0 and (d / "cpu.max").exists():
            _write(d / "cpu.max", f"{int(cpu_cores * 100_000)} 100000")
        return
    _write(dirs["pids"] / "pids.max", str(nprocs))
    _write(dirs["memory"] / "memory.limit_in_bytes", str(memory_bytes))
    if (dirs["memory"] / "memory.memsw.limit_in_bytes").exists():  # no swap past the limit
        _write(dirs["memory"] / "memory.memsw.limit_in_bytes", str(memory_bytes))
    if cpu_cores > 0 and "cpu" in dirs:
        period = int((dirs["cpu"] / "cpu.cfs_period_us").read_text())
        _write(dirs["cpu"] / "cpu.cfs_quota_us", str(int(cpu_cores * period)))


def join(dirs: list[Path]) -> None:
    """Move the calling process into the groups (run in a child, before it execs)."""
    pid = str(os.getpid())
    for d in dirs:
        _write(d / "cgroup.procs", pid)


def members(dirs: list[Path]) -> set[int]:
    found: set[int] = set()
    for d in dirs:
        with contextlib.suppress(OSError):
            found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
    return found


def kill(dirs: list[Path], timeout_s: float = 10.0) -> None:
    """SIGKILL every process in the groups and wait until none is left. v2 has cgroup.kill; v1
    freezes the group first (where a freezer is mounted) so a fork bomb cannot outrun the kill."""
    if not members(dirs):
        return
    killer = next((d / "cgroup.kill" for d in dirs if (d / "cgroup.kill").exists()), None)
    freezer = next((d / "freezer.state" for d in dirs if (d / "freezer.state").exists()), None)
    deadline = time.monotonic() + timeout_s
    if killer is not None:
        _write(killer, "1")
    elif freezer is not None:
        _write(freezer, "FROZEN")
        while freezer.read_text().strip() != "FROZEN" and time.monotonic() < deadline:
            time.sleep(0.001)
        _signal_all(dirs)
        _write(freezer, "THAWED")
    while (left := members(dirs)) and time.monotonic() < deadline:
        if killer is None:
            _signal_all(dirs, left)
        time.sleep(0.002)
    if members(dirs):
        raise OSError(f"processes {sorted(members(dirs))} outlived the kill of {dirs[0]}")


def _signal_all(dirs: list[Path], pids: set[int] | None = None) -> None:
    for pid in pids if pids is not None else members(dirs):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def remove(dirs: list[Path]) -> None:
    """Kill what runs in the groups, then remove them (those already gone are skipped)."""
    dirs = [d for d in dirs if d.is_dir()]
    kill(dirs)
    for d in dirs:
        deadline = time.monotonic() + 1.0  # a group's last task can keep it busy a moment
        while True:
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)
