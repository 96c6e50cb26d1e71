"""An OpenAI-compatible front for outside callers, with the project's tool-call guarantee.

Requests without tools (or with `tool_choice: none`), `/v1/completions` and `/v1/models` go to
the cluster's front door unchanged, streaming included. A chat request with tools is answered
the way the rollout job samples: the conversation is rendered to token ids with the model's own
template, sampled under the project's GLM tool-call grammar (serving/toolcall) for its
`tool_choice` (auto, required or one named tool), and the calls are parsed from the sampled
tokens. So every caller gets valid calls on every topology, Dynamo's included (whose frontend
does not enforce `required` itself). Streamed, such a request arrives as one content chunk, then
one chunk per call, then the finish.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from typing import Any

import aiohttp
from aiohttp import web

from serving.endpoint import Endpoint
from serving.errors import ServerUnavailable
from serving.frontdoor import KEEPALIVE_S, PromptTooLong, Sampling
from serving.tool_turn import ToolCallSampler
from serving.toolcall import CallTooLong, UnsupportedSchema

DEFAULT_MAX_TOKENS = 4096


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error",
                                        "code": status}}, status=status)


class ToolCallProxy:
    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.sampler = ToolCallSampler(endpoint)
        self.http: aiohttp.ClientSession | None = None  # the relay's, made in the app's loop

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/v1/models", self.forward)
        app.router.add_post("/v1/completions", self.forward)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/health", self.health)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _app: web.Application) -> None:
        """aiohttp, as the front doors (serving/frontdoor.py says why)."""
        t = self.endpoint.request_timeout_s
        self.http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S),
            timeout=aiohttp.ClientTimeout(total=None, connect=t, sock_read=t))

    async def _close(self, _app: web.Application) -> None:
        if self.http is not None:
            await self.http.close()
        await self.sampler.door.aclose()

    async def health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "model": self.endpoint.model})

    async def forward(self, request: web.Request) -> web.StreamResponse:
        return await self._relay(request, await request.read())

    async def _relay(self, request: web.Request, body: bytes) -> web.StreamResponse:
        """The request as it came, to the cluster's front door; the answer streams back."""
        assert self.http is not None
        url = self.endpoint.base_url.removesuffix("/v1") + request.path
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() in ("content-type", "authorization", "x-dynamo-session-id")}
        try:
            resp = await self.http.request(request.method, url, data=body or None,
                                           headers=headers)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return _error(502, f"the serving cluster did not answer: {exc!r}")
        try:
            out = web.StreamResponse(status=resp.status, headers={
                "Content-Type": resp.headers.get("content-type", "application/json")})
            await out.prepare(request)
            async for chunk in resp.content.iter_any():
                await out.write(chunk)
        finally:
            resp.release()
        await out.write_eof()
        return out

    async def chat(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except json.JSONDecodeError as exc:
            return _error(400, f"the body is not JSON: {exc}")
        tools = body.get("tools") or []
        if not tools or body.get("tool_choice") == "none" or not self.endpoint.constrainable:
            return await self._relay(request, raw)
        try:
            answer = await self._constrained(body, tools)
        except (CallTooLong, UnsupportedSchema, ValueError) as exc:
            return _error(400, str(exc))
        except PromptTooLong as exc:
            return _error(400, f"the conversation does not fit the context window: {exc}")
        except ServerUnavailable as exc:
            return _error(503, str(exc))
        if body.get("stream"):
            return await self._stream(request, answer)
        return web.json_response(answer)

    async def _constrained(self, body: dict[str, Any], tools: list[dict]) -> dict[str, Any]:
        choice = body.get("tool_choice") or "auto"
        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens")
                         or DEFAULT_MAX_TOKENS)
        parallel = bool(body.get("parallel_tool_calls", False))
        prompt = self.sampler.renderer.prompt_ids([_for_template(m) for m in body["messages"]],
                                                  tools)
        sampling = Sampling(max_tokens, float(body.get("temperature", Sampling.temperature)),
                            float(body.get("top_p", Sampling.top_p)), body.get("seed"))
        turn = await self.sampler.sample(prompt, tools, choice, parallel, sampling, "")
        message: dict[str, Any] = {"role": "assistant", "content": turn.content or None}
        if turn.calls:
            message["tool_calls"] = [c.openai() for c in turn.calls]
        if turn.reasoning:
            message["reasoning_content"] = turn.reasoning
        finish = "tool_calls" if turn.calls else turn.generation.finish_reason or "stop"
        n_out = len(turn.generation.token_ids)
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                "created": int(time.time()), "model": self.endpoint.model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": n_out,
                          "total_tokens": len(prompt) + n_out}}

    async def _stream(self, request: web.Request, answer: dict[str, Any]) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        head = {k: answer[k] for k in ("id", "created", "model")}
        message = answer["choices"][0]["message"]
        deltas = [{"role": "assistant", "content": message["content"] or ""}]
        deltas += [{"tool_calls": [{"index": i, **call}]}
                   for i, call in enumerate(message.get("tool_calls") or [])]
        for delta in deltas:
            await _sse(out, {**head, "object": "chat.completion.chunk",
                             "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
        await _sse(out, {**head, "object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": {}, "finish_reason": answer["choices"][0]["finish_reason"]}],
            "usage": answer["usage"]})
        await out.write(b"data: [DONE]\n\n")
        await out.write_eof()
        return out


async def _sse(out: web.StreamResponse, data: dict[str, Any]) -> None:
    await out.write(f"data: {json.dumps(data)}\n\n".encode())


def _for_template(message: dict[str, Any]) -> dict[str, Any]:
    """OpenAI messages carry call arguments as a JSON string; the GLM template writes each
    argument as its own key/value pair, so it needs them as a mapping."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    fixed = []
    for call in calls:
        fn = dict(call.get("function") or {})
        if isinstance(fn.get("arguments"), str):
            with contextlib.suppress(json.JSONDecodeError):  # else rendered as it came
                fn["arguments"] = json.loads(fn["arguments"] or "{}")
        fixed.append({**call, "function": fn})
    return {**message, "tool_calls": fixed}

