"""Problem statements written from failing behaviour, like a user's bug report.

Inputs are only what the failing tests show: names, docstrings, the test code on the failing
path and the error. Never the diff, the mutated line or the operator: the solver must find
the bug. Frames inside the mutated module are dropped by the runner for the same reason.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterable

SHOWN_TESTS = 2
LISTED_TESTS = 6
MAX_ERROR_LINES = 12
MAX_ERROR_CHARS = 700


def clean(text: str, paths: dict[str, str]) -> str:
    """Drop what differs between runs: scratch folders (given as {path: stand-in}) and object
    addresses."""
    for path, stand_in in paths.items():
        text = text.replace(path, stand_in)
    text = re.sub(r"\[\d+ chars\]", "[...]", text)  # unittest's elisions count path lengths
    return re.sub(r"0x[0-9a-fA-F]{6,}", "0x...", text)


def _short_error(error: str) -> str:
    lines = error.splitlines()
    text = "\n".join(lines[:MAX_ERROR_LINES])
    if len(text) > MAX_ERROR_CHARS:
        text = text[:MAX_ERROR_CHARS].rstrip() + " ..."
    elif len(lines) > MAX_ERROR_LINES:
        text += "\n..."
    return text


def _apis(failures: dict[str, dict], public: set[str]) -> list[str]:
    """Public names of the module that the failing test code calls, in order of appearance."""
    seen: list[str] = []
    for _, info in sorted(failures.items()):
        for _, code in info.get("where") or []:
            for name in re.findall(r"\b([A-Za-z]\w*)\s*\(", code):
                if name in public and name not in seen:
                    seen.append(name)
    return seen


def _lead(module: str, failures: dict[str, dict], public: set[str], test_module: str) -> str:
    kinds = sorted({info.get("error", "").split(":", 1)[0] for info in failures.values()})
    errors = [k for k in kinds if k and k != "AssertionError"]
    symptom = f"raise {' / '.join(errors[:2])}" if errors else "give wrong results"
    apis = [f"`{name}()`" for name in _apis(failures, public)[:3]]
    subject = f"calls such as {', '.join(apis)}" if apis else "some of its functions"
    count = len(failures)
    tests = f"{count} tests in `{test_module}` fail" if count > 1 else \
        f"a test in `{test_module}` fails"
    return f"In the `{module}` module, {subject} {symptom}: {tests}."


def _example(test_id: str, info: dict, test_module: str) -> str:
    name = test_id.removeprefix(test_module + ".")
    head = f"`{name}`"
    if info.get("doc"):
        head += f" ({info['doc'].strip()})"
    if info.get("subtest"):
        head += f", subtest {info['subtest']}"
    parts = [head + ":"]
    code = [f"# in {func}\n{textwrap.dedent(src)}" for func, src in info.get("where") or []]
    if code:
        parts.append("```python\n" + "\n".join(code) + "\n```")
    parts.append("fails with:\n```\n" + _short_error(info.get("error", "(no message)")) + "\n```")
    return "\n".join(parts)


def write_statement(module: str, test_module: str, failures: dict[str, dict],
                    public: Iterable[str]) -> str:
    """An issue text for a bug whose failing tests (id -> runner details) are `failures`."""
    public = set(public)
    ids = sorted(failures, key=lambda t: (not failures[t].get("where"), t))
    shown = ids[:SHOWN_TESTS]
    parts = [_lead(module, failures, public, test_module), ""]
    parts += [_example(t, failures[t], test_module) + "\n" for t in shown]
    rest = sorted(set(failures) - set(shown))
    if rest:
        names = ", ".join(f"`{t.removeprefix(test_module + '.')}`" for t in rest[:LISTED_TESTS])
        more = f" and {len(rest) - LISTED_TESTS} more" if len(rest) > LISTED_TESTS else ""
        parts.append(f"Also failing: {names}{more}.\n")
    parts.append(f"The tests are the standard library's own (`python -m unittest {test_module}`)"
                 f" and are correct: fix `{module}.py` so that they pass again.")
    return "\n".join(parts)
