"""The sandbox launcher (envs/launch.c): built once per source, and each thing it sets up."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from envs.launcher import SOURCE, build
from envs.sandbox import LAUNCH_FAILED, SandboxFailure, SandboxPolicy, launch
from envs.workspace import Workspace

LIMITS = {"cpu": 7, "as": 512 << 20, "fsize": 3 << 20, "nofile": 99, "core": 0, "nproc": 4000}


def test_it_sets_every_rlimit_it_is_given():
    shown = subprocess.run(launch(["cat", "/proc/self/limits"], [], LIMITS),
                           capture_output=True, text=True, check=True).stdout
    rows = {line[:26].strip(): line[26:].split()[:2] for line in shown.splitlines()[1:]}
    names = {"cpu": "Max cpu time", "as": "Max address space", "fsize": "Max file size",
             "nofile": "Max open files", "core": "Max core file size", "nproc": "Max processes"}
    assert {k: rows[names[k]] for k in LIMITS} == {k: [str(v)] * 2 for k, v in LIMITS.items()}


def test_what_it_cannot_set_up_it_says_and_runs_nothing(tmp_path):
    for argv in (launch(["touch", str(tmp_path / "ran")], [tmp_path / "no-group"], {}),
                 launch(["touch", str(tmp_path / "ran")], [], {"bogus": 1}),
                 launch(["touch", str(tmp_path / "ran")], [], {},
                        (tmp_path / "repo", tmp_path / "mounts", tmp_path / "stage")),
                 launch([str(tmp_path / "no-such-program")], [], {})):
        done = subprocess.run(argv, capture_output=True, text=True)
        assert done.returncode == 1 and done.stderr.startswith(LAUNCH_FAILED), done.stderr
        assert not (tmp_path / "ran").exists()


def test_a_session_whose_cgroup_is_gone_fails_as_the_harness_not_the_agent(tmp_path):
    w = Workspace(lambda dest: None, root=tmp_path, policy=SandboxPolicy(persistent=False))
    try:
        w.lease.groups = [tmp_path / "gone"]
        with pytest.raises(SandboxFailure, match="could not join the session's cgroup"):
            w.run(["true"], 5, 1000)
    finally:
        w.lease.groups = []
        w.close()


def test_it_is_built_once_per_source_and_a_missing_compiler_says_so(tmp_path, monkeypatch):
    first = build(SOURCE, tmp_path)
    built_at = first.stat().st_mtime_ns
    assert build(SOURCE, tmp_path) == first and first.stat().st_mtime_ns == built_at
    changed = tmp_path / "launch.c"
    shutil.copy(SOURCE, changed)
    with changed.open("a") as f:
        f.write("/* changed */\n")
    assert build(changed, tmp_path) != first
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with changed.open("a") as f:
        f.write("/* changed again */\n")
    with pytest.raises(OSError, match="needs a C compiler"):
        build(changed, tmp_path)
    assert len([d for d in tmp_path.iterdir() if d.is_dir()]) == 2  # nothing of the third
