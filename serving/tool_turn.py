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
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from serving.chat import ChatRenderer, chat_renderer
from serving.endpoint import Endpoint
from serving.frontdoor import FrontDoor, Generation, Sampling, open_front_door
from serving.toolcall import ISSUE_KINDS, ToolCallGrammar, build_grammar, check_call, parse_glm


@dataclass
class SampledCall:
    """A tool call as it ran: its arguments (a JSON object), and what is wrong with it."""

    name: str
    arguments: str  # JSON object
    issues: list[str] = field(default_factory=list)
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:16]}")

    def openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class ToolTurn:
    """One sampled turn: what the server sampled and how it reads."""

    ISSUE_KINDS: ClassVar[tuple[str, ...]] = ISSUE_KINDS  # what its and its calls' issues name
    generation: Generation
    sampling: Sampling
    constraint: str  # what it was sampled under, for the record
    content: str  # what the assistant said, markup and the turn-end token left out
    reasoning: str
    calls: list[SampledCall]
    issues: list[str]  # turn-level: cut_off, subtoken_markup outside any call
    dropped_calls: int = 0  # calls in the sampled tokens the server's parser did not return
    # the grammar the engine masked every sampled token with (xgrammar EBNF; "" when none or
    # the server's own) and the logit bias the server applied beside it: a trainer replays the
    # masks from these (serving/toolcall/replay.py)
    grammar: str = ""
    logit_bias: dict[int, float] = field(default_factory=dict)

    def assistant_message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning:
            msg["reasoning_content"] = self.reasoning
        if self.calls:
            msg["tool_calls"] = [c.openai() for c in self.calls]
        return msg


def joined(first: Generation, then: Generation) -> Generation:
    """A turn sampled in two requests as one generation: the first one's prompt, both parts'
    tokens and logprobs in order; the engines, cache hits, finish reason and MoE routing (which
    covers the whole turn again) of the last. If the server ran the second request on another
    prompt than the first's and its tokens, that prompt stands (the session sees the break)."""
    extends = then.prompt_token_ids == [*first.prompt_token_ids, *first.token_ids]
    return replace(then, prompt_token_ids=first.prompt_token_ids if extends
                   else then.prompt_token_ids,
                   token_ids=[*first.token_ids, *then.token_ids],
                   logprobs=[*first.logprobs, *then.logprobs],
                   latency_s=first.latency_s + then.latency_s,
                   cached_tokens=then.cached_tokens)


@functools.lru_cache(maxsize=256)
def _grammar(tools_json: str, choice_json: str, parallel: bool, thinking: bool,
             max_tokens: int, ids_json: str) -> ToolCallGrammar | None:
    """Built once per tool set and budget; the engine caches its compiled form by its text."""
    return build_grammar(json.loads(tools_json), json.loads(choice_json), parallel, thinking,
                         max_tokens, json.loads(ids_json))


def tool_choice(choice: str | dict) -> str | dict[str, Any]:
    """`auto`, `required`, `none` or a tool's name, as OpenAI spells a tool choice."""
    if isinstance(choice, dict) or choice in ("auto", "required", "none"):
        return choice
    return {"type": "function", "function": {"name": choice}}


class ToolCallSampler:
    """Samples constrained tool-call turns from one endpoint."""

    def __init__(self, endpoint: Endpoint, door: FrontDoor | None = None) -> None:
        self.endpoint = endpoint
        self.door = door or open_front_door(endpoint)
        self.renderer: ChatRenderer = chat_renderer(endpoint.model_dir, endpoint.enable_thinking)

    def grammar(self, tools: list[dict], choice: str | dict, parallel: bool,
                max_tokens: int) -> ToolCallGrammar | None:
        """CallTooLong if no call fits `max_tokens`; UnsupportedSchema if a schema keyword
        cannot be enforced."""
        return _grammar(json.dumps(tools), json.dumps(choice), parallel,
                        self.endpoint.enable_thinking, max_tokens,
                        json.dumps(self.endpoint.markup_token_ids, sort_keys=True))

    async def sample(self, prompt_ids: list[int], tools: list[dict], choice: str | dict,
                     parallel: bool, sampling: Sampling, session_id: str,
                     resume: ToolTurn | None = None) -> ToolTurn:
        """A token-in turn under the project's grammar; calls read from the sampled tokens.
        `choice`: auto, required, none, a tool's name, or OpenAI's named-tool object.
        `resume`: the turn as sampled before something cut it short (an update,
        `rollout.update_mode=continue`): it goes on from there, its tokens so far prefilled
        again and its grammar started after them, within the turn's budget; the turn returned
        holds every token, the earlier ones first."""
        choice = tool_choice(choice)
        grammar = self.grammar(tools, choice, parallel, sampling.max_tokens) if tools else None
        if resume is None:
            gen = await self.door.generate(prompt_ids, sampling, grammar, session_id)
        else:
            so_far = list(resume.generation.token_ids)
            rest = replace(sampling, max_tokens=sampling.max_tokens - len(so_far))
            gen = joined(resume.generation, await self.door.generate(
                prompt_ids + so_far, rest, grammar, session_id, resume=so_far))
        parsed = parse_glm(self.renderer.token_bytes(gen.token_ids), tools,
                           self.endpoint.enable_thinking)
        calls = [SampledCall(c.name, json.dumps(c.arguments, ensure_ascii=False), c.issues)
                 for c in parsed.calls]
        return ToolTurn(gen, sampling, grammar.description if grammar else "none",
                        parsed.content, parsed.reasoning, calls, parsed.issues,
                        grammar=grammar.ebnf if grammar else "",
                        logit_bias=self.door.logit_bias(grammar))

    async def sample_stock(self, messages: list[dict], tools: list[dict], choice: str | dict,
                           parallel: bool, sampling: Sampling, session_id: str) -> ToolTurn:
        """A message-in turn under the server's own tool grammar and parser, for comparison:
        its calls are what the agent gets; the sampled tokens tell what its parser dropped and
        whether the turn ended inside a call."""
        choice = tool_choice(choice)
        gen = await self.door.chat(messages, tools, choice, parallel, sampling, session_id)
        parsed = parse_glm(self.renderer.token_bytes(gen.token_ids), tools,
                           self.endpoint.enable_thinking)
        calls = [SampledCall(c["function"]["name"], c["function"]["arguments"],
                             check_call(c["function"]["name"], c["function"]["arguments"],
                                        tools), c["id"])
                 for c in gen.tool_calls]
        issues = list(parsed.issues)
        if any("cut_off" in c.issues for c in parsed.calls):
            issues.append("cut_off")
        named = choice if isinstance(choice, str) else choice["function"]["name"]
        constraint = (f"stock:tool_choice={named};strict=true;"
                      f"parallel={str(parallel).lower()}")
        return ToolTurn(gen, sampling, constraint, gen.content, "", calls, issues,
                        dropped_calls=max(0, len(parsed.calls) - len(gen.tool_calls)))
