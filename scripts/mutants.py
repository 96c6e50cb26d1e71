"""Generated mutants (mutmut) of the modules that hold the project's promises, each module run
against its own unit tests, in a scratch worktree of HEAD; results cached by content.

    nice -n 19 python scripts/mutants.py [--fresh] [--only TEXT,...] [--shard I/N] [--budget-s S]
    python scripts/mutants.py --table     (the report as tests/README.md's table)

Each module of MODULES is mutated by mutmut in a `git worktree` of HEAD (the working tree is
never touched) and its mutants run against the test files named beside it, one at a time. A
module's results are kept in tests/mutants.json under a key: the git blob ids (content hashes)
of the module and its tests at HEAD, the functions chosen and the mutmut version. A rerun runs
only the modules whose key changed (--fresh: all); the report is written after each module, so
a stopped run resumes where it stopped. --only TEXT[,TEXT]: the modules whose path has one; --shard
I/N: every Nth module from the Ith; --budget-s S: no module starts after S seconds.

A surviving mutant either gets a test that kills it or a line in tests/mutants_equivalent.json
(its id: why no test can tell it from the original). The score is caught (killed or timed out)
over the mutants that are not equivalent; the script exits 1 when the report's is under 85%.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rollfleet.paths import ROOT

REPORT = ROOT / "tests" / "mutants.json"
EQUIVALENT = ROOT / "tests" / "mutants_equivalent.json"
GOAL = 0.85

# module -> (its unit tests, the functions to mutate or None for all). mutmut mutates function
# bodies; module constants, decorated functions and properties are left alone. Left out: the
# tier's store client (kvtier/client.py), whose tests start a Mooncake master and store for
# every mutant (400 mutants, ~30 min here), and the connector's halves inside a vLLM engine
# (scheduler and worker: the e2e tests' reach), leaving its keys and namespace.
MODULES: dict[str, tuple[list[str], list[str] | None]] = {
    "rollout/record.py": (["tests/rollout/test_record.py"], None),
    "rollout/rl/trainer_view.py": (["tests/rollout/test_record.py"], None),
    "rollout/rl/policy_fence.py": (["tests/rollout/rl/test_policy_fence.py"], None),
    "rollout/rl/loop.py": (["tests/rollout/rl/test_loop.py"],  # the lag bound, whole groups
                           ["Rollouts._hand_over", "GroupSource.take", "GroupSource.resample",
                            "GroupSource.in_flight", "GroupSource.consumed"]),
    "rollout/admission.py": (["tests/rollout/test_admission.py"], None),
    "serving/policy.py": (["tests/serving/test_policy.py"], None),
    "serving/checkpoints.py": (["tests/serving/test_checkpoints.py"], None),
    "serving/engine/kvtier/blocks.py": (["tests/serving/test_kvtier.py"], None),
    "serving/engine/kvtier/connector.py": (["tests/serving/test_kvtier_connector.py"],
                                           ["MooncakeTierConnector.key",
                                            "MooncakeTierConnector._policy_namespace",
                                            "MooncakeTierConnector.reset_cache",
                                            "MooncakeTierConnector._remember",
                                            "MooncakeTierConnector._forget"]),
    "serving/toolcall/utf8.py": (["tests/serving/toolcall/test_utf8.py"], None),
    "serving/toolcall/parser.py": (["tests/serving/toolcall/test_parser.py"], None),
    "rollfleet/toolschema.py": (["tests/rollfleet/test_toolschema.py"], None),
    "envs/scoring.py": (["tests/envs/test_scoring.py"], None),
    "envs/unittest_output.py": (["tests/envs/test_unittest_output.py"], None),
    "envs/suites/mini.py": (["tests/envs/test_unittest_output.py"], ["MiniRepo.grade"]),
    "envs/suites/stdlib.py": (["tests/envs/suites/test_stdlib.py"], ["StdlibRepo.grade"]),
    "envs/suites/swebench.py": (["tests/envs/suites/test_swebench.py"], ["GitRepo.grade"]),
    "rollout/reports/evals.py": (["tests/rollout/reports/test_evals.py"], None),
    "rollout/reports/report.py": (["tests/rollout/reports/test_report.py"],
                                  ["member_figures", "_pair"]),
}

# mutmut's exit codes as this report counts them; anything else is "error"
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests",
          36: "timeout", 24: "timeout", -24: "timeout", 152: "timeout", 255: "timeout"}
# A log call's wording is no promise: its statements are not mutated (mutmut's patterns)
UNMUTATED_LINES = r"^\s*(log|logger)\.(debug|info|warning|error|exception)\("
PACKAGES = ["rollout", "serving", "envs", "rollfleet", "planner", "kernels"]
_MUTANT = re.compile(r"^(.*)__mutmut_(\d+|orig)$")


def _git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def module_key(commit: str, path: str, tests: list[str], functions: list[str] | None,
               version: str) -> str:
    """What a module's results depend on: its text, its tests' (and their conftests'), the
    functions chosen, the tool."""
    conftests = {str(Path(t).parent / "conftest.py") for t in tests} | {"tests/conftest.py"}
    blobs = [_git("rev-parse", f"{commit}:{p}") if _git("ls-tree", commit, p) else "-"
             for p in [path, *tests, *sorted(conftests)]]
    return hashlib.sha256(json.dumps([path, blobs, functions, version]).encode()).hexdigest()[:16]


def _globs(path: str, functions: list[str] | None) -> list[str]:
    """mutmut's names of the functions' mutants: module.x_f__mutmut_N, module.xǁCǁm__mutmut_N."""
    module = path.removesuffix(".py").replace("/", ".")
    if functions is None:
        return []
    return [f"{module}.x{'ǁ'.join(['', *f.split('.')]) if '.' in f else '_' + f}__mutmut_*"
            for f in functions]


def _function_name(mangled: str) -> str:
    return ".".join(mangled[1:].split("ǁ")[1:]) if mangled.startswith("xǁ") else mangled[2:]


def _mutant_diffs(mutated_file: Path) -> dict[str, tuple[str, list[str]]]:
    """mutmut name -> (function, the lines it changes), read from the mutated module."""
    module = ast.parse(text := mutated_file.read_text())
    lines = text.splitlines()  # (ast.get_source_segment splits the whole file at each call)
    sources: dict[str, dict[str, str]] = {}
    for node in ast.walk(module):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _MUTANT.match(node.name):
            base, n = _MUTANT.match(node.name).groups()
            source = "\n".join(lines[node.lineno - 1:node.end_lineno]).replace(node.name, base)
            sources.setdefault(base, {})[n] = source
    diffs = {}
    for base, variants in sources.items():
        orig = variants.pop("orig").splitlines()
        for n, source in variants.items():
            lines = [ln[0] + " " + ln[1:].strip() for ln in
                     difflib.unified_diff(orig, source.splitlines(), n=0, lineterm="")
                     if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
            diffs[f"{base}__mutmut_{n}"] = (_function_name(base), lines)
    return diffs


def run_module(tree: Path, path: str, tests: list[str], functions: list[str] | None,
               log: Path) -> dict[str, Any]:
    """One mutmut run over `path` against `tests`: each mutant's id, status and change."""
    config = "\n".join([
        "", "[tool.mutmut]", f"source_paths = {json.dumps(PACKAGES)}",
        f"only_mutate = {json.dumps([path])}", 'also_copy = ["conf", "rollfleet_tasks.py"]',
        f"pytest_add_cli_args_test_selection = {json.dumps(tests)}",
        'pytest_add_cli_args = ["-p", "no:cacheprovider"]',
        f"do_not_mutate_patterns = {json.dumps([UNMUTATED_LINES])}",
        # a mutant that hangs is caught once it runs 3x its tests' clean time + 10 s (mutmut's
        # 15x cost minutes a timeout here)
        "timeout_multiplier = 3.0", "timeout_constant = 10.0",
        'process_isolation = "forkserver"', ""])
    _git("checkout", "-q", "--", "pyproject.toml", cwd=tree)
    with (tree / "pyproject.toml").open("a") as f:
        f.write(config)
    shutil.rmtree(tree / "mutants", ignore_errors=True)
    # the tiny model, built once, by the first test that needs it (on a clean clone, through
    # this link: a link to no folder fails that test's collection, and mutmut with it)
    (ROOT / ".cache" / "models").mkdir(parents=True, exist_ok=True)
    (tree / "mutants" / ".cache").mkdir(parents=True)
    (tree / "mutants" / ".cache" / "models").symlink_to(ROOT / ".cache" / "models")
    with log.open("w") as out:
        run = subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", "1",
                              *_globs(path, functions)], cwd=tree, stdout=out,
                             stderr=subprocess.STDOUT)
    meta = tree / "mutants" / f"{path}.meta"
    if run.returncode != 0 or not meta.exists():
        raise RuntimeError(f"mutmut failed on {path} (exit {run.returncode}); see {log}")
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    diffs = _mutant_diffs(tree / "mutants" / path)
    results: dict[str, dict[str, Any]] = {}
    for name, code in sorted(codes.items()):
        function, lines = diffs[name.rpartition(".")[2]]
        if functions is not None and function not in functions:
            continue
        if code is None:
            raise RuntimeError(f"mutmut left {name} unchecked; see {log}")
        digest = hashlib.sha256("\n".join([function, *lines]).encode()).hexdigest()[:8]
        mutant_id = f"{path}:{function}:{digest}"
        while mutant_id in results:  # the same change at two places of one function
            mutant_id += "+"
        results[mutant_id] = {"status": STATUS.get(code, "error"), "change": lines}
    return results


