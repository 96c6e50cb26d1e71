"""Building the suite: mutate a module, run its own tests, keep the mutants that are real bugs.

A mutant becomes a task when, run against the module's suite, some tests that pass on the
original fail (FAIL_TO_PASS), at most half of them do (the rest are PASS_TO_PASS), a rerun by
test id fails exactly the same tests with the same statement, and nothing hangs. Modules and
mutation sites are visited in a fixed order with a fixed seed, so a rerun on the same Python
writes the same bytes.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import random
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from envs.stdlib.difficulty import difficulty
from envs.stdlib.mutations import Mutation
from envs.stdlib.operators import find_mutations
from envs.stdlib.rows import GENERATOR_VERSION, Row
from envs.stdlib.source import python_version, read_exact, sha256_text, stdlib_dir
from envs.stdlib.statements import clean, write_statement
from envs.stdlib.testing import RunResult, run_tests

SEED = 20250101
TASKS_PER_MODULE = 6
TRIES_PER_MODULE = 40
MAX_FAIL_FRACTION = 0.5
NOT_A_MUTANT = "does not compile, or compiles to the same code"


@dataclass(frozen=True)
class Baseline:
    """A module's unmutated source and the test ids that pass on it, reliably and by id."""

    module: str
    text: str
    test_module: str
    passing: tuple[str, ...]
    seconds: float
    public: frozenset[str]

    @property
    def timeout_s(self) -> float:
        """Only for real hangs: a slow mutant cut off on a busy machine would make the build
        depend on load (one statistics mutant runs 3x slower than the original)."""
        return 30.0 + 10.0 * self.seconds


def _run(text: str, module: str, ids: list[str], timeout_s: float, scratch: Path
         ) -> tuple[RunResult, str]:
    """Run `ids` against a repository holding `text` as the module, with a private TMPDIR
    (some suites use fixed paths there). Also returns the run's folder, for `clean`."""
    with tempfile.TemporaryDirectory(dir=scratch) as home:
        repo, tmp = Path(home) / "repo", Path(home) / "tmp"
        repo.mkdir()
        tmp.mkdir()
        (repo / f"{module}.py").write_bytes(text.encode("utf-8"))
        return run_tests(repo, ids, timeout_s, tmp_dir=tmp), home


def _passed(result: RunResult, prefix: str) -> set[str]:
    details = result.details or {}
    return {t for t, info in details.items() if info["outcome"] == "pass" and t.startswith(prefix)}


def _public_names(module: str) -> frozenset[str]:
    """Public functions, classes and their methods: what a statement may name as the API."""
    mod = importlib.import_module(module)
    names = set(getattr(mod, "__all__", None) or [n for n in vars(mod) if not n.startswith("_")])
    for name in list(names):
        obj = getattr(mod, name, None)
        if inspect.isclass(obj) and obj.__module__ == module:
            names.update(n for n in vars(obj) if not n.startswith("_"))
    return frozenset(names)


def baseline(module: str, scratch: Path) -> Baseline | str:
    """The module's Baseline, or why it cannot make tasks."""
    text = read_exact(stdlib_dir() / f"{module}.py")
    test_module, prefix = f"test.test_{module}", f"test.test_{module}."
    start = time.monotonic()
    first, _ = _run(text, module, [test_module], 300, scratch)
    seconds = time.monotonic() - start
    second, _ = _run(text, module, [test_module], 300, scratch)
    stable = sorted(_passed(first, prefix) & _passed(second, prefix))
    if not stable:
        return "no test passes on the unmutated module"
    by_id, _ = _run(text, module, stable, 300, scratch)
    passing = tuple(sorted(_passed(by_id, prefix)))
    if len(passing) < 2:
        return "fewer than two tests pass when run by id"
    return Baseline(module, text, test_module, passing, seconds, _public_names(module))


def candidates(module: str, text: str) -> list[Mutation]:
    """All proposed mutations in a fixed pseudo-random order that takes operators in turn."""
    rng = random.Random(f"{SEED}:{module}")
    by_op: dict[str, list[Mutation]] = {}
    for mutation in find_mutations(text):
        by_op.setdefault(mutation.op, []).append(mutation)
    queues = [by_op[op] for op in sorted(by_op)]
    for queue in queues:
        rng.shuffle(queue)
    rng.shuffle(queues)
    order: list[Mutation] = []
    while any(queues):
        order += [queue.pop() for queue in queues if queue]
    return order


