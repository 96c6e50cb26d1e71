"""scripts/check_mutations.py stays runnable: each break it lists still finds, exactly once, the
code it breaks, and each test it names still exists (the day the code moves, this fails, not a
full run of the script weeks later)."""

import ast

import pytest

from rollfleet.paths import ROOT
from tests.scripts import load_script

check_mutations = load_script("check_mutations")
MUTATIONS = check_mutations.MUTATIONS


def _tests_in(path):
    tree = ast.parse((ROOT / path).read_text())
    return {node.name for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}


@pytest.mark.parametrize(("what", "path", "old", "new", "tests"), MUTATIONS,
                         ids=[m[0] for m in MUTATIONS])
def test_each_break_finds_its_code_once_and_names_tests_that_exist(what, path, old, new, tests):
    assert (ROOT / path).read_text().count(old) == 1, f"{path} no longer holds the code to break"
    assert old != new and tests
    for test in tests:
        file, _, name = test.partition("::")
        assert name.split("[")[0] in _tests_in(file), test
