"""Chat completions against an Endpoint, keeping what the server sampled: token ids, logprobs."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import openai

from serving import Endpoint


class InfraError(RuntimeError):
    """The serving side failed (unreachable, timed out, 5xx): retry the rollout elsewhere."""


class ContextFull(RuntimeError):
    """The conversation no longer fits the model's context window."""


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 1.0
    top_p: float = 1.0
    tool_choice: str = "required"  # auto | required | none | a tool name
    parallel_tool_calls: bool = False


@dataclass
class Completion:
    content: str
    tool_calls: list[dict[str, Any]]  # OpenAI shape: {"id", "type", "function": {name, arguments}}
    finish_reason: str
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    completion_logprobs: list[float]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    latency_s: float
    engine_id: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    def assistant_message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg


class ModelClient:
    def __init__(self, endpoint: Endpoint, sampling: SamplingConfig) -> None:
        self.endpoint = endpoint
        self.sampling = sampling
        self.client = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key,
                                         timeout=endpoint.request_timeout_s, max_retries=0)

    def tool_choice(self) -> Any:
        choice = self.sampling.tool_choice
        if choice in ("auto", "required", "none"):
            return choice
        return {"type": "function", "function": {"name": choice}}

    def constraint(self) -> str:
        """How the tool calls of a turn were constrained, for the record."""
        return (f"tool_choice={self.sampling.tool_choice};strict=true;"
                f"parallel={str(self.sampling.parallel_tool_calls).lower()};grammar=xgrammar")

    async def complete(self, messages: list[dict], tools: list[dict], max_tokens: int,
                       seed: int, session_id: str) -> Completion:
        extra: dict[str, Any] = {
            "chat_template_kwargs": {"enable_thinking": self.endpoint.enable_thinking}}
        if self.endpoint.token_ids == "vllm":
            extra["return_token_ids"] = True
        start = time.perf_counter()
        try:
            resp = await self.client.chat.completions.create(
                model=self.endpoint.model, messages=messages, tools=tools,
                tool_choice=self.tool_choice(),
                parallel_tool_calls=self.sampling.parallel_tool_calls,
                max_tokens=max_tokens, temperature=self.sampling.temperature,
                top_p=self.sampling.top_p, seed=seed, logprobs=True, extra_body=extra,
                extra_headers={"x-session-id": session_id},
            )
        except openai.BadRequestError as exc:
            if "context length" in str(exc) or "maximum context" in str(exc):
                raise ContextFull(str(exc)) from None
            raise
        except (openai.APIConnectionError, openai.APITimeoutError,
                openai.InternalServerError) as exc:
            raise InfraError(f"{type(exc).__name__}: {exc}") from None
        return _completion(resp.model_dump(), time.perf_counter() - start)


def _completion(raw: dict[str, Any], latency_s: float) -> Completion:
    choice = raw["choices"][0]
    msg = choice["message"]
    calls = [{"id": c["id"], "type": "function",
              "function": {"name": c["function"]["name"],
                           "arguments": c["function"]["arguments"]}}
             for c in msg.get("tool_calls") or []]
    usage = raw.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    logprobs = [e["logprob"] for e in ((choice.get("logprobs") or {}).get("content") or [])]
    return Completion(
        content=msg.get("content") or "",
        tool_calls=calls,
        finish_reason=choice.get("finish_reason") or "",
        prompt_token_ids=list(raw.get("prompt_token_ids") or []),
        completion_token_ids=list(choice.get("token_ids") or []),
        completion_logprobs=logprobs,
        prompt_tokens=usage.get("prompt_tokens") or 0,
        completion_tokens=usage.get("completion_tokens") or 0,
        cached_tokens=details.get("cached_tokens") or 0,
        latency_s=latency_s,
        raw={"id": raw.get("id"), "usage": usage},
    )

