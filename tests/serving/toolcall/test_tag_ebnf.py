"""The EBNF written for Dynamo's `guided_grammar` is the grammar xgrammar makes of the same
structural tag, rule for rule: both parsed and printed by xgrammar are the same text, for the
project's own tools and the conformance set's 40-odd, every tool choice, parallel or not,
thinking or not, at budgets that shrink the bounds."""

import json
import re
from pathlib import Path

import pytest
import xgrammar as xgr

from envs.tools import tool_schemas
from serving.toolcall import build_grammar
from serving.toolcall.tag_ebnf import _LEXEME, structural_tag_ebnf

TOOLSETS = sorted((Path(__file__).parents[1] / "data" / "toolsets").glob("*.json"))


def _toolsets() -> list[tuple[str, list[dict]]]:
    sets = [("project", tool_schemas(max_command_chars=4000, max_file_chars=20000))]
    return sets + [(p.stem, json.loads(p.read_text())["tools"]) for p in TOOLSETS]


@pytest.mark.parametrize(("name", "tools"), _toolsets(), ids=lambda v: v if isinstance(v, str)
                         else "")
def test_the_ebnf_is_xgrammars_grammar_of_the_tag(name, tools, token_ids):
    choices = ["auto", "required", *({"type": "function", "function": {
        "name": t["function"]["name"]}} for t in tools)]
    checked = 0
    for choice in choices:
        for parallel, thinking, budget in ((False, False, 4096), (True, True, 4096),
                                           (True, False, 384), (False, True, 200)):
            try:
                grammar = build_grammar(tools, choice, parallel, thinking, budget, token_ids)
            except ValueError:  # a budget that cannot hold the call: nothing to send
                continue
            ours = structural_tag_ebnf(grammar.structural_tag)
            theirs = str(xgr.Grammar.from_structural_tag(grammar.json()))
            assert _canonical(str(xgr.Grammar.from_ebnf(ours))) == _canonical(theirs), (
                name, choice)
            checked += 1
    assert checked >= len(choices)


def _canonical(grammar: str) -> list[str]:
    """The grammar's rules in the order a walk from the root first meets them, each named by
    that place, ExcludeToken's ids in one order.

    Names and order aside, the two are the same rules: the helper rules xgrammar's EBNF parser
    makes (for a repeated group) are named after the rule they occur in, which an embedded
    grammar's root is renamed from (`root_1_1` against `root_4_1`), and listed where each
    parse put them. The excluded ids are a set: the parser sorts them, the tag conversion keeps
    their order."""
    rules = {}
    for line in grammar.splitlines():
        head, body = line.split(" ::= ", 1)
        name, _, attrs = head.partition("[")
        rules[name] = (attrs, body)
    place: dict[str, str] = {}
    order = ["root"]
    while len(place) < len(order):
        name = order[len(place)]
        place[name] = f"R{len(place)}"
        for m in _LEXEME.finditer(rules[name][1]):
            if m.group(0) in rules and m.group(0) not in order:
                order.append(m.group(0))
    out = []
    for name in order:
        attrs, body = rules[name]
        body = _LEXEME.sub(lambda m: place.get(m.group(0), m.group(0)), body)
        body = re.sub(r"ExcludeToken\(([\d, ]+)\)", lambda m: "ExcludeToken({})".format(
            ", ".join(sorted(m.group(1).split(", "), key=int))), body)
        out.append(f"{place[name]}{'[' + attrs if attrs else ''} ::= {body}")
    return out


def test_an_element_it_cannot_write_is_refused():
    with pytest.raises(ValueError, match="no EBNF for a structural tag element"):
        structural_tag_ebnf({"type": "structural_tag", "format": {"type": "any_text"}})
