"""Names that say which process owns a thing: a dead owner's leftovers go, a live one's stay
(a pid reused by another process included)."""

import os
import subprocess
import sys

from rollfleet.owner import dead_owner, start_time, sweep_temp, tag, temp_folder

PREFIX = f"rollfleet-test-owner-{os.getpid()}-"  # this test's alone


def test_a_dead_owners_folders_are_swept_and_a_live_ones_kept():
    child = subprocess.Popen([sys.executable, "-c", (
        "from rollfleet.owner import temp_folder; import sys; "
        f"print(temp_folder({PREFIX!r}))")], stdout=subprocess.PIPE, text=True)
    dead = child.communicate()[0].strip()
    mine = temp_folder(PREFIX)
    reused = mine.with_name(f"{PREFIX}{os.getpid()}.{start_time(os.getpid()) + 1}.x")
    reused.mkdir()  # our pid with another start time: a process that died, its pid reused
    other = mine.with_name(f"{PREFIX}not-an-owner")
    other.mkdir()
    try:
        assert mine.name.startswith(f"{PREFIX}{tag()}")
        assert dead_owner(os.path.basename(dead), PREFIX) and not dead_owner(mine.name, PREFIX)
        assert sorted(str(p) for p in sweep_temp(PREFIX)) == sorted([dead, str(reused)])
        assert mine.is_dir() and other.is_dir() and not os.path.exists(dead)
    finally:
        for p in (mine, other):
            p.rmdir()


def test_a_name_without_the_prefix_or_a_tag_has_no_owner():
    assert not dead_owner("rf.1.2.x", "rollfleet-")
    assert not dead_owner("rollfleet-abc", "rollfleet-")
    assert start_time(os.getpid()) is not None


def test_a_forked_child_names_itself_not_its_parent():
    parent = tag()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, tag().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 100).decode()
    assert parent == f"{os.getpid()}.{start_time(os.getpid())}."
    assert child.startswith(f"{pid}.") and child != parent
