"""The shipped suite: its size and spread, statements that do not give the fix away, and,
run for real, mutants that fail exactly FAIL_TO_PASS and reference fixes that pass them all."""

from __future__ import annotations

import os
import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from envs.stdlib.build import TASKS_PER_MODULE, build_module
from envs.stdlib.materialize import materialize, original_source, reference_edit, reference_fix
from envs.stdlib.operators import OPERATORS
from envs.stdlib.rows import GENERATOR_VERSION, Row
from envs.stdlib.source import python_version
from envs.stdlib.suite import BUILTIN, load_rows
from envs.stdlib.testing import run_tests
from tests.procs import WORKER_ENV

TIMEOUT_S = 120


@pytest.fixture(scope="module")
def rows() -> list[Row]:
    return load_rows(BUILTIN, on_bad="fail")  # every row checked against this installation


def test_size_and_spread(rows):
    modules = Counter(r.module for r in rows)
    assert len(rows) >= 200 and len(modules) >= 25
    assert max(modules.values()) <= TASKS_PER_MODULE
    assert set(Counter(r.mutation.op for r in rows)) == set(OPERATORS)
    levels = Counter(r.difficulty for r in rows)
    assert min(levels[d] for d in ("easy", "medium", "hard")) >= len(rows) // 10, levels
    assert {(r.generator, r.python) for r in rows} == {(GENERATOR_VERSION, python_version())}
    assert BUILTIN.stat().st_size < 1_000_000
    assert all(set(r.fail_to_pass).isdisjoint(r.pass_to_pass) and r.pass_to_pass for r in rows)


def test_statements_do_not_give_the_fix_away(rows):
    for row in rows:
        text = row.statement
        assert row.mutation.op not in text and row.mutation.op.replace("_", " ") not in text
        assert not re.search(rf"{re.escape(row.path)}\W+line \d", text), row.task_id
        assert not re.search(rf"\bline {row.mutation.start[0]}\b", text), row.task_id
        mutated = original_source(row).splitlines()[row.mutation.start[0] - 1].strip()
        assert len(mutated) < 16 or mutated not in text, (row.task_id, mutated)
        assert row.test_module in text and row.fail_to_pass[0].split(".")[-1] in text


def _check(row: Row, home: Path) -> None:
    """Doing nothing fails exactly FAIL_TO_PASS (reward 0); the reference edit passes all."""
    repo, tmp = home / "repo", home / "tmp"
    tmp.mkdir(parents=True)
    materialize(row, repo)
    before = run_tests(repo, row.hidden_tests, TIMEOUT_S, tmp_dir=tmp)
    failing = {t for t in row.hidden_tests if before.details[t]["outcome"] != "pass"}
    odd = {t: before.details[t] for t in failing ^ set(row.fail_to_pass)}
    assert failing == set(row.fail_to_pass), (row.task_id, odd)  # with each odd test's error
    assert not before.summary.ok
    path, old, new = reference_edit(row)
    mutant = (repo / path).read_text()
    assert mutant.count(old) == 1
    (repo / path).write_text(mutant.replace(old, new))
    assert (path, (repo / path).read_text()) == reference_fix(row)
    after = run_tests(repo, row.hidden_tests, TIMEOUT_S, details=False, tmp_dir=tmp)
    assert after.summary.ok and after.summary.passed == len(row.hidden_tests), row.task_id


def test_a_rebuild_gives_the_shipped_rows(rows, tmp_path):
    """Determinism, on the cheapest module: the first accepted mutants are shipped verbatim."""
    built = build_module("colorsys", tmp_path, per_module=3).rows
    shipped = {r.task_id: r for r in rows if r.module == "colorsys"}
    assert len(built) == 3 and all(shipped[r.task_id] == r for r in built)


def test_every_task_runs_for_real(rows, tmp_path):
    def one(pair: tuple[int, Row]) -> None:
        _check(pair[1], tmp_path / str(pair[0]))

    # beside the end-to-end tests (pytest-xdist), one core: they are the suite's longest path
    with ThreadPoolExecutor(max_workers=1 if os.environ.get(WORKER_ENV) else 2) as pool:
        list(pool.map(one, enumerate(rows)))
