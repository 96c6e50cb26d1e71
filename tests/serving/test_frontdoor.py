"""How each front door spells a request and reads the answer (the wire logic, against a real
HTTP server on 127.0.0.1 that answers as told; the real serving clusters are in tests/e2e, where
every record is checked against them)."""

import asyncio
import json
import threading
import time
import uuid

import pytest
from aiohttp import web

from serving import Endpoint, Sampling
from serving.engine.plugin import GRAMMAR_PREFIX_ARG, GRAMMAR_PREFIX_LINE
from serving.frontdoor import (
    REQUEST_ID_HEADER,
    SESSION_HEADER,
    PromptTooLong,
    ServerUnavailable,
    open_front_door,
    release_request_id,
)
from serving.process import free_port
from serving.toolcall import ToolCallGrammar

GRAMMAR = ToolCallGrammar({"type": "structural_tag", "format": {"type": "const_string",
                                                                "value": "x"}},
                          3, "rollfleet-glm:test", {8179: -100.0})
DROP = None  # a handler's answer: the connection closes under the request


class Request:
    """What the server got: path, headers, JSON body."""

    def __init__(self, path: str, headers: dict[str, str], content: bytes) -> None:
        self.path, self.headers, self.content = path, headers, content
        self.body = json.loads(content)


async def _serve(handler) -> tuple[web.AppRunner, int]:
    """A server on 127.0.0.1 whose every answer is `handler(Request)`: (status, JSON or
    text), or DROP; its runner and port."""
    async def answer(request: web.Request) -> web.StreamResponse:
        reply = handler(Request(request.path, dict(request.headers), await request.read()))
        if reply is DROP:
            request.transport.close()
            return web.Response()
        status, payload = reply
        if isinstance(payload, str):
            return web.Response(status=status, text=payload)
        return web.json_response(payload, status=status)

    app = web.Application()
    app.router.add_post("/{path:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


def _door(port: int, kind: str = "dynamo", engine_names=None, **endpoint):
    return open_front_door(Endpoint(base_url=f"http://127.0.0.1:{port}/v1", model="m",
                                    model_dir="/m", front_door=kind, **endpoint), engine_names)


async def _served(handler, use, kind="dynamo", engine_names=None, **endpoint):
    """`use(door)` with a door on a `_serve(handler)` server."""
    runner, port = await _serve(handler)
    door = _door(port, kind, engine_names, **endpoint)
    try:
        return await use(door)
    finally:
        await door.aclose()
        await runner.cleanup()


def _generate(handler, kind="dynamo", grammar=GRAMMAR, **kw):
    return asyncio.run(_served(handler, lambda door: _one(door, grammar), kind, **kw))


async def _one(door, grammar=GRAMMAR):
    return await door.generate([1, 2, 3], Sampling(16, 0.7, 0.9, 5), grammar, "s1")


OK_DYNAMO = (200, {"choices": [{"finish_reason": "stop", "logprobs": {"token_logprobs": [-1.0]}}],
                   "nvext": {"prompt_token_ids": [1, 2, 3], "completion_token_ids": [9]}})


def test_vllm_takes_token_ids_and_a_structural_tag_and_returns_the_ids():
    seen = {}

    def server(request):
        seen["path"], seen["body"] = request.path, request.body
        seen["session"] = request.headers.get(SESSION_HEADER)
        return 200, {"choices": [{"token_ids": [7, 8], "prompt_token_ids": [1, 2, 3],
                                  "finish_reason": "stop",
                                  "logprobs": {"token_logprobs": [-0.5, -1.25]}}],
                     "usage": {"prompt_tokens_details": {"cached_tokens": 2}}}

    gen = _generate(server, "vllm", engine_names={"": "0"})
    body = seen["body"]
    assert seen["path"] == "/v1/completions" and seen["session"] == "s1"
    assert body["prompt"] == [1, 2, 3] and body["return_token_ids"] is True
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["seed"]) == (
        16, 0.7, 0.9, 5)
    assert json.loads(body["structured_outputs"]["structural_tag"]) == GRAMMAR.structural_tag
    assert body["logit_bias"] == {"8179": -100.0} and body["logprobs"] == 0
    door = open_front_door(Endpoint("http://x/v1", "m", "/m"))
    assert door.logit_bias(GRAMMAR) == {8179: -100.0} and door.logit_bias(None) == {}
    assert (gen.prompt_token_ids, gen.token_ids, gen.logprobs) == ([1, 2, 3], [7, 8],
                                                                   [-0.5, -1.25])
    assert (gen.cached_tokens, gen.engine_id, gen.finish_reason) == (2, "0", "stop")


