"""scripts/mutants.py stays runnable and its report readable: every module, test file and
function it names exists, every equivalent mutant it is told of names a module it mutates and
says why, a mutant's id and change are read from mutmut's mutated module, and the score leaves
out only the survivors named equivalent."""

import ast
import json

from rollfleet.paths import ROOT
from tests.scripts import load_script

mutants = load_script("mutants")


def _functions_in(path):
    """Qualified names of a module's functions and methods (Class.method)."""
    names = set()
    for node in ast.parse((ROOT / path).read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names |= {f"{node.name}.{f.name}" for f in node.body
                      if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}
    return names


def test_every_module_test_file_and_function_of_the_map_exists():
    for path, (tests, functions) in mutants.MODULES.items():
        assert (ROOT / path).is_file(), path
        assert tests and all((ROOT / t).is_file() for t in tests), path
        assert set(functions or ()) <= _functions_in(path), path


def test_each_equivalent_mutant_names_a_mutated_module_and_says_why():
    equivalent = json.loads(mutants.EQUIVALENT.read_text())
    for mutant_id, why in equivalent.items():
        path, function, digest = mutant_id.split(":")
        assert path in mutants.MODULES and function in _functions_in(path), mutant_id
        assert len(digest.rstrip("+")) == 8 and why.strip(), mutant_id


def test_a_mutant_s_change_is_read_from_mutmut_s_mutated_module(tmp_path):
    mutated = tmp_path / "m.py"
    mutated.write_text(
        "def x_f__mutmut_orig(a):\n    return a + 1\n\n"
        "def x_f__mutmut_1(a):\n    return a - 1\n\n"
        "class C:\n"
        "    def xǁCǁm__mutmut_orig(self):\n        return 2\n\n"
        "    def xǁCǁm__mutmut_1(self):\n        return 3\n")
    assert mutants._mutant_diffs(mutated) == {
        "x_f__mutmut_1": ("f", ["- return a + 1", "+ return a - 1"]),
        "xǁCǁm__mutmut_1": ("C.m", ["- return 2", "+ return 3"])}
    assert mutants._globs("envs/suites/stdlib.py", ["StdlibRepo.grade", "load"]) == [
        "envs.suites.stdlib.xǁStdlibRepoǁgrade__mutmut_*", "envs.suites.stdlib.x_load__mutmut_*"]


def test_the_score_is_caught_over_the_mutants_not_named_equivalent():
    results = {"a": {"status": "killed"}, "b": {"status": "timeout"},
               "c": {"status": "survived"}, "d": {"status": "no tests"},
               "e": {"status": "survived"}}
    assert mutants.summarize(results, {"c": "why", "a": "a killed one counts as killed"}) == {
        "mutants": 5, "killed": 1, "survived": 3, "timed_out": 1, "errors": 0,
        "equivalent": 1, "score": 0.5}


def test_the_tests_readme_shows_the_committed_report():
    """Its table is `mutants.py --table` of tests/mutants.json, row for row."""
    readme = (ROOT / "tests" / "README.md").read_text()
    shown = readme[readme.index("<!-- mutants -->") + len("<!-- mutants -->\n"):
                   readme.index("<!-- /mutants -->")].strip()
    assert shown == mutants.markdown_table(json.loads(mutants.REPORT.read_text())), \
        "tests/README.md's table is stale: paste `python scripts/mutants.py --table` there"