def summarize(results: dict[str, dict[str, Any]], equivalent: dict[str, str]) -> dict[str, Any]:
    statuses = [r["status"] for r in results.values()]
    survivors = [i for i, r in results.items() if r["status"] in ("survived", "no tests")]
    caught = statuses.count("killed") + statuses.count("timeout")
    counted = len(results) - sum(i in equivalent for i in survivors)
    return {"mutants": len(results), "killed": statuses.count("killed"),
            "survived": len(survivors), "timed_out": statuses.count("timeout"),
            "errors": statuses.count("error"),
            "equivalent": sum(i in equivalent for i in survivors),
            "score": round(caught / counted, 4) if counted else 1.0}


def write_report(report: dict[str, Any], equivalent: dict[str, str]) -> None:
    """The report with its figures recomputed: per module and over all modules."""
    totals = {"mutants": 0, "killed": 0, "survived": 0, "timed_out": 0, "errors": 0,
              "equivalent": 0}
    for path, entry in report["modules"].items():
        entry.update(summarize(entry["results"], equivalent))
        for field in totals:
            totals[field] += entry[field]
        for mutant_id, result in entry["results"].items():
            result.pop("equivalent", None)
            if mutant_id in equivalent and result["status"] in ("survived", "no tests"):
                result["equivalent"] = equivalent[mutant_id]
        report["modules"][path] = entry
    counted = totals["mutants"] - totals["equivalent"]
    totals["score"] = round((totals["killed"] + totals["timed_out"]) / counted, 4) \
        if counted else 1.0
    report["total"] = totals
    REPORT.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")


