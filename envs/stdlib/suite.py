"""Loading a tasks file: every bad row is named, then refused or skipped as configured."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from envs.stdlib.materialize import verify
from envs.stdlib.rows import Row, TaskRowError, parse_row
from envs.task import EnvError, warn_bad_task

BUILTIN = Path(__file__).resolve().parents[1] / "tasks" / "stdlib" / "tasks-v1.jsonl"


def load_rows(path: Path = BUILTIN, on_bad: str = "fail", check_source: bool = True,
              report: Callable[[EnvError], None] = warn_bad_task) -> list[Row]:
    """Rows of a JSON-lines tasks file, in file order.

    A bad row (not JSON, missing or mistyped field, duplicate id and, with `check_source`,
    module not found, installed source changed, mutation no longer applies) raises
    TaskRowError naming its task id when `on_bad` is "fail", or goes to `report` and is
    skipped when it is "skip".
    """
    if on_bad not in ("fail", "skip"):
        raise EnvError(f"on_bad must be 'fail' or 'skip', not {on_bad!r}")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise EnvError(f"cannot read stdlib tasks file {path}: {exc}") from None
    rows: list[Row] = []
    seen: set[str] = set()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path.name} line {number}"
        try:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TaskRowError(f"{where}: not JSON: {exc}") from None
            row = parse_row(obj, where)
            if row.task_id in seen:
                raise TaskRowError(f"task {row.task_id}: duplicate id ({where})")
            if check_source:
                verify(row)
        except TaskRowError as exc:
            if on_bad == "fail":
                raise
            report(exc)
            continue
        seen.add(row.task_id)
        rows.append(row)
    return rows
