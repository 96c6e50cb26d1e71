"""A task row: everything that defines a stdlib task, as data (no copies of code)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from envs.stdlib.mutations import Mutation
from envs.task import EnvError

GENERATOR_VERSION = 1
DIFFICULTIES = ("easy", "medium", "hard")
TEXT_FIELDS = ("task_id", "module", "path", "source_sha256", "python", "test_module",
               "statement", "difficulty")
LIST_FIELDS = ("fail_to_pass", "pass_to_pass")


class TaskRowError(EnvError):
    """A row that cannot become a task; the message starts with the task id."""


@dataclass(frozen=True)
class Row:
    task_id: str
    module: str  # importable name, e.g. "textwrap"
    path: str  # the module's file, relative to the stdlib folder and to the task repo
    source_sha256: str  # of the unmutated file the task was built from
    python: str  # the interpreter version it was built on
    mutation: Mutation
    test_module: str  # e.g. "test.test_textwrap"
    fail_to_pass: tuple[str, ...]  # sorted unittest ids failing on the mutant, passing on the
    pass_to_pass: tuple[str, ...]  # original; and those passing on both
    statement: str
    difficulty: str
    generator: int

    @property
    def hidden_tests(self) -> list[str]:
        """Every test id a solution must pass."""
        return sorted(self.fail_to_pass + self.pass_to_pass)

    def _grouped(self, ids: tuple[str, ...]) -> dict[str, list[str]]:
        groups: dict[str, list[str]] = {}
        for test_id in sorted(ids):
            case, _, method = test_id.removeprefix(self.test_module + ".").rpartition(".")
            groups.setdefault(case, []).append(method)
        return groups

    def to_json(self) -> dict:
        """Test ids are stored as {TestCase class: [methods]} under `test_module`: a suite's
        PASS_TO_PASS list repeats the same long prefixes hundreds of times otherwise."""
        return {"task_id": self.task_id, "module": self.module, "path": self.path,
                "source_sha256": self.source_sha256, "python": self.python,
                "mutation": self.mutation.to_json(), "test_module": self.test_module,
                "fail_to_pass": self._grouped(self.fail_to_pass),
                "pass_to_pass": self._grouped(self.pass_to_pass),
                "statement": self.statement, "difficulty": self.difficulty,
                "generator": self.generator}


def parse_row(obj: object, where: str) -> Row:
    """A validated Row; TaskRowError names the task id (or `where` if the id is missing)."""
    if not isinstance(obj, dict):
        raise TaskRowError(f"{where}: a task row must be a JSON object")
    name = obj.get("task_id") if isinstance(obj.get("task_id"), str) else None
    label = f"task {name}" if name else where

    def bad(why: str) -> TaskRowError:
        return TaskRowError(f"{label}: {why}")

    missing = [k for k in (*TEXT_FIELDS, *LIST_FIELDS, "mutation", "generator") if k not in obj]
    if missing:
        raise bad(f"missing fields {missing}")
    for key in TEXT_FIELDS:
        if not isinstance(obj[key], str) or not obj[key]:
            raise bad(f"field {key!r} must be a non-empty string")
    for key in LIST_FIELDS:
        groups = obj[key]
        if not isinstance(groups, dict) or not all(
                isinstance(case, str) and isinstance(methods, list) and methods
                and all(isinstance(m, str) and m for m in methods)
                for case, methods in groups.items()):
            raise bad(f"field {key!r} must map test classes to lists of test names")
    if not obj["fail_to_pass"]:
        raise bad("fail_to_pass is empty: the task would have nothing to fix")
    if not re.fullmatch(r"[A-Za-z_]\w*", obj["module"]) or obj["path"] != obj["module"] + ".py":
        raise bad(f"module {obj['module']!r} / path {obj['path']!r}: want a top-level <name>.py")
    if obj["difficulty"] not in DIFFICULTIES:
        raise bad(f"difficulty {obj['difficulty']!r} is not one of {DIFFICULTIES}")
    if not isinstance(obj["generator"], int):
        raise bad("field 'generator' must be an integer")
    try:
        mutation = Mutation.from_json(obj["mutation"])
    except (KeyError, TypeError, ValueError) as exc:
        raise bad(f"bad mutation: {exc!r}") from None
    return Row(task_id=obj["task_id"], module=obj["module"], path=obj["path"],
               source_sha256=obj["source_sha256"], python=obj["python"], mutation=mutation,
               test_module=obj["test_module"], fail_to_pass=_full(obj, "fail_to_pass"),
               pass_to_pass=_full(obj, "pass_to_pass"), statement=obj["statement"],
               difficulty=obj["difficulty"], generator=obj["generator"])


def _full(obj: dict, key: str) -> tuple[str, ...]:
    prefix = obj["test_module"]
    return tuple(sorted(f"{prefix}.{case}.{m}" if case else f"{prefix}.{m}"
                        for case, methods in obj[key].items() for m in methods))


def write_rows(rows: list[Row], path: Path) -> None:
    """One JSON object per line, keys in a fixed order: reruns give identical bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r.to_json(), ensure_ascii=False) + "\n" for r in rows)
    path.write_text(text, encoding="utf-8")