def markdown_table(report: dict[str, Any]) -> str:
    """tests/README.md's table of the last run of each module (`--table` prints it)."""
    lines = ["| module (functions mutated) | its tests | mutants | killed | survived | timed out "
             "| equivalent | score | s | at |", "|---|---|---|---|---|---|---|---|---|---|"]
    for path, e in report["modules"].items():
        functions = f" ({', '.join(e['functions'])})" if e["functions"] else ""
        tests = ", ".join(f"`{t.removeprefix('tests/')}`" for t in e["tests"])
        lines.append(f"| `{path}`{functions} | {tests} | {e['mutants']} | {e['killed']} | "
                     f"{e['survived']} | {e['timed_out']} | {e['equivalent']} | "
                     f"{e['score']:.1%} | {e['seconds']} | {e['commit'][:7]} |")
    t = report["total"]
    seconds = sum(e["seconds"] for e in report["modules"].values())
    lines.append(f"| total | | {t['mutants']} | {t['killed']} | {t['survived']} | "
                 f"{t['timed_out']} | {t['equivalent']} | {t['score']:.1%} | {seconds} | |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if "--table" in argv:
        print(markdown_table(json.loads(REPORT.read_text())))
        return 0
    fresh = "--fresh" in argv
    only = argv[argv.index("--only") + 1].split(",") if "--only" in argv else [""]
    shard, shards = (map(int, argv[argv.index("--shard") + 1].split("/"))
                     if "--shard" in argv else (0, 1))
    budget_s = float(argv[argv.index("--budget-s") + 1]) if "--budget-s" in argv else None
    version = importlib.metadata.version("mutmut")
    equivalent = json.loads(EQUIVALENT.read_text()) if EQUIVALENT.exists() else {}
    report = json.loads(REPORT.read_text()) if REPORT.exists() else {"modules": {}}
    report["tool"] = f"mutmut {version}"
    chosen = [p for p in list(MODULES)[shard::shards] if any(o in p for o in only)]
    start = time.monotonic()
    commit = _git("rev-parse", "HEAD")  # what the worktree holds, whatever lands meanwhile
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        _git("worktree", "add", "-q", "--detach", str(tree), commit)
        try:
            for path in chosen:
                tests, functions = MODULES[path]
                key = module_key(commit, path, tests, functions, version)
                cached = report["modules"].get(path, {})
                if cached.get("key") == key and not fresh:
                    print(f"{path}: cached ({cached['mutants']} mutants)", flush=True)
                    continue
                if budget_s is not None and time.monotonic() - start > budget_s:
                    print(f"{path}: not started (budget of {budget_s:.0f} s spent)", flush=True)
                    continue
                began = time.monotonic()
                log = Path(tmp) / "mutmut.log"
                try:
                    results = run_module(tree, path, tests, functions, log)
                except RuntimeError as exc:
                    print(f"{path}: {exc}\n{log.read_text()[-3000:]}")
                    return 2
                report["modules"][path] = {
                    "key": key, "tests": tests, "functions": functions,
                    "commit": commit[:10],
                    "seconds": round(time.monotonic() - began), "results": results}
                write_report(report, equivalent)
                entry = report["modules"][path]
                print(f"{path}: {entry['mutants']} mutants, {entry['killed']} killed, "
                      f"{entry['survived']} survived, {entry['timed_out']} timed out "
                      f"in {entry['seconds']} s", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                           check=False)
    report["modules"] = {p: report["modules"][p] for p in MODULES if p in report["modules"]}
    write_report(report, equivalent)
    print(f"{'module':40} {'mutants':>7} {'killed':>6} {'surv.':>5} {'t/o':>4} {'equiv.':>6} "
          f"{'score':>6}")
    for path, e in [*report["modules"].items(), ("total", report["total"])]:
        print(f"{path:40} {e['mutants']:7} {e['killed']:6} {e['survived']:5} "
              f"{e['timed_out']:4} {e['equivalent']:6} {e['score']:6.1%}")
    print(f"this run: {time.monotonic() - start:.0f} s")
    return 0 if report["total"]["score"] >= GOAL else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
