"""`python -m serving.serve` for outside clients, driven with the openai SDK (no fakes)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from serving.process import free_port
from tests.procs import new_job_processes, process_table

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e
TOOLS = [{"type": "function", "function": {  # no maxLength: the front bounds it to fit
    "name": "get_weather", "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False}}}]


@pytest.mark.parametrize("topology", [["serving=embedded"],
                                      ["serving=kv_routed", "serving.discovery=etcd"]],
                         ids=["embedded", "kv_routed_on_etcd_and_nats"])
def test_outside_clients_get_chat_streams_and_valid_tool_calls(topology, tmp_path):
    """The kv_routed server runs as a deployment would, discovery in etcd and events over NATS
    (both started on loopback): its workers are found only through them."""
    before = process_table()
    port = free_port("127.0.0.1")
    proc = subprocess.Popen([sys.executable, "-m", "serving.serve", *topology,
                             f"serve.port={port}", f"run_dir={tmp_path}"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        while line and "serving tiny-glm at" not in line:
            line = proc.stdout.readline()
        assert f"http://127.0.0.1:{port}/v1" in line, line
        if "serving.discovery=etcd" in topology:  # (on loopback: serving/dynamo/test_plane.py)
            ours = [cmd.split(" ")[0] for cmd in process_table().values() if str(tmp_path) in cmd]
            assert any(c.endswith("/etcd") for c in ours), ours
            assert any(c.endswith("/nats-server") for c in ours), ours
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        assert [m.id for m in client.models.list().data] == ["tiny-glm"]
        # Seeded: unseeded random-weights text can merge partial UTF-8 tokens into one chunk.
        chat = client.chat.completions.create(
            model="tiny-glm", messages=[{"role": "user", "content": "hello"}], max_tokens=8,
            seed=0)
        assert chat.usage.completion_tokens == 8 and chat.choices[0].finish_reason == "length"
        chunks = list(client.chat.completions.create(
            model="tiny-glm", messages=[{"role": "user", "content": "hello"}], max_tokens=8,
            seed=0, stream=True))
        deltas = [c.choices[0].delta.content for c in chunks if c.choices]
        assert sum(bool(d) for d in deltas) >= 2  # streamed as it is sampled
        assert "".join(d or "" for d in deltas) == chat.choices[0].message.content
        for seed in range(3):  # Dynamo's own frontend answered free text here, 3 of 3
            req = client.chat.completions.create(
                model="tiny-glm", messages=[{"role": "user", "content": "weather in Oslo?"}],
                tools=TOOLS, tool_choice="required", max_tokens=400, seed=seed)
            [call] = req.choices[0].message.tool_calls
            assert req.choices[0].finish_reason == "tool_calls"
            assert call.function.name == "get_weather"
            assert set(json.loads(call.function.arguments)) == {"city"}
        history = [{"role": "user", "content": "weather in Oslo?"},
                   req.choices[0].message.model_dump(exclude_none=True),
                   {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
        auto = client.chat.completions.create(model="tiny-glm", messages=history, tools=TOOLS,
                                              tool_choice="auto", max_tokens=400)
        for c in auto.choices[0].message.tool_calls or []:  # a call, if any, is valid
            assert c.function.name == "get_weather" and "city" in json.loads(c.function.arguments)
        named = list(client.chat.completions.create(
            model="tiny-glm", messages=[{"role": "user", "content": "weather?"}], tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            max_tokens=400, stream=True))
        deltas = [d for c in named if c.choices for d in c.choices[0].delta.tool_calls or []]
        assert [d.function.name for d in deltas] == ["get_weather"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    time.sleep(1)
    assert new_job_processes(before) == []

