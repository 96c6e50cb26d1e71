"""One model turn: the sampling policy, and how the sampled tokens are read as tool calls.

How a request is spelled for a server is the endpoint's front door, and one constrained turn
(grammar, sample, parse, check) is serving's `ToolCallSampler`; this module decides what to
sample. Tool calls are constrained one of two ways (`SamplingConfig.constraint`):
- `project` (token-in/token-out): the prompt goes as token ids with the project's own grammar,
  and calls are parsed from the sampled tokens. Every call is valid by construction and a call
  is never cut in half.
- `stock` (message-in): the server renders the conversation and applies its own tool grammar and
  parser (vLLM's `glm47`), for comparison. The sampled tokens are parsed too, so calls the
  server's parser dropped are counted. The server re-renders history, so these records are not
  token-in (their prefix breaks are recorded).
"""

from __future__ import annotations

from dataclasses import dataclass

from serving import Endpoint, Sampling, ToolCallSampler, ToolTurn

CONSTRAINTS = ("project", "stock")


@dataclass(frozen=True)
class SamplingConfig:
    """How the job samples: its defaults are the job's (rollout.config.RolloutConfig reads them
    from here) and, for temperature and top_p, the server-side Sampling's."""

    temperature: float = Sampling.temperature
    top_p: float = Sampling.top_p
    tool_choice: str = "required"  # auto | required | none | a tool name
    parallel_tool_calls: bool = False
    constraint: str = "project"  # project | stock


def check_sampling(endpoint: Endpoint, sampling: SamplingConfig) -> None:
    """ValueError if the served model cannot be sampled this way; cheap, so that a job refuses
    before any actor loads a tokenizer."""
    if sampling.constraint not in CONSTRAINTS:
        raise ValueError(f"unknown constraint {sampling.constraint!r}; one of {CONSTRAINTS}")
    if sampling.constraint == "project" and endpoint.missing_markup:
        raise ValueError(f"the served model has no single tokens for {endpoint.missing_markup}: "
                         "the project's tool-call grammar needs them (use "
                         "rollout.tool_constraint=stock)")


class ModelClient:
    def __init__(self, endpoint: Endpoint, sampling: SamplingConfig,
                 sampler: ToolCallSampler | None = None) -> None:
        """`sampler`: how turns are sampled (default: through the endpoint's own front door)."""
        check_sampling(endpoint, sampling)
        self.endpoint = endpoint
        self.sampling = sampling
        self.sampler = sampler or ToolCallSampler(endpoint)
        self.door = self.sampler.door
        self.renderer = self.sampler.renderer

    @property
    def token_in(self) -> bool:
        return self.sampling.constraint == "project"

    def sampling_for(self, max_tokens: int, seed: int,
                     experts_from: int | None = None) -> Sampling:
        return Sampling(max_tokens, self.sampling.temperature, self.sampling.top_p, seed,
                        experts_from)

    async def complete(self, prompt_ids: list[int], messages: list[dict], tools: list[dict],
                       max_tokens: int, seed: int, session_id: str,
                       experts_from: int | None = None,
                       resume: ToolTurn | None = None) -> ToolTurn:
        """One turn: token-in from `prompt_ids` (project), or message-in from `messages`;
        serving's TurnTooLong if no call can finish in `max_tokens` (none is started) or the
        prompt no longer fits the context window. `experts_from`: the first position whose
        MoE routing the engine should return (where it returns any); `resume`: what the turn
        sampled before an update cut it short, to go on from."""
        sampling = self.sampling_for(max_tokens, seed, experts_from)
        choice, parallel = self.sampling.tool_choice, self.sampling.parallel_tool_calls
        if not self.token_in:
            return await self.sampler.sample_stock(messages, tools, choice, parallel, sampling,
                                                   session_id)
        return await self.sampler.sample(prompt_ids, tools, choice, parallel, sampling,
                                         session_id, resume)

    def first_prompt(self, messages: list[dict], tools: list[dict]) -> list[int]:
        return self.renderer.prompt_ids(messages, tools) if self.token_in else []

    def next_prompt(self, prompt_ids: list[int], done: ToolTurn, history: list[dict],
                    new: list[dict], tools: list[dict]) -> list[int]:
        """Token-in: the prompt just sent + what was sampled + the rendered new messages."""
        if not self.token_in:
            return []
        sampled = done.generation.token_ids
        delta = self.renderer.delta_ids(history, new, tools, sampled[-1] if sampled else None)
        return prompt_ids + sampled + delta

    async def release(self, session_id: str) -> None:
        await self.door.release(session_id)
