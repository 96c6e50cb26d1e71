"""One model turn: the sampling policy, and how the sampled tokens are read as tool calls.

How a request is spelled for a server is the endpoint's front door (serving.frontdoor); this
module decides what to sample and reads the answer. Tool calls are constrained one of two ways
(`SamplingConfig.constraint`):
- `project` (token-in/token-out): the prompt goes as token ids with the project's own grammar
  (serving.toolcall), and calls are parsed here from the sampled tokens. Every call is valid by
  construction and a call is never cut in half.
- `stock` (message-in): the server renders the conversation and applies its own tool grammar and
  parser (vLLM's `glm47`), for comparison. The sampled tokens are parsed here too, so calls the
  server's parser dropped are counted. The server re-renders history, so these records are not
  token-in (their prefix breaks are recorded).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from serving import (
    MARKUP_TOKENS,
    CallTooLong,
    Endpoint,
    FrontDoor,
    Generation,
    Sampling,
    ToolCallSampler,
    check_call,
    parse_glm,
    tool_choice,
)

CONSTRAINTS = ("project", "stock")


class CallBudgetExhausted(RuntimeError):
    """The remaining tokens cannot hold one complete tool call, so none is started."""


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 1.0
    top_p: float = 1.0
    tool_choice: str = "required"  # auto | required | none | a tool name
    parallel_tool_calls: bool = False
    constraint: str = "project"  # project | stock


@dataclass
class Call:
    """A tool call as sampled: its arguments as read from the tokens, and what is wrong."""

    id: str
    name: str
    arguments: str  # JSON object
    issues: list[str] = field(default_factory=list)

    def openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class Completion:
    generation: Generation
    sampling: Sampling
    constraint: str  # the grammar the turn was sampled under
    content: str  # what the assistant said, markup and the turn-end token left out
    reasoning: str
    calls: list[Call]
    turn_issues: list[str]  # cut_off, subtoken_markup outside any call
    dropped_calls: int = 0  # calls in the sampled tokens the server's parser did not return

    def assistant_message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning:
            msg["reasoning_content"] = self.reasoning
        if self.calls:
            msg["tool_calls"] = [c.openai() for c in self.calls]
        return msg


def check_sampling(endpoint: Endpoint, sampling: SamplingConfig) -> None:
    """ValueError if the served model cannot be sampled this way; cheap, so that a job refuses
    before any actor loads a tokenizer."""
    if sampling.constraint not in CONSTRAINTS:
        raise ValueError(f"unknown constraint {sampling.constraint!r}; one of {CONSTRAINTS}")
    missing = [m for m in MARKUP_TOKENS if m not in endpoint.markup_token_ids]
    if sampling.constraint == "project" and missing:
        raise ValueError(f"the served model has no single tokens for {missing}: the project's "
                         "tool-call grammar needs them (use rollout.tool_constraint=stock)")


class ModelClient:
    def __init__(self, endpoint: Endpoint, sampling: SamplingConfig,
                 door: FrontDoor | None = None) -> None:
        """`door`: the front door to send through (default: the endpoint's own)."""
        check_sampling(endpoint, sampling)
        self.endpoint = endpoint
        self.sampling = sampling
        self.sampler = ToolCallSampler(endpoint, door)
        self.door = self.sampler.door
        self.renderer = self.sampler.renderer

    @property
    def token_in(self) -> bool:
        return self.sampling.constraint == "project"

    def tool_choice(self) -> Any:
        return tool_choice(self.sampling.tool_choice)

    def sampling_for(self, max_tokens: int, seed: int) -> Sampling:
        return Sampling(max_tokens, self.sampling.temperature, self.sampling.top_p, seed)

    async def complete(self, prompt_ids: list[int], messages: list[dict], tools: list[dict],
                       max_tokens: int, seed: int, session_id: str) -> Completion:
        """One turn: token-in from `prompt_ids` (project), or message-in from `messages`."""
        sampling = self.sampling_for(max_tokens, seed)
        if not self.token_in:
            return await self._stock(messages, tools, sampling, session_id)
        try:
            turn = await self.sampler.sample(prompt_ids, tools, self.tool_choice(),
                                             self.sampling.parallel_tool_calls, sampling,
                                             session_id)
        except CallTooLong as exc:  # a call that could not finish is never started
            raise CallBudgetExhausted(str(exc)) from None
        calls = [Call(c.id, c.name, c.arguments_json, c.issues) for c in turn.calls]
        return Completion(turn.generation, sampling, turn.constraint, turn.parsed.content,
                          turn.parsed.reasoning, calls, turn.parsed.issues)

    async def _stock(self, messages: list[dict], tools: list[dict], sampling: Sampling,
                     session_id: str) -> Completion:
        """The server's calls are what the agent gets; the sampled tokens tell what its parser
        dropped and whether the turn ended inside a call."""
        choice, parallel = self.tool_choice(), self.sampling.parallel_tool_calls
        gen = await self.door.chat(messages, tools, choice, parallel, sampling, session_id)
        parsed = parse_glm(self.renderer.token_bytes(gen.token_ids), tools,
                           self.endpoint.enable_thinking)
        calls = [Call(c["id"], c["function"]["name"], c["function"]["arguments"],
                      check_call(c["function"]["name"], c["function"]["arguments"], tools))
                 for c in gen.tool_calls]
        issues = list(parsed.issues)
        if any("cut_off" in c.issues for c in parsed.calls):
            issues.append("cut_off")
        constraint = (f"stock:tool_choice={self.sampling.tool_choice};strict=true;"
                      f"parallel={str(parallel).lower()}")
        return Completion(gen, sampling, constraint, gen.content, "", calls, issues,
                          dropped_calls=max(0, len(parsed.calls) - len(gen.tool_calls)))

    def first_prompt(self, messages: list[dict], tools: list[dict]) -> list[int]:
        return self.renderer.prompt_ids(messages, tools) if self.token_in else []

    def next_prompt(self, prompt_ids: list[int], done: Completion, history: list[dict],
                    new: list[dict], tools: list[dict]) -> list[int]:
        """Token-in: the prompt just sent + what was sampled + the rendered new messages."""
        if not self.token_in:
            return []
        sampled = done.generation.token_ids
        delta = self.renderer.delta_ids(history, new, tools, sampled[-1] if sampled else None)
        return prompt_ids + sampled + delta

    async def release(self, session_id: str) -> None:
        await self.door.release(session_id)
