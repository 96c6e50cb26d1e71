"""Reading unittest's report: totals, and the outcome of each test id."""

from __future__ import annotations

import re

# One header per failing test, subtest or tearDown; a test is counted once however many it has.
_FAILED = re.compile(r"^(?:FAIL|ERROR|UNEXPECTED SUCCESS): (\S+ \([^)]*\))", re.M)


def parse_unittest(output: str) -> tuple[int, int, int]:
    """(tests run, tests failed, errored or unexpectedly passed, tests skipped) from unittest's
    report; an expected failure is a pass."""
    ran = re.search(r"^Ran (\d+) tests?", output, re.M)
    total = int(ran.group(1)) if ran else 0
    skipped = re.findall(r"^(?:OK|FAILED) \(.*\bskipped=(\d+)", output, re.M)
    return total, len(set(_FAILED.findall(output))), int(skipped[-1]) if skipped else 0
