"""Materializing a task from the installed source, and refusing when that source moved on."""

from __future__ import annotations

import pytest

from envs.stdlib.materialize import materialize, reference_edit, reference_fix
from envs.stdlib.mutations import Mutation
from envs.stdlib.rows import TaskRowError
from tests.envs.stdlib.helpers import SOURCE, fake_row, fake_stdlib


def test_materialize_writes_the_mutant_and_the_fix_restores_the_source(tmp_path):
    root = fake_stdlib(tmp_path / "lib")
    materialize(fake_row(), tmp_path / "repo", root)
    mutant = (tmp_path / "repo" / "fakemod.py").read_text()
    assert mutant == SOURCE.replace("x > hi", "x >= hi")
    assert reference_fix(fake_row(), root) == ("fakemod.py", SOURCE)
    path, old, new = reference_edit(fake_row(), root)
    assert path == "fakemod.py" and mutant.count(old) == 1
    assert mutant.replace(old, new) == SOURCE


def test_reference_edit_widens_until_unique_and_handles_dropped_lines(tmp_path):
    text = "def f(x):\n    x += 1\n    x += 1\n    return x\n"
    root = fake_stdlib(tmp_path / "lib", text)
    from envs.stdlib.source import sha256_text

    row = fake_row(source_sha256=sha256_text(text),
                   mutation=Mutation("drop_statement", (3, 0), (4, 0), "    x += 1\n", ""))
    _, old, new = reference_edit(row, root)
    mutant = row.mutation.apply(text)
    assert mutant.count(old) == 1 and mutant.replace(old, new) == text


def test_a_changed_installed_source_is_refused_with_the_task_id(tmp_path):
    root = fake_stdlib(tmp_path / "lib", SOURCE + "# patched\n")
    with pytest.raises(TaskRowError, match=r"^task fakemod.0001: .* is not the source the task "
                                           r"was built from .* rebuild"):
        materialize(fake_row(), tmp_path / "repo", root)
    assert not (tmp_path / "repo" / "fakemod.py").exists()


def test_a_missing_module_is_refused_with_the_task_id(tmp_path):
    with pytest.raises(TaskRowError, match="^task fakemod.0001: module fakemod not found"):
        materialize(fake_row(), tmp_path / "repo", tmp_path / "empty")


def test_a_mutation_that_no_longer_applies_is_refused_with_the_task_id(tmp_path):
    root = fake_stdlib(tmp_path / "lib")
    row = fake_row(mutation=Mutation("flip_comparison", (2, 9), (2, 10), "<", "<="))
    with pytest.raises(TaskRowError, match="^task fakemod.0001: mutation no longer applies"):
        materialize(row, tmp_path / "repo", root)