def test_dynamo_takes_the_grammar_as_ebnf_and_names_the_workers():
    seen = {}

    def server(request):
        seen["body"], seen["auth"] = request.body, request.headers.get("Authorization")
        return 200, {
            "choices": [{"finish_reason": "stop", "logprobs": {"token_logprobs": [-1.0]}}],
            "nvext": {"prompt_token_ids": [1, 2, 3], "completion_token_ids": [9],
                      "worker_id": {"prefill_worker_id": 255, "decode_worker_id": 16}}}

    async def twice(door):
        first = await _one(door)
        door.engine_names = {"10": "decode0-restarted"}  # what a dispatch hands the actor
        return first, await _one(door)

    gen, later = asyncio.run(_served(server, twice, "dynamo", {"ff": "prefill0", "10": "decode0"},
                                     api_key="k"))
    body = seen["body"]
    assert body["guided_grammar"] == GRAMMAR.ebnf and "structured_outputs" not in body
    assert "logit_bias" not in body  # Dynamo's frontend ignores it: not sent
    door = open_front_door(Endpoint("http://x/v1", "m", "/m", front_door="dynamo"))
    assert door.logit_bias(GRAMMAR) == {}  # what a replay of its masks applies: none
    assert body["nvext"]["extra_fields"] == ["worker_id", "prompt_token_ids",
                                             "completion_token_ids"]
    assert (gen.token_ids, gen.engine_id, gen.prefill_engine_id) == ([9], "decode0", "prefill0")
    assert later.engine_id == "decode0-restarted" and seen["auth"] == "Bearer k"


@pytest.mark.parametrize("kind", ["vllm", "dynamo"])
def test_a_resumed_turn_names_the_tokens_its_grammar_already_consumed(kind):
    """The two spellings of serving/engine/plugin.py's part 7: the tokens in `vllm_xargs`
    (vLLM), a count line atop the EBNF (Dynamo's frontend refuses `vllm_xargs`)."""
    seen = []

    def server(request):
        seen.append(request.body)
        return OK_DYNAMO if kind == "dynamo" else (200, {"choices": [
            {"token_ids": [9], "prompt_token_ids": [1, 2, 3], "finish_reason": "stop"}]})

    async def resumed(door):
        await door.generate([1, 2, 3], Sampling(16), GRAMMAR, "s1", resume=[2, 3])
        await door.generate([1, 2, 3], Sampling(16), GRAMMAR, "s1")

    asyncio.run(_served(server, resumed, kind))
    cut, whole = seen
    if kind == "vllm":
        assert cut["vllm_xargs"] == {GRAMMAR_PREFIX_ARG: [2, 3]} and "vllm_xargs" not in whole
        assert cut["structured_outputs"] == whole["structured_outputs"]
    else:
        assert "vllm_xargs" not in cut
        assert cut["guided_grammar"] == f"{GRAMMAR_PREFIX_LINE}2\n{GRAMMAR.ebnf}"
        assert whole["guided_grammar"] == GRAMMAR.ebnf


@pytest.mark.parametrize(("finish", "tokens", "stops", "seen"), [
    ("stop", [5, 9, 2], [2, 3], "stop"),  # sampled a stop token: ended
    ("stop", [5, 9], [2, 3], "abort"),  # reported stop, no stop token: the pause cut it
    ("stop", [], [2, 3], "abort"),  # cut before its first token
    ("length", [5, 9], [2, 3], "length"),
    ("stop", [5, 9], [], "stop"),  # stop tokens unknown: taken as reported
])
def test_dynamo_tells_a_cut_turn_from_one_that_stopped(finish, tokens, stops, seen):
    """Dynamo's frontend answers a request its engine aborted (`cancelled`) as `stop`."""
    def server(request):
        return 200, {"choices": [{"finish_reason": finish}],
                     "nvext": {"prompt_token_ids": [1, 2, 3], "completion_token_ids": tokens}}

    assert _generate(server, stop_token_ids=stops).finish_reason == seen


