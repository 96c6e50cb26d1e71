"""A session's changes are git's diff: `git apply` on a fresh copy rebuilds the final tree."""

import os
from pathlib import Path

import pytest

from envs import EnvConfig, load
from envs.sandbox import SandboxPolicy
from envs.workspace import Changes, ChangesError, StartingTrees, Workspace


def _start(dest: Path) -> None:
    (dest / "pkg").mkdir()
    (dest / "pkg" / "mod.py").write_text("def f():\n    return 1\n")
    (dest / "gone.txt").write_text("delete me\n")
    (dest / "data.bin").write_bytes(bytes(range(256)))
    (dest / "run.sh").write_text("echo hi\n")


def _tree(root: Path) -> dict[str, tuple[bytes | str, int]]:
    """Every file's bytes (or a link's target) and permission bits."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            path = Path(dirpath, name)
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = (os.readlink(path), 0)
            else:
                out[rel] = (path.read_bytes(), path.stat().st_mode & 0o777)
    return out


def test_git_apply_of_the_diff_rebuilds_every_kind_of_change(tmp_path):
    ws = Workspace(_start, root=tmp_path, policy=SandboxPolicy(isolate=False))
    try:
        repo = ws.path
        (repo / "pkg" / "mod.py").write_text("def f():\n    return 2")  # no final newline
        (repo / "gone.txt").unlink()
        (repo / "data.bin").write_bytes(bytes(range(255, -1, -1)) + b"\x00\xff")
        (repo / "line\nbreak & spaces é.txt").write_bytes(b"odd name\n")
        (repo / "link").symlink_to("pkg/mod.py")
        (repo / "run.sh").chmod(0o755)
        (repo / "pkg" / "__pycache__").mkdir()
        (repo / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"cache")
        changes = ws.changes()
        fresh = tmp_path / "fresh"
        fresh.mkdir()
        _start(fresh)
        changes.apply(fresh)
        pycache = "pkg/__pycache__/mod.cpython-311.pyc"
        assert _tree(fresh) == {k: v for k, v in _tree(repo).items() if k != pycache}
    finally:
        ws.close()
    assert "__pycache__" not in changes.diff  # caches are not changes
    assert "\\ No newline at end of file" in changes.diff
    assert "GIT binary patch" in changes.diff


def test_sessions_borrow_their_task_s_starting_tree_and_diff_as_if_they_owned_it(tmp_path):
    """The starting tree is written into git once per task and process; a session's history
    borrows its objects (no git run, no object written at start) and its diff is the one a
    history of its own gives, byte for byte."""
    trees = StartingTrees(tmp_path / "scratch")
    start = trees.get("task", _start)
    assert trees.get("task", lambda dest: pytest.fail("populated twice")) is start
    policy = SandboxPolicy(isolate=False)
    borrowing = Workspace(_start, root=tmp_path / "scratch", policy=policy, start=start)
    owning = Workspace(_start, root=tmp_path / "own", policy=policy)
    try:
        objects = borrowing.home / "git" / "objects"
        assert sorted(p.name for p in objects.iterdir()) == ["info"]  # nothing written
        assert borrowing.history.start == owning.history.start == start.tree
        for ws in (borrowing, owning):
            (ws.path / "pkg" / "mod.py").write_text("def f():\n    return 2\n")
            (ws.path / "gone.txt").unlink()
            (ws.path / "new.txt").write_text("new\n")
        diff = borrowing.changes().diff
        assert diff == owning.changes().diff and "+    return 2" in diff and "gone.txt" in diff
        written = [p for p in objects.rglob("*") if p.is_file() and p.parent.name != "info"]
        assert 0 < len(written) < 5  # the changed file, the new one and their trees only
        fresh = tmp_path / "fresh"
        fresh.mkdir()
        _start(fresh)
        Changes(diff).apply(fresh)
        assert _tree(fresh) == _tree(borrowing.path)
    finally:
        borrowing.close()
        owning.close()


def test_text_that_is_not_utf8_makes_every_patch_binary_and_exact(tmp_path):
    ws = Workspace(_start, root=tmp_path, policy=SandboxPolicy(isolate=False))
    try:
        (ws.path / "pkg" / "mod.py").write_text("def f():\n    return 3\n")
        (ws.path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
        changes = ws.changes()
        fresh = tmp_path / "fresh"
        fresh.mkdir()
        _start(fresh)
        changes.apply(fresh)
        assert _tree(fresh) == _tree(ws.path)
    finally:
        ws.close()
    assert changes.diff.isascii() and changes.diff.count("GIT binary patch") == 2


def test_no_change_is_an_empty_diff(tmp_path):
    ws = Workspace(_start, root=tmp_path, policy=SandboxPolicy(isolate=False))
    try:
        assert ws.changes().diff == ""
    finally:
        ws.close()


def test_a_diff_that_does_not_apply_is_an_error(tmp_path):
    bad = Changes("diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-old\n+new\n")
    with pytest.raises(ChangesError, match="git apply failed"):
        bad.apply(tmp_path)


def test_changes_over_the_limit_fail_the_agent_with_the_reason():
    """Even with the fix in, 3 MB of noise makes a diff over changes_mb=1: no diff is kept,
    the score is a 0 (never an infrastructure error) and says why."""
    env = load(EnvConfig(sandbox={"changes_mb": 1}))
    with env.episode("stats_mean") as episode:
        for path, text in env.tasks["stats_mean"].repo.reference_fix().items():
            episode.workspace.write_text(path, text)
        episode.workspace.run(["bash", "-c", "head -c 3M /dev/urandom > noise"], 10, 100)
        changes = episode.workspace.changes()
        score = episode.score()
    assert changes.diff == "" and "over the 1 MB limit" in changes.refused
    assert score.reward == 0.0 and score.infra_error is None
    assert score.output.startswith("[changes not scored: the changes' diff is over the 1 MB")
