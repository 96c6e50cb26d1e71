"""Front doors: how a request is spelled for each kind of server, one adapter each.

The rollout layer asks for a generation from a token-id prompt, with a grammar, a seed and a
session id, and gets back what was sampled: token ids, logprobs, which engines served it and how
much of the prompt came from a prefix cache. Each adapter knows its server's wire format:
- `vllm`: vLLM's OpenAI server. `/v1/completions` with the prompt as token ids, the grammar as a
  structural tag in `structured_outputs`, `return_token_ids`, `prompt_logprobs` for replays.
- `dynamo`: NVIDIA Dynamo's frontend. The same route, the grammar as xgrammar EBNF in
  `guided_grammar` (it rejects `structured_outputs` and ignores `logit_bias`), token ids and the
  serving workers in `nvext`, the session in `x-dynamo-session-id`.
A new topology adds an adapter here and a name in FRONT_DOORS; the rollout layer is unchanged.
`chat` is the message-in path (the server renders the prompt and parses calls itself), kept for
comparison with the server's own tool handling (`rollout.tool_constraint=stock`).
"""

from __future__ import annotations

import asyncio
import base64
import io
import time
import uuid
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import aiohttp
import msgspec
import numpy as np

from serving.endpoint import Endpoint
from serving.engine.plugin import GRAMMAR_PREFIX_ARG, GRAMMAR_PREFIX_LINE
from serving.errors import ServerUnavailable
from serving.toolcall import ToolCallGrammar, TurnTooLong

SESSION_HEADER = "x-dynamo-session-id"  # Dynamo's router reads it; vLLM ignores it
FINAL_HEADER = "x-dynamo-session-final"  # the session is over: the router drops its binding
# Dynamo's frontend takes a request's id from this header when it is a UUID (any other value is
# replaced by a random one) and hands it to the worker, whose log names it.
REQUEST_ID_HEADER = "x-dynamo-request-id"
RELEASES = uuid.UUID("5b0c9d0e-8d7e-4c53-9a55-6d3f6c1b7a20")  # the namespace of release ids
REPLAY_ANNOTATION = "output_replay_id"  # a mocker's trace line to answer with
# Load shedding: Dynamo's frontend answers 529 when every worker is above the busy threshold
# (serving.busy_threshold), 429 where a server rate-limits. Nothing was sampled, so the request
# is sent again after a wait (doubling, first and last), until the request timeout.
OVERLOADED = (429, 529)
# Idle connections are dropped before the server's own keep-alive (uvicorn's 5 s) ends them: a
# request sent on a connection the server is closing fails (seen when sessions sat idle while a
# trainer trained), and nothing says whether it was sampled.
KEEPALIVE_S = 2.0
# The connection closed under a request (seen on a kept-alive connection under CPU
# starvation): the server aborts what it had started, so the request may be sent once more.
DROPPED = (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, ConnectionResetError)
OVERLOAD_WAIT_S = (0.05, 2.0)
# A turn's body carries the whole prompt as token ids, and its answer echoes them: msgspec spends
# 0.03 ms encoding a 6,000-token body where json.dumps spends 0.6, and half of json.loads' time
# decoding the answer (measured here).
_ENCODE = msgspec.json.Encoder().encode
_DECODE = msgspec.json.Decoder().decode


def overload_waits() -> Iterator[float]:
    """The waits before each resend of a shed request: doubling from the first to the last."""
    wait = OVERLOAD_WAIT_S[0]
    while True:
        yield wait
        wait = min(2 * wait, OVERLOAD_WAIT_S[1])


class PromptTooLong(TurnTooLong):
    """The prompt plus the requested tokens no longer fit the model's context window."""

    context_full = True


