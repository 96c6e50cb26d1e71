"""Runs unittest ids against the working directory and prints one line of outcomes.

Never imported: `testing.test_command` passes this file's text to `python -B -c`, so a
sandbox needs nothing but the interpreter. The working directory is the task's repository and
goes first on sys.path before anything else is imported, so its mutated module shadows the
installed one for the tests and for unittest alike, as with `python -m unittest`. Stale
bytecode there is removed first: a same-size edit within one second would otherwise run the
old .pyc.
"""

import os
import sys

DETAILS, SUMMARY = "@@stdlib-details@@", "@@stdlib-summary@@"  # parsed by testing.py
HERE = os.getcwd()
sys.path[:] = [HERE] + [p for p in sys.path if p not in ("", HERE)]
for _root, _dirs, _files in os.walk(HERE):
    if os.path.basename(_root) == "__pycache__":
        for _name in _files:
            os.remove(os.path.join(_root, _name))

import random  # noqa: E402
import traceback  # noqa: E402
import unittest  # noqa: E402


def _where(test: unittest.TestCase, tb) -> list[list[str]]:
    """[function, source] of the test-file statements on the failing path (first and last)."""
    test_file = getattr(sys.modules.get(type(test).__module__), "__file__", None)
    frames = [f for f in traceback.extract_tb(tb) if f.filename == test_file]
    out = []
    for frame in frames[:1] + frames[1:][-1:]:
        lines = [traceback.linecache.getline(frame.filename, n)
                 for n in range(frame.lineno, (frame.end_lineno or frame.lineno) + 1)]
        out.append([frame.name, "".join(lines).rstrip()])
    return out


class Recorder(unittest.TextTestResult):
    """Keeps one outcome per test id; a failing subtest fails its test. Each test starts from
    a random seed of its own id: suites that draw unseeded random data then give the same
    verdict on every run and in any order."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.outcomes: dict[str, dict] = {}

    def startTest(self, test) -> None:
        random.seed(test.id())
        super().startTest(test)

    def _record(self, test, outcome: str, err=None, subtest=None) -> None:
        if self.outcomes.get(test.id(), {}).get("outcome") == "fail":
            return
        row = {"outcome": outcome}
        if err is not None:
            exc_type, exc, tb = err
            row["error"] = f"{exc_type.__name__}: {exc}"[:2000]
            row["where"] = _where(test, tb)
            row["doc"] = test.shortDescription() if hasattr(test, "shortDescription") else None
            row["subtest"] = subtest._subDescription() if subtest is not None else None
        self.outcomes[test.id()] = row

    def addSuccess(self, test) -> None:
        super().addSuccess(test)
        if test.id() not in self.outcomes:
            self._record(test, "pass")

    def addFailure(self, test, err) -> None:
        super().addFailure(test, err)
        self._record(test, "fail", err)

    def addError(self, test, err) -> None:
        super().addError(test, err)
        self._record(test, "fail", err)

    def addSubTest(self, test, subtest, err) -> None:
        super().addSubTest(test, subtest, err)
        if err is not None:
            self._record(test, "fail", err, subtest)

    def addSkip(self, test, reason) -> None:
        super().addSkip(test, reason)
        self._record(test, "skip")

    def addExpectedFailure(self, test, err) -> None:
        super().addExpectedFailure(test, err)
        self._record(test, "pass")

    def addUnexpectedSuccess(self, test) -> None:
        super().addUnexpectedSuccess(test)
        self._record(test, "fail")


def _summary(ids: list[str], outcomes: dict[str, dict]) -> dict:
    """Counts, and the requested tests that did not pass: failed, skipped or never run (the
    first 10, so the line survives a cut output). A test that never ran (import error, failing
    setUpClass) counts once, as missing."""
    def requested(test_id: str) -> bool:
        return any(test_id == i or test_id.startswith(i + ".") for i in ids)

    bad = sorted(k for k, v in outcomes.items() if v["outcome"] != "pass" and requested(k))
    bad += [i for i in ids if not any(k == i or k.startswith(i + ".") for k in outcomes)]
    passed = sum(v["outcome"] == "pass" for v in outcomes.values())
    return {"tests": len(outcomes), "passed": passed, "not_passed": bad[:10],
            "n_not_passed": len(bad)}


def main(args: list[str]) -> int:
    details = args[:1] == ["--details"]
    ids = args[1:] if details else args
    suite = unittest.TestSuite()
    for name in ids:
        try:  # a name that is not a test (say, a doctest helper) must not sink the others
            suite.addTest(unittest.defaultTestLoader.loadTestsFromName(name))
        except Exception as exc:
            print(f"cannot load {name}: {exc!r}", file=sys.stderr)
    result = unittest.TextTestRunner(stream=sys.stderr, resultclass=Recorder).run(suite)
    sys.stderr.flush()
    sys.stdout.flush()
    summary = _summary(ids, result.outcomes)
    lines = [f"{DETAILS} {result.outcomes!r}"] if details else []
    lines.append(f"{SUMMARY} {summary!r}")
    # Straight to the descriptor, then exit without atexit hooks: code under test cannot
    # append or reformat the verdict through a patched sys.stdout or a late print.
    data = ("\n" + "\n".join(lines) + "\n").encode("utf-8", "backslashreplace")
    while data:
        data = data[os.write(1, data):]
    return 1 if summary["n_not_passed"] else 0


os._exit(main(sys.argv[1:]))
