"""`python -m serving.serve` for outside clients, driven with the openai SDK (no fakes).

Each topology's server is started as the README types it, from a working directory other
than the project's, with its default run folder (relative: resolved where it starts)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import openai
import pytest
from jsonschema import Draft202012Validator

from serving.process import free_port
from serving.toolcall.grammar import MARKUP
from tests.procs import new_job_processes, process_table

pytestmark = pytest.mark.e2e
CITY = {"type": "function", "function": {  # no maxLength: the front bounds it to fit
    "name": "get_weather", "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {  # integers without bounds (issue 23's example)
    "name": "add", "parameters": {"type": "object", "properties": {
        "a": {"type": "integer"}, "b": {"type": "integer"}}}}}
NOT = {"type": "function", "function": {"name": "odd", "parameters": {
    "type": "object", "properties": {"x": {"not": {"type": "string"}}}}}}


def _valid(call, tools) -> bool:
    [tool] = [t for t in tools if t["function"]["name"] == call.function.name]
    validator = Draft202012Validator(tool["function"]["parameters"],
                                     format_checker=Draft202012Validator.FORMAT_CHECKER)
    return validator.is_valid(json.loads(call.function.arguments))


@pytest.mark.parametrize("topology", [["serving=embedded"],
                                      ["serving=kv_routed", "serving.discovery=etcd"],
                                      ["serving=disagg"]],
                         ids=["embedded", "kv_routed_on_etcd_and_nats", "disagg"])
def test_outside_clients_get_chat_streams_and_valid_tool_calls(topology, tmp_path):
    """Every topology the README serves. The kv_routed server runs as a deployment would,
    discovery in etcd and events over NATS (both started on loopback): its workers are found
    only through them."""
    before = process_table()
    port = free_port("127.0.0.1")
    proc = subprocess.Popen([sys.executable, "-m", "serving.serve", *topology,
                             f"serve.port={port}"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen = [proc.stdout.readline()]
        while seen[-1] and "serving tiny-glm at" not in seen[-1]:
            seen.append(proc.stdout.readline())
        line = seen[-1]
        assert f"http://127.0.0.1:{port}/v1" in line, "".join(seen)[-3000:]
        [run_dir] = (tmp_path / "runs" / "serve").iterdir()  # the default, relative folder
        assert f"logs in {run_dir}" in line
        if "serving.discovery=etcd" in topology:  # (on loopback: serving/dynamo/test_plane.py)
            ours = [cmd.split(" ")[0] for cmd in process_table().values() if str(run_dir) in cmd]
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
        for seed, tools in enumerate([[CITY], [CITY], [ADD, CITY]]):
            # Dynamo's own frontend answered free text here, 3 of 3
            req = client.chat.completions.create(
                model="tiny-glm", messages=[{"role": "user", "content": "weather in Oslo?"}],
                tools=tools, tool_choice="required", max_tokens=400, seed=seed)
            [call] = req.choices[0].message.tool_calls
            assert req.choices[0].finish_reason == "tool_calls" and _valid(call, tools)
        added = client.chat.completions.create(
            model="tiny-glm", messages=[{"role": "user", "content": "2 + 2?"}], tools=[ADD],
            tool_choice="required", max_tokens=200, temperature=1.0)
        assert _valid(added.choices[0].message.tool_calls[0], [ADD])
        history = [{"role": "user", "content": "weather in Oslo?"},
                   req.choices[0].message.model_dump(exclude_none=True),
                   {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
        for seed in range(3):  # auto: calls valid and announced, or text with no markup
            auto = client.chat.completions.create(
                model="tiny-glm", messages=history, tools=[CITY, ADD], tool_choice="auto",
                max_tokens=200, seed=seed)
            choice = auto.choices[0]
            calls = choice.message.tool_calls or []
            assert all(_valid(c, [CITY, ADD]) for c in calls)
            assert choice.finish_reason == "tool_calls" if calls else choice.finish_reason in (
                "stop", "length")
            assert not any(m in (choice.message.content or "") for m in MARKUP)
        named = list(client.chat.completions.create(
            model="tiny-glm", messages=[{"role": "user", "content": "weather?"}],
            tools=[CITY, ADD], tool_choice={"type": "function", "function": {"name": "add"}},
            max_tokens=400, stream=True))
        deltas = [d for c in named if c.choices for d in c.choices[0].delta.tool_calls or []]
        assert [d.function.name for d in deltas] == ["add"]
        with pytest.raises(openai.BadRequestError, match="'not' cannot be enforced"):
            client.chat.completions.create(
                model="tiny-glm", messages=[{"role": "user", "content": "x"}], tools=[NOT],
                tool_choice="required", max_tokens=100)
    finally:
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=120)
    assert "stopped: every process this command started is stopped" in rest
    time.sleep(1)
    assert new_job_processes(before) == []


def test_a_broken_model_folder_fails_fast_with_its_cause(tmp_path):
    """A model folder whose weights file is truncated: the error names the file, within
    seconds, and nothing was started."""
    import shutil

    from rollfleet.paths import ROOT
    from serving.tiny_model import ensure_tiny_glm

    model = shutil.copytree(ensure_tiny_glm(ROOT / ".cache" / "models"),
                            tmp_path / "model")
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    before = process_table()
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "serving.serve", "serving=kv_routed",
                           f"model.path={model}", f"serve.port={free_port('127.0.0.1')}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert f"weight file {weights} cannot be read" in proc.stderr
    assert time.monotonic() - start < 30
    assert new_job_processes(before) == []