@dataclass(frozen=True)
class Sampling:
    """What to sample with; every field lands in the turn's record."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    # the first position whose routed experts come back, where the endpoint returns them
    routed_experts_from: int | None = None


@dataclass
class Generation:
    """One completion as the server sampled it."""

    prompt_token_ids: list[int]  # as the server reports the prompt it ran
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    cached_tokens: int = 0
    engine_id: str = ""  # the engine that decoded it
    prefill_engine_id: str = ""  # disaggregated serving: the engine that prefilled it
    latency_s: float = 0.0
    # MoE routing (serving.routed_experts): uint8 [positions, MoE layers, top-k] from position
    # `routed_experts_start` of prompt + completion on
    routed_experts: Any = None
    routed_experts_start: int | None = None  # None: from where the request asked
    # message-in (`chat`) only: what the server's own parser made of the completion
    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


class FrontDoor:
    """The requests one kind of server takes; subclasses spell them."""

    name: ClassVar[str]
    supports_prompt_logprobs: ClassVar[bool] = False

    def __init__(self, endpoint: Endpoint, engine_names: dict[str, str] | None = None) -> None:
        self.endpoint = endpoint
        # the id the server reports -> the engine's name (Roster.names(); a job's dispatch
        # hands its actor the roster of the moment)
        self.engine_names = dict(engine_names or {})
        self.root = endpoint.base_url.removesuffix("/v1")
        # a closed loop's session goes with the loop
        self._http: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession] \
            = weakref.WeakKeyDictionary()

    def _client(self) -> aiohttp.ClientSession:
        """The HTTP client of the event loop that uses the door, one per loop (an aiohttp
        session serves only the loop it was made in: `asyncio.run` twice with one door failed
        on the second). aiohttp, not httpx: a turn's request cost an actor 3.4 ms of CPU
        through httpx and 0.3 ms here (32 in flight, measured on this host)."""
        loop = asyncio.get_running_loop()
        http = self._http.get(loop)
        if http is None or http.closed:
            t = self.endpoint.request_timeout_s
            http = self._http[loop] = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S),
                timeout=aiohttp.ClientTimeout(total=None, connect=t, sock_read=t),
                headers={"Authorization": f"Bearer {self.endpoint.api_key}",
                         "Content-Type": "application/json"})
        return http

    async def generate(self, prompt_ids: list[int], sampling: Sampling,
                       grammar: ToolCallGrammar | None, session_id: str,
                       resume: list[int] | None = None) -> Generation:
        """`resume`: the tokens of this turn sampled so far, which end `prompt_ids`; the
        grammar starts after them (serving/engine/plugin.py, part 7)."""
        body = {"model": self.endpoint.model, "prompt": prompt_ids, **_sampling(sampling),
                "logprobs": 0, **self._grammar_fields(grammar), **self._token_fields()}
        if resume and grammar is not None:
            body.update(self._resume_fields(resume, grammar))
        if self.endpoint.routed_experts and sampling.routed_experts_from is not None:
            body["routed_experts_prompt_start"] = sampling.routed_experts_from
        # the prompt is exactly these ids: nothing (BOS, ...) is added in front
        start = time.perf_counter()
        raw = await self._post("/v1/completions", body, session_id)
        choice = raw["choices"][0]
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or []
        gen = Generation(prompt_token_ids=[], token_ids=[], logprobs=[float(x) for x in logprobs],
                         finish_reason=choice.get("finish_reason") or "",
                         cached_tokens=_cached(raw), latency_s=time.perf_counter() - start)
        self._read_ids(gen, raw, choice)
        gen.finish_reason = self._finish_reason(gen)
        if gen.routed_experts is not None and gen.routed_experts_start is None:
            gen.routed_experts_start = sampling.routed_experts_from or 0
        return gen

    async def chat(self, messages: list[dict], tools: list[dict], tool_choice: Any,
                   parallel: bool, sampling: Sampling, session_id: str) -> Generation:
        body = {"model": self.endpoint.model, "messages": messages, **_sampling(sampling),
                "logprobs": True, "chat_template_kwargs": {
                    "enable_thinking": self.endpoint.enable_thinking}, **self._token_fields()}
        if tools:
            body.update(tools=tools, tool_choice=tool_choice, parallel_tool_calls=parallel)
        start = time.perf_counter()
        raw = await self._post("/v1/chat/completions", body, session_id)
        choice = raw["choices"][0]
        msg = choice["message"]
        entries = (choice.get("logprobs") or {}).get("content") or []
        gen = Generation(prompt_token_ids=[], token_ids=[],
                         logprobs=[float(e["logprob"]) for e in entries],
                         finish_reason=choice.get("finish_reason") or "",
                         cached_tokens=_cached(raw), latency_s=time.perf_counter() - start,
                         content=msg.get("content") or "",
                         tool_calls=[{"id": c["id"], "type": "function", "function": {
                             "name": c["function"]["name"],
                             "arguments": c["function"]["arguments"]}}
                             for c in msg.get("tool_calls") or []])
        self._read_ids(gen, raw, choice)
        return gen

    async def prompt_logprobs(self, token_ids: list[int]) -> list[float | None]:
        """The model's logprob of each token given the ones before it (None for the first)."""
        raise NotImplementedError(f"the {self.name} front door cannot replay prompt logprobs; "
                                  "use an embedded vLLM engine")

    async def release(self, session_id: str) -> None:
        """Tell the router a session is over (front doors without session state: nothing)."""

    async def aclose(self) -> None:
        """Close the running loop's client (another loop's can only be closed from it)."""
        http = self._http.pop(asyncio.get_running_loop(), None)
        if http is not None:
            await http.close()

    def _grammar_fields(self, grammar: ToolCallGrammar | None) -> dict[str, Any]:
        raise NotImplementedError

    def logit_bias(self, grammar: ToolCallGrammar | None) -> dict[int, float]:
        """The logit bias this server applies beside `grammar` (what a replay must apply)."""
        return {}

    def _finish_reason(self, gen: Generation) -> str:
        """Why the generation ended, spelled as vLLM does (`abort`: its engine aborted it)."""
        return gen.finish_reason

    def _resume_fields(self, resume: list[int], grammar: ToolCallGrammar) -> dict[str, Any]:
        """How this server is told that the grammar starts after `resume` (the prompt's last
        tokens): by default the tokens in an extra arg (serving/engine/plugin.py, part 7)."""
        return {"vllm_xargs": {GRAMMAR_PREFIX_ARG: list(resume)}}

    def _token_fields(self) -> dict[str, Any]:
        raise NotImplementedError

    def _read_ids(self, gen: Generation, raw: dict, choice: dict) -> None:
        raise NotImplementedError

    async def _post(self, path: str, body: dict, session_id: str | None,
                    headers: dict[str, str] | None = None) -> dict:
        hdrs = {SESSION_HEADER: session_id} if session_id else {}
        hdrs.update(headers or {})
        data = _ENCODE(body)
        deadline = time.monotonic() + self.endpoint.request_timeout_s
        dropped = 0
        for wait in overload_waits():
            try:
                async with self._client().post(f"{self.root}{path}", data=data,
                                               headers=hdrs) as resp:
                    status, raw = resp.status, await resp.read()
            except DROPPED as exc:
                dropped += 1
                if dropped > 1:
                    raise ServerUnavailable(f"{self.name} {path}: {type(exc).__name__}: "
                                            f"{exc}") from None
                continue
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise ServerUnavailable(f"{self.name} {path}: {type(exc).__name__}: "
                                        f"{exc}") from None
            if status not in OVERLOADED or time.monotonic() + wait > deadline:
                break
            # Shed before any engine took it (every engine busy): the same request, later.
            await asyncio.sleep(wait)
        text = raw[:500].decode(errors="replace")
        if status == 200:
            try:
                return _DECODE(raw)
            except msgspec.DecodeError as exc:  # a proxy's page, a cut answer: nothing to read
                raise ServerUnavailable(f"{self.name} {path}: HTTP 200 but not JSON ({exc}): "
                                        f"{text}") from None
        if status == 400 and ("context length" in text or "maximum context" in text
                              or "max_model_len" in text):
            raise PromptTooLong(text)
        # 5xx, a front door that lost the model's engines (404), or a rejected request: the
        # serving side failed, never the rollout.
        raise ServerUnavailable(f"{self.name} {path}: HTTP {status}: {text}")


