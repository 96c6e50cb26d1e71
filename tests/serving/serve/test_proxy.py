"""The relay of `serving.serve` (requests without tools go to the cluster as they came), against
a real HTTP server on 127.0.0.1 standing in for the cluster; the whole server on every topology
is tests/e2e/test_serve.py."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from rollfleet.paths import ROOT
from serving import Endpoint
from serving.process import free_port
from serving.serve.proxy import ToolCallProxy
from serving.tiny_model import ensure_tiny_glm

MODEL_DIR = ensure_tiny_glm(ROOT / ".cache" / "models")
CHUNKS = [b"data: {\"n\": 1}\n\n", b"data: {\"n\": 2}\n\n", b"data: [DONE]\n\n"]


async def _start(app: web.Application) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


async def _through_proxy(upstream_port: int, use) -> object:
    endpoint = Endpoint(base_url=f"http://127.0.0.1:{upstream_port}/v1", model="tiny-glm",
                        model_dir=str(MODEL_DIR), front_door="vllm", request_timeout_s=5)
    runner, port = await _start(ToolCallProxy(endpoint).app())
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as client:
            return await use(client)
    finally:
        await runner.cleanup()


def test_requests_without_tools_are_relayed_as_they_came_and_stream_back():
    seen = []

    async def completions(request: web.Request) -> web.StreamResponse:
        seen.append((request.path, request.headers.get("x-dynamo-session-id"),
                     request.headers.get("Authorization"), await request.read()))
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for chunk in CHUNKS:
            await out.write(chunk)
            await asyncio.sleep(0.05)  # apart: each reaches the caller as it comes
        await out.write_eof()
        return out

    async def run():
        upstream = web.Application()
        upstream.router.add_post("/v1/completions", completions)
        runner, port = await _start(upstream)

        async def use(client: aiohttp.ClientSession):
            body = b'{"model": "tiny-glm", "prompt": [1, 2], "stream": true}'
            async with client.post("/v1/completions", data=body, headers={
                    "Content-Type": "application/json", "x-dynamo-session-id": "s7",
                    "Authorization": "Bearer k", "X-Other": "dropped"}) as resp:
                got = [chunk async for chunk in resp.content.iter_any()]
                return resp.status, resp.headers["Content-Type"], got, body

        try:
            return await _through_proxy(port, use)
        finally:
            await runner.cleanup()

    status, kind, got, body = asyncio.run(run())
    assert status == 200 and kind == "text/event-stream"
    assert b"".join(got) == b"".join(CHUNKS) and len(got) >= 2  # streamed, not buffered
    assert seen == [("/v1/completions", "s7", "Bearer k", body)]


def test_a_cluster_that_does_not_answer_is_a_502_that_says_so():
    async def use(client: aiohttp.ClientSession):
        async with client.get("/v1/models") as resp:
            return resp.status, await resp.json()

    status, body = asyncio.run(_through_proxy(free_port(), use))
    assert status == 502
    assert body["error"]["message"].startswith("the serving cluster did not answer: ")
    assert "ClientConnectorError" in body["error"]["message"]
