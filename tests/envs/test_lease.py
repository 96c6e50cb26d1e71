"""What a session holds on the host is given back: at close, and at the next start-up when its
owner was killed; nothing of a live owner's is touched."""

import fcntl
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from envs import EnvConfig, SandboxEnvironment, lease
from envs.lease import MOUNTS, UID_LOCKS
from envs.workspace import Workspace
from rollfleet.owner import start_time
from tests.procs import running

PROJECT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="quotas, uids and cgroups need root")

# A host process that opens a session in each folder it is given, leaves a process in the
# first one's cgroup that does not die with it (as an escaped daemon would), and waits to die.
OWNER = """
import subprocess, sys, time
from pathlib import Path
from envs.workspace import Workspace
sessions = [Workspace(lambda d: (d / "x.py").write_text("x = 1"), root=Path(root))
            for root in sys.argv[1:]]
stray = subprocess.Popen(["sleep", "1000"], preexec_fn=sessions[0].lease.enter,
                         start_new_session=True)
print(stray.pid, *[ws.home for ws in sessions], flush=True)
print(*[g for ws in sessions for g in ws.lease.groups], flush=True)
time.sleep(1000)
"""


def _mounted(path: Path) -> bool:
    return any(line.split()[4] == str(path)
               for line in Path("/proc/self/mountinfo").read_text().splitlines())


def _repo(home: Path) -> Path:
    """Where a session's tmpfs is mounted: its scratch root's rf-mounts."""
    return home.parent / MOUNTS / home.name


def test_start_up_removes_what_dead_owners_left_and_only_that(tmp_path):
    """The owner's session folder under the scratch root, its session elsewhere (found by its
    mount) whose record of cgroups was deleted (found by name), its escaped process."""
    scratch, elsewhere = tmp_path / "scratch", tmp_path / "elsewhere"
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(scratch), str(elsewhere)],
                             cwd=PROJECT, stdout=subprocess.PIPE, text=True)
    stray, *homes = owner.stdout.readline().split()
    groups = [Path(g) for g in owner.stdout.readline().split()]
    stray, homes = int(stray), [Path(h) for h in homes]
    owner.kill()
    owner.wait()
    assert all(h.is_dir() and _mounted(_repo(h)) for h in homes)
    assert all(g.is_dir() for g in groups)
    (homes[1] / "cgroups").unlink()
    live = Workspace(lambda d: None, root=scratch)
    reused = scratch / f"rf.{os.getpid()}.{start_time(os.getpid()) + 1}.x"  # pid reused
    kept = [scratch / "rf.not-a-session", scratch / "somebody-elses", live.home]
    for folder in (reused, *kept[:2]):
        folder.mkdir()
    try:
        SandboxEnvironment(EnvConfig(scratch_dir=str(scratch)))  # start-up
        assert not any(h.exists() or _mounted(_repo(h)) or _repo(h).exists() for h in homes)
        assert not reused.exists() and not any(g.exists() for g in groups)
        if groups:  # the escaped process went with its cgroup
            assert not running(stray)
        assert all(k.is_dir() for k in kept) and _mounted(live.path)
        assert all(g.is_dir() for g in live.lease.groups)
        assert live.run(["true"], 5, 100).exit_code == 0
    finally:
        live.close()
        if running(stray):
            os.kill(stray, 9)


def test_close_gives_everything_back(tmp_path):
    ws = Workspace(lambda d: None, root=tmp_path)
    stray = subprocess.Popen(["sleep", "1000"], preexec_fn=ws.lease.enter,
                             start_new_session=True)
    uid, groups = ws.lease.uid, ws.lease.groups
    start = time.perf_counter()
    ws.close()
    assert time.perf_counter() - start < 2
    assert not ws.home.exists() and not _mounted(ws.path) and not ws.path.exists()
    assert not any(g.exists() for g in groups)
    if groups:
        assert stray.wait(timeout=5) == -9
    else:
        stray.kill()
    with open(UID_LOCKS, "rb+") as other:  # the uid is free again, to any other open file
        assert lease._ofd_lock(other.fileno(), uid, fcntl.F_WRLCK)


def test_the_mounts_folder_goes_with_the_last_session_out(tmp_path):
    """rf-mounts holds every open session's tmpfs; it is unmounted when the last one closes,
    never while another session still has its files there."""
    sessions = [Workspace(lambda d: (d / "x.py").write_text("x = 1"), root=tmp_path)
                for _ in range(3)]
    mounts = tmp_path / MOUNTS
    try:
        for i, ws in enumerate(sessions[:-1]):
            ws.close()
            assert _mounted(mounts) and not _mounted(_repo(ws.home))
            for open_ws in sessions[i + 1:]:
                assert (open_ws.path / "x.py").read_text() == "x = 1"
    finally:
        sessions[-1].close()
    assert not _mounted(mounts) and not mounts.exists()


def test_session_folders_go_to_a_memory_filesystem_with_room_else_the_temp_folder(monkeypatch):
    """Unset, env.scratch_dir is /dev/shm where it is a tmpfs with 1 GiB free (as here), and an
    episode's session folder lives there; without the room, the system temp folder; a folder
    set is kept as set."""
    env = SandboxEnvironment(EnvConfig(max_tasks=1))
    assert env.scratch == Path("/dev/shm") and lease._fs_type(Path("/dev/shm")) == "tmpfs"
    episode = env.episode(sorted(env.tasks)[0])
    try:
        assert episode.workspace.home.parent == Path("/dev/shm")
    finally:
        episode.close()
    assert not episode.workspace.home.exists()
    free = os.statvfs("/dev/shm").f_bavail * os.statvfs("/dev/shm").f_frsize
    monkeypatch.setattr(lease, "SHM_ROOM", free + 2**30)
    assert lease.scratch_root(None) == Path(tempfile.gettempdir())
    assert lease.scratch_root("/var/tmp/x") == Path("/var/tmp/x")


def test_a_uid_is_held_by_one_session_of_any_process_at_a_time(tmp_path):
    """Two sessions of one process never share a uid; another process can lease none of the
    held ones while their holder lives, and every one once it is gone."""
    locks = lease.UidLocks(tmp_path / "uids.lock")
    held = [locks.lease(70000, 4) for _ in range(4)]
    assert sorted(held) == [70000, 70001, 70002, 70003]
    with pytest.raises(OSError, match="all 4 sandbox uids from 70000 are in use"):
        locks.lease(70000, 4)
    other = ("import sys; from pathlib import Path; from envs import lease\n"
             "locks = lease.UidLocks(Path(sys.argv[1]))\n"
             "try: print(locks.lease(70000, 4))\nexcept OSError as e: print(e)")
    run = lambda: subprocess.run([sys.executable, "-c", other, str(locks.path)],  # noqa: E731
                                 cwd=PROJECT, capture_output=True, text=True).stdout.strip()
    assert run() == "[Errno 11] all 4 sandbox uids from 70000 are in use"
    locks.release(held[2])
    assert run() == str(held[2]) and locks.lease(70000, 4) == held[2]