class VllmFrontDoor(FrontDoor):
    name = "vllm"
    supports_prompt_logprobs = True

    def _grammar_fields(self, grammar: ToolCallGrammar | None) -> dict[str, Any]:
        if grammar is None:
            return {}
        fields: dict[str, Any] = {"structured_outputs": {"structural_tag": grammar.json()}}
        if grammar.logit_bias:
            fields["logit_bias"] = {str(k): v for k, v in self.logit_bias(grammar).items()}
        return fields

    def logit_bias(self, grammar: ToolCallGrammar | None) -> dict[int, float]:
        return dict(grammar.logit_bias) if grammar else {}

    def _token_fields(self) -> dict[str, Any]:
        return {"return_token_ids": True}

    def _read_ids(self, gen: Generation, raw: dict, choice: dict) -> None:
        gen.prompt_token_ids = list(choice.get("prompt_token_ids")
                                    or raw.get("prompt_token_ids") or [])
        gen.token_ids = list(choice.get("token_ids") or [])
        gen.engine_id = self.engine_names.get("", "")  # one engine behind this server
        if choice.get("routed_experts"):  # a .npy array, base64 (vLLM's numpy2base64)
            gen.routed_experts = np.load(io.BytesIO(base64.b64decode(choice["routed_experts"])),
                                         allow_pickle=False)

    async def prompt_logprobs(self, token_ids: list[int]) -> list[float | None]:
        raw = await self._post("/v1/completions", {
            "model": self.endpoint.model, "prompt": token_ids, "max_tokens": 1,
            "temperature": 0.0, "prompt_logprobs": 0}, None)
        entries = raw["choices"][0].get("prompt_logprobs") or []
        return [None if e is None else float(e[str(t)]["logprob"])
                for t, e in zip(token_ids, entries, strict=True)]