@pytest.mark.parametrize(("response", "error"), [
    ((503, "no engines"), ServerUnavailable),
    ((404, "model gone"), ServerUnavailable),
    ((400, "This model's maximum context length is 16384"), PromptTooLong),
    ((200, "<html>bad gateway</html>"), ServerUnavailable),
])
def test_server_answers_map_to_what_the_session_does_with_them(response, error):
    with pytest.raises(error, match=response[1]):
        _generate(lambda request: response, "vllm")


def test_one_door_serves_one_event_loop_after_another():
    """Each `asyncio.run` is a new event loop: the door's HTTP client is the running loop's."""
    loop = asyncio.new_event_loop()
    server = threading.Thread(target=loop.run_forever, daemon=True)
    server.start()
    runner, port = asyncio.run_coroutine_threadsafe(_serve(lambda _: OK_DYNAMO), loop).result()
    door = _door(port)

    async def turn():
        try:
            return await _one(door)
        finally:
            await door.aclose()

    try:
        assert asyncio.run(_one(door)).token_ids == [9]  # the first loop's client stays open
        assert asyncio.run(turn()).token_ids == [9]  # a client of the second loop's own
        assert asyncio.run(turn()).token_ids == [9]
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        server.join()


def test_an_unreachable_server_is_unavailable():
    door = _door(free_port())

    async def use():
        try:
            return await _one(door)
        finally:
            await door.aclose()

    with pytest.raises(ServerUnavailable, match="dynamo /v1/completions: ClientConnectorError"):
        asyncio.run(use())


def test_a_connection_dropped_under_a_request_is_tried_once_more():
    calls = []

    def flaky(request):
        calls.append(request.content)
        return DROP if len(calls) == 1 else OK_DYNAMO

    assert _generate(flaky).token_ids == [9]
    assert len(calls) == 2 and calls[0] == calls[1]
    calls.clear()

    def dropping(request):
        calls.append(request.content)
        return DROP

    with pytest.raises(ServerUnavailable, match="ServerDisconnectedError"):
        _generate(dropping)
    assert len(calls) == 2  # once more, never more


def test_a_shed_request_is_sent_again_until_an_engine_takes_it():
    """Dynamo's 529 (every worker busy) is back-pressure: the same request again, not a failed
    rollout; past the request timeout it is the server's failure like any 5xx."""
    bodies = []

    def server(request):
        bodies.append(request.content)
        if len(bodies) < 4:
            return 529, {"message": "Service temporarily overloaded"}
        return OK_DYNAMO

    start = time.perf_counter()
    gen = _generate(server)
    assert gen.token_ids == [9] and len(bodies) == 4 and len(set(bodies)) == 1
    assert gen.latency_s >= time.perf_counter() - start - 0.5  # the waits are in the turn
    assert gen.latency_s >= sum((0.05, 0.1, 0.2))
    with pytest.raises(ServerUnavailable, match="HTTP 529"):
        _generate(lambda request: (529, "overloaded"), request_timeout_s=0.3)


def test_dynamo_release_marks_the_session_final():
    seen = {}

    def server(request):
        seen.update(request.headers)
        return 200, {"choices": []}

    asyncio.run(_served(server, lambda door: door.release("run:t/0:0")))
    assert seen[SESSION_HEADER] == "run:t/0:0" and seen["x-dynamo-session-final"] == "true"
    # its id is the session's own, and tells a release from a turn (random ids) in a log
    rid = seen[REQUEST_ID_HEADER]
    assert rid == str(release_request_id("run:t/0:0")) != str(release_request_id("run:t/0:1"))
    assert uuid.UUID(rid).version == 5


def test_an_unknown_front_door_is_refused():
    with pytest.raises(ValueError, match="unknown front door 'triton'"):
        open_front_door(Endpoint(base_url="http://x/v1", model="m", model_dir="/m",
                                 front_door="triton"))
