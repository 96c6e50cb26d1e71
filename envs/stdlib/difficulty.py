"""Difficulty from what a solver has to go on: how many tests fail, whether anything crashes,
and how quiet the bug is.

points = 2 if one test fails, 1 if two to four fail, 0 if more
       + 1 if every failure is a wrong value (AssertionError), no exception to trace back
       + 1 if the operator makes a quiet edit (comparison, off-by-one, constant, dropped line)
easy: 0-1 points, medium: 2, hard: 3-4.
"""

from __future__ import annotations

QUIET_OPERATORS = frozenset({"flip_comparison", "off_by_one", "wrong_constant", "drop_statement"})


def difficulty(op: str, failures: dict[str, dict]) -> str:
    """`failures`: FAIL_TO_PASS id -> runner details (their "error" starts with the type)."""
    count = len(failures)
    points = 2 if count == 1 else 1 if count <= 4 else 0
    if all(info.get("error", "").startswith("AssertionError") for info in failures.values()):
        points += 1
    if op in QUIET_OPERATORS:
        points += 1
    return "easy" if points <= 1 else "medium" if points == 2 else "hard"
