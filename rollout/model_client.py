"""Chat completions against an Endpoint, keeping what the server sampled: token ids, logprobs.

Tool calls are constrained one of two ways (`SamplingConfig.constraint`):
- `project`: the request carries the tools (for the chat template) with `tool_choice="none"` and
  the project's own structural tag (serving.toolcall), and the calls are parsed here from the
  sampled tokens. Every call is valid by construction and a call is never cut in half.
- `stock`: the server's own tool grammar and parser (vLLM's `glm47`), for comparison; the
  sampled tokens are parsed here too, so calls the server's parser dropped are counted.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai

from serving import (
    MARKUP_TOKENS,
    CallTooLong,
    Endpoint,
    TokenBytes,
    ToolCallGrammar,
    build_grammar,
    check_call,
    parse_glm,
)

SESSION_HEADER = "x-dynamo-session-id"  # Dynamo's router reads it; vLLM ignores it
DYNAMO_FIELDS = ("worker_id", "prompt_token_ids", "completion_token_ids", "timing")


class InfraError(RuntimeError):
    """The serving side failed (unreachable, timed out, 5xx): retry the rollout elsewhere."""


class ContextFull(RuntimeError):
    """The conversation no longer fits the model's context window."""


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
    prefill_engine_id: str = ""
    reasoning: str = ""
    constraint: str = ""
    call_issues: list[list[str]] = field(default_factory=list)  # per tool call
    turn_issues: list[str] = field(default_factory=list)
    dropped_calls: int = 0  # calls in the sampled text that the server's parser did not return

    def assistant_message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning:
            msg["reasoning_content"] = self.reasoning
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg


@functools.lru_cache(maxsize=256)
def _grammar(tools_json: str, choice_json: str, parallel: bool, thinking: bool,
             max_tokens: int, ids_json: str) -> ToolCallGrammar | None:
    """Built once per tool set and budget; the server caches its compiled form by the same key."""
    return build_grammar(json.loads(tools_json), json.loads(choice_json), parallel, thinking,
                         max_tokens, json.loads(ids_json))


@functools.lru_cache(maxsize=4)
def _token_bytes(path: str) -> TokenBytes:
    return TokenBytes(Path(path))


