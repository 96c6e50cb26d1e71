"""How each front door spells a request and reads the answer (the wire logic only: the real
servers are in tests/e2e, where every record is checked against them)."""

import asyncio
import json
import time

import httpx
import pytest

from serving import Endpoint, Sampling
from serving.frontdoor import (
    SESSION_HEADER,
    PromptTooLong,
    ServerUnavailable,
    open_front_door,
)
from serving.toolcall import ToolCallGrammar

GRAMMAR = ToolCallGrammar({"type": "structural_tag", "format": {"type": "const_string",
                                                                "value": "x"}},
                          3, "rollfleet-glm:test", {8179: -100.0})


def _door(kind, handler, engine_names=None, **endpoint):
    ep = Endpoint(base_url="http://server/v1", model="m", model_dir="/m", front_door=kind,
                  **endpoint)
    door = open_front_door(ep, engine_names)
    door.http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return door


def _generate(door, grammar=GRAMMAR):
    return asyncio.run(door.generate([1, 2, 3], Sampling(16, 0.7, 0.9, 5), grammar, "s1"))


def test_vllm_takes_token_ids_and_a_structural_tag_and_returns_the_ids():
    seen = {}

    def server(request):
        seen["path"], seen["body"] = request.url.path, json.loads(request.content)
        seen["session"] = request.headers.get(SESSION_HEADER)
        return httpx.Response(200, json={
            "choices": [{"token_ids": [7, 8], "prompt_token_ids": [1, 2, 3],
                         "finish_reason": "stop",
                         "logprobs": {"token_logprobs": [-0.5, -1.25]}}],
            "usage": {"prompt_tokens_details": {"cached_tokens": 2}}})

    gen = _generate(_door("vllm", server, engine_names={"": "0"}))
    body = seen["body"]
    assert seen["path"] == "/v1/completions" and seen["session"] == "s1"
    assert body["prompt"] == [1, 2, 3] and body["return_token_ids"] is True
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["seed"]) == (
        16, 0.7, 0.9, 5)
    assert json.loads(body["structured_outputs"]["structural_tag"]) == GRAMMAR.structural_tag
    assert body["logit_bias"] == {"8179": -100.0} and body["logprobs"] == 0
    assert (gen.prompt_token_ids, gen.token_ids, gen.logprobs) == ([1, 2, 3], [7, 8],
                                                                   [-0.5, -1.25])
    assert (gen.cached_tokens, gen.engine_id, gen.finish_reason) == (2, "0", "stop")


def test_dynamo_takes_the_grammar_as_ebnf_and_names_the_workers():
    seen = {}

    def server(request):
        seen["body"] = json.loads(request.content)
        return httpx.Response(200, json={
            "choices": [{"finish_reason": "stop", "logprobs": {"token_logprobs": [-1.0]}}],
            "nvext": {"prompt_token_ids": [1, 2, 3], "completion_token_ids": [9],
                      "worker_id": {"prefill_worker_id": 255, "decode_worker_id": 16}}})

    door = _door("dynamo", server, engine_names={"ff": "prefill0", "10": "decode0"})
    gen = _generate(door)
    body = seen["body"]
    assert body["guided_grammar"] == GRAMMAR.ebnf and "structured_outputs" not in body
    assert "logit_bias" not in body  # Dynamo's frontend ignores it: not sent
    assert body["nvext"]["extra_fields"] == ["worker_id", "prompt_token_ids",
                                             "completion_token_ids"]
    assert (gen.token_ids, gen.engine_id, gen.prefill_engine_id) == ([9], "decode0", "prefill0")
    door.engine_names = {"10": "decode0-restarted"}  # what a dispatch hands the actor
    assert _generate(door).engine_id == "decode0-restarted"


@pytest.mark.parametrize(("response", "error"), [
    (httpx.Response(503, text="no engines"), ServerUnavailable),
    (httpx.Response(404, text="model gone"), ServerUnavailable),
    (httpx.Response(400, text="This model's maximum context length is 16384"), PromptTooLong),
])
def test_server_answers_map_to_what_the_session_does_with_them(response, error):
    with pytest.raises(error):
        _generate(_door("vllm", lambda request: response))


def test_an_unreachable_server_is_unavailable():
    def down(request):
        raise httpx.ConnectError("refused")

    with pytest.raises(ServerUnavailable, match="ConnectError"):
        _generate(_door("dynamo", down))


def test_a_connection_dropped_under_a_request_is_tried_once_more():
    calls = []

    def flaky(request):
        calls.append(request.content)
        if len(calls) == 1:
            raise httpx.ReadError("connection closed")
        return httpx.Response(200, json={
            "choices": [{"finish_reason": "stop", "logprobs": {"token_logprobs": [-1.0]}}],
            "nvext": {"prompt_token_ids": [1, 2, 3], "completion_token_ids": [9]}})

    assert _generate(_door("dynamo", flaky)).token_ids == [9]
    assert len(calls) == 2 and calls[0] == calls[1]

    def dropping(request):
        raise httpx.ReadError("connection closed")

    with pytest.raises(ServerUnavailable, match="ReadError"):
        _generate(_door("dynamo", dropping))


def test_a_shed_request_is_sent_again_until_an_engine_takes_it():
    """Dynamo's 529 (every worker busy) is back-pressure: the same request again, not a failed
    rollout; past the request timeout it is the server's failure like any 5xx."""
    bodies = []

    def server(request):
        bodies.append(request.content)
        if len(bodies) < 4:
            return httpx.Response(529, json={"message": "Service temporarily overloaded"})
        return httpx.Response(200, json={
            "choices": [{"finish_reason": "stop", "logprobs": {"token_logprobs": [-1.0]}}],
            "nvext": {"prompt_token_ids": [1, 2, 3], "completion_token_ids": [9]}})

    door = _door("dynamo", server)
    start = time.perf_counter()
    gen = _generate(door)
    assert gen.token_ids == [9] and len(bodies) == 4 and len(set(bodies)) == 1
    assert gen.latency_s >= time.perf_counter() - start - 0.05  # the waits are in the turn
    with pytest.raises(ServerUnavailable, match="HTTP 529"):
        _generate(_door("dynamo", lambda request: httpx.Response(529, text="overloaded"),
                        request_timeout_s=0.3))


def test_dynamo_release_marks_the_session_final():
    seen = {}

    def server(request):
        seen.update(request.headers)
        return httpx.Response(200, json={"choices": []})

    asyncio.run(_door("dynamo", server).release("run:t/0:0"))
    assert seen[SESSION_HEADER] == "run:t/0:0" and seen["x-dynamo-session-final"] == "true"


def test_an_unknown_front_door_is_refused():
    with pytest.raises(ValueError, match="unknown front door 'triton'"):
        open_front_door(Endpoint(base_url="http://x/v1", model="m", model_dir="/m",
                                 front_door="triton"))