class DynamoFrontDoor(FrontDoor):
    name = "dynamo"
    FIELDS = ("worker_id", "prompt_token_ids", "completion_token_ids")

    def _grammar_fields(self, grammar: ToolCallGrammar | None) -> dict[str, Any]:
        # Dynamo 1.6.1's frontend drops `logit_bias` (FrontDoor.logit_bias: none applied)
        return {} if grammar is None else {"guided_grammar": grammar.ebnf}

    def _token_fields(self) -> dict[str, Any]:
        return {"nvext": {"extra_fields": list(self.FIELDS)}}

    def _finish_reason(self, gen: Generation) -> str:
        # The worker reports an aborted request (a weight update's pause) as `cancelled`, which
        # the frontend answers as `stop` (Dynamo 1.6.1): a stop that sampled no stop token was
        # cut short.
        stops = self.endpoint.stop_token_ids
        if gen.finish_reason == "stop" and stops and (not gen.token_ids
                                                      or gen.token_ids[-1] not in stops):
            return "abort"
        return gen.finish_reason

    def _resume_fields(self, resume: list[int], grammar: ToolCallGrammar) -> dict[str, Any]:
        # the frontend refuses `vllm_xargs` (HTTP 400, Dynamo 1.6.1) and passes the grammar's
        # text to the worker unchanged: its first line counts the tokens
        return {"guided_grammar": f"{GRAMMAR_PREFIX_LINE}{len(resume)}\n{grammar.ebnf}"}

    def _read_ids(self, gen: Generation, raw: dict, choice: dict) -> None:
        nvext = raw.get("nvext") or {}
        gen.prompt_token_ids = list(nvext.get("prompt_token_ids") or [])
        gen.token_ids = list(nvext.get("completion_token_ids") or [])
        experts = nvext.get("routed_experts")
        if experts:  # Dynamo's own: raw bytes, base64, with shape, dtype and start
            gen.routed_experts = np.frombuffer(base64.b64decode(experts["data"]),
                                               dtype=experts["dtype"]).reshape(experts["shape"])
            gen.routed_experts_start = int(experts.get("start", 0))
        workers = nvext.get("worker_id") or {}
        names = self.engine_names
        for key, attr in (("decode_worker_id", "engine_id"),
                          ("prefill_worker_id", "prefill_engine_id")):
            if workers.get(key) is not None:
                hex_id = f"{int(workers[key]):x}"
                setattr(gen, attr, names.get(hex_id, hex_id))

    async def release(self, session_id: str) -> None:
        """Drop the router's binding now rather than after the idle TTL: a one-token request
        marked final, whose id (`release_request_id`) names its session in the servers' logs
        and tells it from a turn there."""
        await self._post("/v1/completions", {"model": self.endpoint.model, "prompt": "end",
                                             "max_tokens": 1}, session_id,
                         {FINAL_HEADER: "true",
                          REQUEST_ID_HEADER: str(release_request_id(session_id))})


