"""One constrained tool-call turn: grammar -> sample -> parse -> check, written once.

The rollout's model client and `serving.serve` both sample tool calls through `ToolCallSampler`:
the project's grammar for the tools and tool choice (serving/toolcall/grammar.py), one generation
from token ids through the endpoint's front door, and the calls read from the sampled tokens and
checked against their schemas (serving/toolcall/parser.py). Rendering the prompt stays with the
caller: a session extends its token ids turn by turn, an outside request renders its messages.
"""

from __future__ import annotations

import functools
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from serving.chat import ChatRenderer, chat_renderer
from serving.endpoint import Endpoint
from serving.frontdoor import FrontDoor, Generation, Sampling, open_front_door
from serving.toolcall import MARKUP_TOKENS, ParsedTurn, ToolCallGrammar, build_grammar, parse_glm


@dataclass
class SampledCall:
    """A call as read from the sampled tokens: its arguments as they ran, and what is wrong."""

    name: str
    arguments: dict[str, Any]
    issues: list[str]
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:16]}")

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)

    def openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments_json}}


@dataclass
class ToolTurn:
    generation: Generation
    grammar: ToolCallGrammar | None
    parsed: ParsedTurn
    calls: list[SampledCall]

    @property
    def constraint(self) -> str:
        """What the turn was sampled under, for the record."""
        return self.grammar.description if self.grammar else "none"


@functools.lru_cache(maxsize=256)
def _grammar(tools_json: str, choice_json: str, parallel: bool, thinking: bool,
             max_tokens: int, ids_json: str) -> ToolCallGrammar | None:
    """Built once per tool set and budget; the engine caches its compiled form by its text."""
    return build_grammar(json.loads(tools_json), json.loads(choice_json), parallel, thinking,
                         max_tokens, json.loads(ids_json))


def tool_choice(choice: str) -> str | dict[str, Any]:
    """`auto`, `required`, `none` or a tool's name, as OpenAI spells a tool choice."""
    if choice in ("auto", "required", "none"):
        return choice
    return {"type": "function", "function": {"name": choice}}


class ToolCallSampler:
    """Samples constrained tool-call turns from one endpoint."""

    def __init__(self, endpoint: Endpoint, door: FrontDoor | None = None) -> None:
        self.endpoint = endpoint
        self.door = door or open_front_door(endpoint)
        self.renderer: ChatRenderer = chat_renderer(endpoint.model_dir, endpoint.enable_thinking)

    @property
    def constrainable(self) -> bool:
        """Whether the model has every markup string as one token (the grammar needs them)."""
        return all(m in self.endpoint.markup_token_ids for m in MARKUP_TOKENS)

    def grammar(self, tools: list[dict], choice: str | dict, parallel: bool,
                max_tokens: int) -> ToolCallGrammar | None:
        """CallTooLong if no call fits `max_tokens`; UnsupportedSchema if a schema keyword
        cannot be enforced."""
        return _grammar(json.dumps(tools), json.dumps(choice), parallel,
                        self.endpoint.enable_thinking, max_tokens,
                        json.dumps(self.endpoint.markup_token_ids, sort_keys=True))

    async def sample(self, prompt_ids: list[int], tools: list[dict], choice: str | dict,
                     parallel: bool, sampling: Sampling, session_id: str) -> ToolTurn:
        grammar = self.grammar(tools, choice, parallel, sampling.max_tokens) if tools else None
        gen = await self.door.generate(prompt_ids, sampling, grammar, session_id)
        parsed = parse_glm(self.renderer.token_bytes(gen.token_ids), tools,
                           self.endpoint.enable_thinking)
        calls = [SampledCall(c.name, c.arguments, c.issues) for c in parsed.calls]
        return ToolTurn(gen, grammar, parsed, calls)
