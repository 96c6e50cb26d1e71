"""Tool-call integrity: grammars that make every sampled call valid, and a parser that counts."""

from serving.toolcall.ebnf import UnsupportedSchema
from serving.toolcall.grammar import (
    MARKUP_TOKENS,
    SPECIAL_TOKENS,
    CallTooLong,
    ToolCallGrammar,
    TurnTooLong,
    build_grammar,
)
from serving.toolcall.parser import ISSUE_KINDS, ParsedCall, ParsedTurn, check_call, parse_glm

__all__ = [
    "ISSUE_KINDS", "MARKUP_TOKENS", "SPECIAL_TOKENS", "CallTooLong", "ParsedCall", "ParsedTurn",
    "ToolCallGrammar", "TurnTooLong", "UnsupportedSchema", "build_grammar", "check_call",
    "parse_glm",
]