def _compiles_differently(text: str, mutant: str, path: str) -> bool:
    try:
        compile(mutant, path, "exec", dont_inherit=True)
    except SyntaxError:
        return False
    return ast.dump(ast.parse(mutant)) != ast.dump(ast.parse(text))


def _task_id(module: str, mutation: Mutation) -> str:
    key = f"{module}|{mutation.op}|{mutation.start}|{mutation.end}|{mutation.replacement}"
    return f"{module}.{hashlib.sha256(key.encode()).hexdigest()[:8]}"


def try_mutant(base: Baseline, mutation: Mutation, scratch: Path) -> Row | str:
    """The task this mutant makes, or why it makes none."""
    mutant = mutation.apply(base.text)
    if not _compiles_differently(base.text, mutant, f"{base.module}.py"):
        return NOT_A_MUTANT
    whole, home = _run(mutant, base.module, [base.test_module], base.timeout_s, scratch)
    if whole.timed_out or whole.details is None:
        return "hangs or crashes the runner"
    failing = sorted(set(base.passing) - _passed(whole, base.test_module + "."))
    if not failing:
        return "no test fails"
    if len(failing) > MAX_FAIL_FRACTION * len(base.passing):
        return "breaks most of the suite"
    again, home_again = _run(mutant, base.module, list(base.passing), base.timeout_s, scratch)
    if again.timed_out or sorted(set(base.passing) - _passed(again, "")) != failing:
        return "fails differently when rerun by test id"
    failures = _failures(whole, home, failing)
    statement = write_statement(base.module, base.test_module, failures, base.public)
    rerun = write_statement(base.module, base.test_module, _failures(again, home_again, failing),
                            base.public)
    if statement != rerun:
        return "its failure messages change from run to run"
    return Row(task_id=_task_id(base.module, mutation), module=base.module,
               path=f"{base.module}.py", source_sha256=sha256_text(base.text),
               python=python_version(), mutation=mutation, test_module=base.test_module,
               fail_to_pass=tuple(failing),
               pass_to_pass=tuple(t for t in base.passing if t not in set(failing)),
               statement=statement, difficulty=difficulty(mutation.op, failures),
               generator=GENERATOR_VERSION)


def _failures(result: RunResult, home: str, failing: list[str]) -> dict[str, dict]:
    """Runner details of the failing tests, with run-specific text removed."""
    details = result.details or {}
    return {t: {k: _clean(v, home) for k, v in details.get(t, {}).items()} for t in failing}


def _clean(value: object, home: str) -> object:
    if isinstance(value, str):
        return clean(value, {f"{home}/repo": ".", f"{home}/tmp": "/tmp"})
    if isinstance(value, list):
        return [_clean(v, home) for v in value]
    return value


@dataclass(frozen=True)
class ModuleResult:
    module: str
    rows: list[Row]
    rejected: Counter[str]  # why the other mutants tried made no task
    seconds: float
    skipped: str | None = None  # why the module made no tasks at all

    @property
    def tries(self) -> int:
        return len(self.rows) + self.rejected.total()


def build_module(module: str, scratch: Path, per_module: int = TASKS_PER_MODULE,
                 tries: int = TRIES_PER_MODULE) -> ModuleResult:
    start = time.monotonic()
    base = baseline(module, scratch)
    if isinstance(base, str):
        return ModuleResult(module, [], Counter(), time.monotonic() - start, base)
    rows: list[Row] = []
    rejected: Counter[str] = Counter()
    for mutation in candidates(module, base.text):
        if len(rows) >= per_module or len(rows) + rejected.total() >= tries:
            break
        outcome = try_mutant(base, mutation, scratch)
        if isinstance(outcome, Row):
            rows.append(outcome)
        elif outcome != NOT_A_MUTANT:
            rejected[outcome] += 1
    return ModuleResult(module, rows, rejected, time.monotonic() - start)


def build_suite(modules: list[str], workers: int = 2, per_module: int = TASKS_PER_MODULE,
                tries: int = TRIES_PER_MODULE, log: Callable[[str], None] = print
                ) -> list[ModuleResult]:
    """Build every module (at most `workers` test runs at a time), in `modules` order."""
    with tempfile.TemporaryDirectory(prefix="stdlib-build-") as scratch:
        def one(module: str) -> ModuleResult:
            result = build_module(module, Path(scratch), per_module, tries)
            note = f" (skipped: {result.skipped})" if result.skipped else ""
            log(f"{module:14s} {len(result.rows):2d} tasks from {result.tries:2d} mutants "
                f"in {result.seconds:5.1f}s{note}")
            return result

        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(one, modules))