def release_request_id(session_id: str) -> uuid.UUID:
    """The id of a session's release request: a name-based (version 5) UUID, where the turns'
    ids are random (version 4) ones the frontend makes."""
    return uuid.uuid5(RELEASES, session_id)


class ReplayFrontDoor(DynamoFrontDoor):
    """Dynamo's front door, each turn annotated with its replay key `<session id>:<turn>`, for
    mocker engines that answer from a trace (serving/dynamo/mocker.py).

    A session's turns all go through one front door (the actor that runs it), in order, so the
    turn is the number of requests this session sent before; a release forgets the session.
    """

    name = "dynamo_replay"

    def __init__(self, endpoint: Endpoint, engine_names: dict[str, str] | None = None) -> None:
        super().__init__(endpoint, engine_names)
        self.turns: dict[str, int] = {}

    async def release(self, session_id: str) -> None:
        self.turns.pop(session_id, None)
        await super().release(session_id)

    async def _post(self, path: str, body: dict, session_id: str | None,
                    headers: dict[str, str] | None = None) -> dict:
        if session_id and FINAL_HEADER not in (headers or {}):
            turn = self.turns.get(session_id, 0)
            self.turns[session_id] = turn + 1
            nvext = dict(body.get("nvext") or {})
            nvext["annotations"] = [*nvext.get("annotations", []),
                                    f"{REPLAY_ANNOTATION}:{session_id}:{turn}"]
            body = {**body, "nvext": nvext}
        return await super()._post(path, body, session_id, headers)


FRONT_DOORS: dict[str, type[FrontDoor]] = {
    d.name: d for d in (VllmFrontDoor, DynamoFrontDoor, ReplayFrontDoor)}


def open_front_door(endpoint: Endpoint, engine_names: dict[str, str] | None = None) -> FrontDoor:
    """The endpoint's front door; `engine_names` (Roster.names()) names the engines it reports."""
    try:
        return FRONT_DOORS[endpoint.front_door](endpoint, engine_names)
    except KeyError:
        raise ValueError(f"unknown front door {endpoint.front_door!r}; "
                         f"known: {sorted(FRONT_DOORS)}") from None


def _sampling(s: Sampling) -> dict[str, Any]:
    body: dict[str, Any] = {"max_tokens": s.max_tokens, "temperature": s.temperature,
                            "top_p": s.top_p}
    if s.seed is not None:
        body["seed"] = s.seed
    return body


def _cached(raw: dict) -> int:
    usage = raw.get("usage") or {}
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
