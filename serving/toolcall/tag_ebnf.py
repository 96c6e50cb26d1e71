"""A structural tag as xgrammar EBNF, for front doors that take a grammar but not a tag
(Dynamo's `guided_grammar`), written here rather than by `xgrammar.Grammar.from_structural_tag`:
the xgrammar package imports torch and transformers as it loads, 2.7 s of each rollout actor's
CPU (measured here), for a conversion this module does in microseconds.

The rules are the ones xgrammar makes of the tag, under the same names: one rule per element,
written after the elements it holds; an element that occurs again (equal content) is the same
rule (but for an `any_tokens`' inner rule, each its own); a rule is named by its element's
type, `_1`, `_2`, ... when the name is taken; an embedded grammar's rules keep theirs (its root
becomes `root_0`, `root_1`, ...).
tests/serving/toolcall/test_tag_ebnf.py holds xgrammar's grammar and this one equal, rule for
rule, on every tool set the project's environments declare.
"""

from __future__ import annotations

import re
from typing import Any

from serving.toolcall.ebnf import literal

# a string literal, a character class, or a name (a rule's, or Token/ExcludeToken)
_LEXEME = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|[A-Za-z_][A-Za-z0-9_]*')


def structural_tag_ebnf(tag: dict[str, Any]) -> str:
    """`tag` ({"type": "structural_tag", "format": ...}) as EBNF."""
    writer = _Writer()
    top = writer.element(tag["format"])
    return "\n".join([*writer.lines, f"root ::= {top}"]) + "\n"


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.taken: set[str] = {"root"}
        self.counts: dict[str, int] = {}
        self.written: dict[tuple, str] = {}  # (type, content with its elements' rules) -> rule

    def name(self, base: str) -> str:
        if base not in self.taken:
            self.taken.add(base)
            self.counts[base] = 1
            return base
        k = self.counts.get(base, 0)
        while f"{base}_{k}" in self.taken:
            k += 1
        self.counts[base] = k + 1
        self.taken.add(f"{base}_{k}")
        return f"{base}_{k}"

    def rule(self, base: str, body: str) -> str:
        """The rule `base ::= body`; the one written before if an equal element was."""
        if (base, body) not in self.written:
            name = self.written[base, body] = self.name(base)
            self.lines.append(f"{name} ::= {body}")
        return self.written[base, body]

    def element(self, node: dict[str, Any]) -> str:
        kind = node["type"]
        if kind == "const_string":
            return self.rule(kind, literal(node["value"]))
        if kind == "token":
            return self.rule(kind, f"Token({node['token']})")
        if kind == "sequence":
            return self.rule(kind, " ".join(self.element(e) for e in node["elements"]))
        if kind == "or":
            return self.rule(kind, " | ".join(self.element(e) for e in node["elements"]))
        if kind == "optional":
            return self.rule(kind, f'"" | {self.element(node["content"])}')
        if kind == "repeat":
            content = self.element(node["content"])
            return self.rule(kind, f"{content}{{{node['min']}, {node['max']}}}")
        if kind == "tag":
            begin, end = self._inline(node["begin"]), self._inline(node["end"])
            return self.rule(kind, f"{begin} {self.element(node['content'])} {end}")
        if kind == "grammar":
            key = (kind, node["grammar"])
            if key not in self.written:
                self.written[key] = self._embed(node["grammar"])
            return self.written[key]
        if kind == "any_tokens" and node.get("exclude_tokens"):
            key = (kind, tuple(node["exclude_tokens"]), node["max_tokens"])
            if key not in self.written:  # its inner rule is its own, even where equal
                excluded = ", ".join(str(t) for t in node["exclude_tokens"])
                inner = self.name("any_tokens_inner")
                self.lines.append(f"{inner} ::= ExcludeToken({excluded})")
                name = self.written[key] = self.name("any_tokens")
                self.lines.append(f'{name}[max_tokens={node["max_tokens"]}] ::= "" | '
                                  f"({inner} {name})")
            return self.written[key]
        raise ValueError(f"no EBNF for a structural tag element {node!r}")

    def _inline(self, node: dict[str, Any]) -> str:
        """A tag's begin or end, written in the tag's own rule."""
        if node["type"] == "token":
            return f"Token({node['token']})"
        if node["type"] == "const_string":
            return literal(node["value"])
        raise ValueError(f"no EBNF for a tag's begin or end {node!r}")

    def _embed(self, grammar: str) -> str:
        """A grammar's rules, renamed where taken; its root's new name."""
        rules = [line.split(" ::= ", 1) for line in grammar.splitlines() if line.strip()]
        renamed = {name: self.name(name) for name, _ in rules}
        for name, body in rules:
            body = _LEXEME.sub(lambda m: renamed.get(m.group(0), m.group(0)), body)
            self.lines.append(f"{renamed[name]} ::= {body}")
        return renamed["root"]
