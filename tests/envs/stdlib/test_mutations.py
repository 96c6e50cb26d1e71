"""Mutation operators: what they propose, and that every edit reverses byte for byte."""

from __future__ import annotations

import ast

import pytest

from envs.stdlib.mutations import Mutation, MutationError
from envs.stdlib.operators import OPERATORS, find_mutations
from envs.stdlib.source import read_exact, stdlib_dir

SNIPPET = '''\
X = 1 < 2  # module level: never mutated


def f(a, b, items):
    """Docstring stays."""
    name = "é"  # a non-ASCII line before an edit on the same line: é < a
    if name < a and b:
        total = min(a, b) + 1
        items.append(total)
    return items[0:2], range(3), a.startswith("x"), True
'''


def _edits(text: str) -> set[tuple[str, str, str]]:
    return {(m.op, m.original, m.replacement) for m in find_mutations(text)}


def test_each_operator_proposes_its_edit():
    edits = _edits(SNIPPET)
    for expected in [("flip_comparison", "<", "<="), ("swap_boolean", "and", "or"),
                     ("swap_function", "min", "max"), ("swap_arguments", "a, b", "b, a"),
                     ("swap_operator", "+", "-"), ("off_by_one", "1", "2"),
                     ("off_by_one", "2", "1"), ("off_by_one", "3", "4"),
                     ("swap_function", "startswith", "endswith"),
                     ("wrong_constant", "True", "False"),
                     ("invert_condition", "name < a and b", "not (name < a and b)"),
                     ("drop_statement", "        items.append(total)\n", "")]:
        assert expected in edits, expected
    assert {op for op, _, _ in edits} == set(OPERATORS)


def test_module_level_code_and_docstrings_are_left_alone():
    for m in find_mutations(SNIPPET):
        assert m.start[0] >= 4, m
        assert "Docstring" not in m.original


def test_spans_count_characters_not_utf8_bytes():
    line = SNIPPET.splitlines()[6]
    (m,) = [m for m in find_mutations(SNIPPET) if m.op == "flip_comparison"]
    assert m.start == (7, line.index("<")) and m.end == (7, line.index("<") + 1)
    assert m.apply(SNIPPET).splitlines()[6] == line.replace("<", "<=", 1)


@pytest.mark.parametrize("module", ["textwrap", "fractions", "shlex"])
def test_every_mutation_round_trips_and_parses(module):
    text = read_exact(stdlib_dir() / f"{module}.py")
    mutations = find_mutations(text)
    assert len(mutations) > 100
    for m in mutations:
        mutant = m.apply(text)
        assert mutant != text
        assert m.revert(mutant) == text
        ast.parse(mutant)


def test_apply_and_revert_refuse_a_span_that_does_not_match():
    m = Mutation("flip_comparison", (2, 5), (2, 6), "<", "<=")
    text = "x = 1\nif a < b:\n    pass\n"
    assert m.revert(m.apply(text)) == text
    with pytest.raises(MutationError, match="expected '<'"):
        m.apply(text.replace("<", ">"))
    with pytest.raises(MutationError, match="expected '<='"):
        m.revert(text)
    with pytest.raises(MutationError, match="past the end"):
        Mutation("flip_comparison", (9, 0), (9, 1), "<", "<=").apply(text)


def test_json_round_trip():
    m = Mutation("drop_statement", (3, 0), (4, 0), "    y()\n", "")
    assert Mutation.from_json(m.to_json()) == m
    with pytest.raises(ValueError):
        Mutation.from_json({**m.to_json(), "start": [0, 1]})
