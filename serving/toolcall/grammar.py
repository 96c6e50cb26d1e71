"""Tool definitions -> an xgrammar structural tag for GLM tool calls that leaves no slack.

Stock GLM grammars match the markup as strings and allow whitespace between tags; a model with
nothing to say pads there until `max_tokens` and the call is cut in half, and `<tool_call>` can
be spelled from ordinary sub-tokens that the server's parser then ignores. This grammar instead:
- matches every markup element as its single special token (`<tool_call>`, `<arg_key>`, ...),
- allows no characters between them,
- restricts the name to the declared tools and lists the arguments in schema order, each
  optional one omissible, every value by its JSON Schema (serving/toolcall/values.py: complete
  UTF-8 characters only, every bound the schema leaves open set by the project),
- ends with the call: the server then allows only its stop tokens (a stop token cannot be a
  grammar element: xgrammar reserves them for the end),
- leaves free text and reasoning unconstrained except that they cannot contain markup tokens
  and stop early enough (`max_tokens` minus the worst-case call) that a call is never cut.
When the worst-case call does not fit `max_tokens`, the bounds the project sets (and declared
ones larger than them) are halved until it does.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from serving.toolcall.ebnf import UnsupportedSchema
from serving.toolcall.tag_ebnf import structural_tag_ebnf
from serving.toolcall.values import Caps, ValueGrammar, merge_schemas, resolve

CALL_START, CALL_END = "<tool_call>", "</tool_call>"
KEY_START, KEY_END = "<arg_key>", "</arg_key>"
VALUE_START, VALUE_END = "<arg_value>", "</arg_value>"
THINK_END = "</think>"
TURN_END = "<|observation|>"  # the stop token the chat template expects after a call
OTHER_STOPS = ["<|user|>", "<|endoftext|>"]  # stop tokens a call turn must not end with
MARKUP = [CALL_START, CALL_END, KEY_START, KEY_END, VALUE_START, VALUE_END, "<think>", THINK_END]
MARKUP_TOKENS = [*MARKUP, TURN_END]  # each must be one token of the model's vocabulary
SPECIAL_TOKENS = [*MARKUP_TOKENS, *OTHER_STOPS]  # looked up at start-up
MIN_STRING_CAP = 8  # the smallest bound a string is given before a call is refused


class TurnTooLong(ValueError):
    """The turn cannot be sampled within the tokens left to it; `context_full`: the model's
    context window is the bound that is reached (not the caller's token budget)."""

    context_full = False


class CallTooLong(TurnTooLong):
    """The token budget cannot hold one complete call: the call must not be started."""


class _Tokens:
    """Markup strings -> their token ids (the server validates tags without a tokenizer)."""

    def __init__(self, ids: dict[str, int]) -> None:
        missing = [m for m in (*MARKUP, TURN_END) if m not in ids]
        if missing:
            raise ValueError(f"the model's vocabulary lacks single tokens for {missing}")
        self.ids = ids

    def tok(self, text: str) -> dict:
        return {"type": "token", "token": self.ids[text]}

    def all(self, texts: list[str]) -> list[int]:
        return [self.ids[t] for t in texts]


def _const(text: str) -> dict:
    return {"type": "const_string", "value": text}


def _seq(*elements: dict) -> dict:
    items = [e for e in elements if e is not None]
    return items[0] if len(items) == 1 else {"type": "sequence", "elements": items}


@dataclass(frozen=True)
class ToolCallGrammar:
    structural_tag: dict[str, Any]  # {"type": "structural_tag", "format": ...}
    worst_call_tokens: int  # the most tokens one complete call (with its stop token) can take
    description: str  # what was constrained, for the record
    logit_bias: dict[int, float]  # steers the final stop token to TURN_END

    def json(self) -> str:
        return json.dumps(self.structural_tag, sort_keys=True)

    @functools.cached_property
    def ebnf(self) -> str:
        """The same grammar as xgrammar EBNF (token elements included), for front doors that
        take a grammar but not a structural tag (Dynamo's `guided_grammar`)."""
        return structural_tag_ebnf(self.structural_tag)


def tool_parameters(tool: dict) -> dict:
    """A tool's parameter schema, its `$ref`/`allOf` at the top resolved; an object."""
    root = tool["function"].get("parameters") or {"type": "object", "properties": {}}
    params = resolve(root, root)
    for key in ("anyOf", "oneOf"):
        if key in params:
            raise UnsupportedSchema(key, "alternatives at the top of a tool's parameters (GLM "
                                    "writes one key/value pair per argument)")
    for part in params.get("allOf", []):
        rest = {k: v for k, v in params.items() if k != "allOf"}
        params = merge_schemas(rest, resolve(part, root))
    return params


def _call(tool: dict, t: _Tokens, caps: Caps) -> tuple[dict, int]:
    """One complete call of `tool`, from <tool_call> through </tool_call>."""
    fn = tool["function"]
    root = fn.get("parameters") or {}
    params = tool_parameters(tool)
    props = dict(params.get("properties") or {})
    extra = params.get("additionalProperties", True)
    for name in params.get("required") or []:  # required, yet not described: any value
        props.setdefault(name, extra if isinstance(extra, dict) else {})
    required = set(params.get("required") or [])
    elements = [t.tok(CALL_START), _const(fn["name"])]
    worst = 2 + len(fn["name"].encode())
    for key, schema in props.items():
        values = ValueGrammar(root, caps)
        expr, bound = values.argument(schema)
        pair = _seq(t.tok(KEY_START), _const(key), t.tok(KEY_END),
                    {"type": "tag", "begin": t.tok(VALUE_START),
                     "content": {"type": "grammar", "grammar": values.rules.grammar(expr)},
                     "end": t.tok(VALUE_END)})
        elements.append(pair if key in required else {"type": "optional", "content": pair})
        worst += 4 + len(key.encode()) + bound
    elements.append(t.tok(CALL_END))
    return _seq(*elements), worst


def _calls(tools: list[dict], t: _Tokens, max_tokens: int,
           n_calls: int) -> tuple[list[tuple[dict, int]], int]:
    """Each tool's call grammar with the largest bounds under which the worst case of
    `n_calls` calls (with the stop token) fits `max_tokens`, and that worst case."""
    caps = Caps()
    while True:
        calls = [_call(tool, t, caps) for tool in tools]
        worst_one = max(w for _, w in calls) + 1  # + TURN_END
        worst = worst_one + (n_calls - 1) * (worst_one - 1)
        if worst <= max_tokens or caps.string <= MIN_STRING_CAP:
            return calls, worst
        caps = caps.halved()


def build_grammar(tools: list[dict], tool_choice: str | dict, parallel: bool, thinking: bool,
                  max_tokens: int, token_ids: dict[str, int],
                  max_calls: int = 4) -> ToolCallGrammar | None:
    """The structural tag for one request; None for `tool_choice="none"` (no constraint).

    `token_ids` maps each markup string (MARKUP and TURN_END) to its single token id.
    """
    if tool_choice == "none" or not tools:
        return None
    t = _Tokens(token_ids)
    if isinstance(tool_choice, dict):
        wanted = tool_choice["function"]["name"]
        tools = [t for t in tools if t["function"]["name"] == wanted]
        if not tools:
            raise ValueError(f"tool_choice names {wanted!r}, which is not among the tools")
    n_calls = max_calls if parallel else 1
    calls, worst = _calls(tools, t, max_tokens, n_calls)
    one_call = calls[0][0] if len(calls) == 1 else {"type": "or", "elements": [c for c, _ in calls]}
    text_budget = max_tokens - worst
    if text_budget < 0:
        raise CallTooLong(f"max_tokens={max_tokens} cannot hold one complete call "
                         f"(worst case {worst} tokens); raise the turn's token budget")
    calls_then_end = ({"type": "repeat", "min": 1, "max": n_calls, "content": one_call}
                      if n_calls > 1 else one_call)
    reasoning_budget = text_budget // 2 if thinking and tool_choice == "auto" else text_budget
    free_text = {"type": "any_tokens", "exclude_tokens": t.all([*MARKUP, TURN_END]),
                 "max_tokens": text_budget - reasoning_budget if thinking else text_budget}
    if tool_choice == "auto":
        body = {"type": "or", "elements": [
            _seq(free_text, calls_then_end), {**free_text, "exclude_tokens": t.all(MARKUP)}]}
    else:  # required, or one named tool: the answer is the call(s)
        body = calls_then_end
    if thinking:  # the prompt ends with <think>: reasoning, then </think>, then the answer
        reasoning = {**free_text, "max_tokens": reasoning_budget}
        body = _seq(reasoning, t.tok(THINK_END), body)
    named = f"named:{tools[0]['function']['name']}"
    choice = tool_choice if isinstance(tool_choice, str) else named
    description = (f"rollfleet-glm:tool_choice={choice};parallel={str(parallel).lower()};"
                   f"thinking={str(thinking).lower()};worst_call_tokens={worst}")
    # When the answer is always a call, its turn must end with <|observation|>, never with the
    # other stop tokens (the next prompt renders <|observation|> after a call).
    bias = ({} if tool_choice == "auto" else
            {token_ids[s]: -100.0 for s in OTHER_STOPS if s in token_ids})
    return ToolCallGrammar({"type": "structural_tag", "format": body}, worst, description, bias)