class ModelClient:
    def __init__(self, endpoint: Endpoint, sampling: SamplingConfig) -> None:
        if sampling.constraint not in ("project", "stock"):
            raise ValueError(f"unknown constraint {sampling.constraint!r}; project or stock")
        missing = [m for m in MARKUP_TOKENS if m not in endpoint.markup_token_ids]
        if sampling.constraint == "project" and missing:
            raise ValueError(f"the served model has no single tokens for {missing}: the project's "
                             "tool-call grammar needs them (use rollout.tool_constraint=stock)")
        self.endpoint = endpoint
        self.sampling = sampling
        self.client = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key,
                                         timeout=endpoint.request_timeout_s, max_retries=0)

    def tool_choice(self) -> Any:
        choice = self.sampling.tool_choice
        if choice in ("auto", "required", "none"):
            return choice
        return {"type": "function", "function": {"name": choice}}

    def grammar(self, tools: list[dict], max_tokens: int) -> ToolCallGrammar | None:
        """The project's constraint for this turn; CallBudgetExhausted if no call fits."""
        if self.sampling.constraint != "project":
            return None
        try:
            return _grammar(json.dumps(tools), json.dumps(self.tool_choice()),
                            self.sampling.parallel_tool_calls, self.endpoint.enable_thinking,
                            max_tokens, json.dumps(self.endpoint.markup_token_ids, sort_keys=True))
        except CallTooLong as exc:
            raise CallBudgetExhausted(str(exc)) from None

    async def complete(self, messages: list[dict], tools: list[dict], max_tokens: int,
                       seed: int, session_id: str) -> Completion:
        grammar = self.grammar(tools, max_tokens) if tools else None
        extra: dict[str, Any] = {
            "chat_template_kwargs": {"enable_thinking": self.endpoint.enable_thinking}}
        dynamo = self.endpoint.token_ids == "dynamo"
        if self.endpoint.token_ids == "vllm":
            extra["return_token_ids"] = True
        if dynamo:
            extra["nvext"] = {"extra_fields": list(DYNAMO_FIELDS)}
        if grammar is not None and dynamo:
            # Dynamo's frontend takes a grammar but no structural tag, and drops logit_bias.
            extra["guided_grammar"] = grammar.ebnf
            choice, parallel = "none", False
            constraint = grammar.description
        elif grammar is not None:
            extra["structured_outputs"] = {"structural_tag": grammar.json()}
            if grammar.logit_bias:
                extra["logit_bias"] = {str(k): v for k, v in grammar.logit_bias.items()}
            choice, parallel = "none", False
            constraint = grammar.description
        else:
            choice, parallel = self.tool_choice(), self.sampling.parallel_tool_calls
            constraint = (f"stock:tool_choice={self.sampling.tool_choice};strict=true;"
                          f"parallel={str(parallel).lower()}")
        start = time.perf_counter()
        try:
            resp = await self.client.chat.completions.create(
                model=self.endpoint.model, messages=messages, tools=tools or openai.NOT_GIVEN,
                tool_choice=choice if tools else openai.NOT_GIVEN,
                parallel_tool_calls=parallel if tools else openai.NOT_GIVEN,
                max_tokens=max_tokens, temperature=self.sampling.temperature,
                top_p=self.sampling.top_p, seed=seed, logprobs=True, extra_body=extra,
                extra_headers={SESSION_HEADER: session_id},
            )
        except openai.BadRequestError as exc:
            if "context length" in str(exc) or "maximum context" in str(exc):
                raise ContextFull(str(exc)) from None
            raise InfraError(f"request rejected: {exc}") from None
        except openai.OpenAIError as exc:
            # Unreachable, timed out, 5xx, or a front door that lost the model's engines (404):
            # the serving side failed, never the rollout.
            raise InfraError(f"{type(exc).__name__}: {exc}") from None
        raw = resp.model_dump()
        done = _completion(raw, time.perf_counter() - start)
        if dynamo:
            self._read_nvext(done, raw.get("nvext") or {})
        done.constraint = constraint
        self._read_calls(done, raw, tools, own_parse=grammar is not None)
        return done

    def _read_nvext(self, done: Completion, nvext: dict[str, Any]) -> None:
        """Token ids and the serving engines, as Dynamo's frontend reports them."""
        done.prompt_token_ids = list(nvext.get("prompt_token_ids") or [])
        done.completion_token_ids = list(nvext.get("completion_token_ids") or [])
        workers = nvext.get("worker_id") or {}
        names = self.endpoint.engine_names
        for key, attr in (("decode_worker_id", "engine_id"),
                          ("prefill_worker_id", "prefill_engine_id")):
            if workers.get(key) is not None:
                hex_id = f"{int(workers[key]):x}"
                setattr(done, attr, names.get(hex_id, hex_id))

    async def release(self, session_id: str) -> None:
        """Tell the router the session is over, so its engine binding is dropped now rather
        than after the idle TTL (a one-token request marked final; errors are not fatal)."""
        if self.endpoint.token_ids != "dynamo":
            return
        with contextlib.suppress(openai.OpenAIError):
            await self.client.completions.create(
                model=self.endpoint.model, prompt="end", max_tokens=1,
                extra_headers={SESSION_HEADER: session_id, "x-dynamo-session-final": "true"})

    def _read_calls(self, done: Completion, raw: dict, tools: list[dict], own_parse: bool) -> None:
        if self.endpoint.token_ids == "dynamo" and self.endpoint.tokenizer_path:
            # Dynamo reports each token's bytes after a lossy decode: use the sampled ids.
            table = _token_bytes(self.endpoint.tokenizer_path)
            pieces = [table[i] for i in done.completion_token_ids]
        else:
            entries = (raw["choices"][0].get("logprobs") or {}).get("content") or []
            pieces = [bytes(e["bytes"]) if e.get("bytes") is not None else e["token"].encode()
                      for e in entries]
        parsed = parse_glm(pieces, tools, self.endpoint.enable_thinking)
        done.turn_issues = parsed.issues
        if own_parse:
            done.content, done.reasoning = parsed.content, parsed.reasoning
            done.tool_calls = [{"id": f"call_{uuid.uuid4().hex[:16]}", "type": "function",
                                "function": {"name": c.name,
                                             "arguments": json.dumps(c.arguments)}}
                               for c in parsed.calls]
            done.call_issues = [c.issues for c in parsed.calls]
            return
        # Stock: the server's calls are what the agent gets; the sampled tokens tell what its
        # parser dropped and whether the turn ended inside a call.
        done.dropped_calls = max(0, len(parsed.calls) - len(done.tool_calls))
        done.call_issues = [check_call(c["function"]["name"], c["function"]["arguments"], tools)
                            for c in done.tool_calls]
        if any("cut_off" in c.issues for c in parsed.calls):
            done.turn_issues = [*done.turn_issues, "cut_off"]


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
        reasoning=msg.get("reasoning_content") or msg.get("reasoning") or "",
    )
