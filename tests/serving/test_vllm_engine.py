"""The flags and environment every engine gets (the running engines are checked in tests/e2e)."""

import json
import re
from pathlib import Path

from serving.config import ModelConfig, ServingConfig
from serving.dynamo import worker as worker_module
from serving.dynamo.plane import SOCKETS_ENV
from serving.dynamo.worker import DynamoWorker
from serving.engine.plugin import BEHAVIOUR_LOGPROBS_ENV, UNMASKED_LOGPROBS_ENV
from serving.vllm_engine import VllmEngine


def _flag(argv, name):
    return argv[argv.index(name) + 1]


def test_behaviour_logprobs_are_vllms_processed_ones_with_the_plugins_greedy_fix(tmp_path):
    engine = VllmEngine("0", Path("/m"), ModelConfig(), ServingConfig(), tmp_path, tmp_path,
                        port=9)
    argv, env = engine.argv(), engine.env(tmp_path / "sockets")
    assert _flag(argv, "--logprobs-mode") == "processed_logprobs"
    assert env[BEHAVIOUR_LOGPROBS_ENV] == "1" and UNMASKED_LOGPROBS_ENV not in env
    assert _flag(argv, "--host") == "127.0.0.1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    # vLLM's temp files (ZMQ sockets, file stores) go to a folder the engine removes
    assert env["TMPDIR"] == str(tmp_path / "sockets")


def test_raw_logprobs_are_asked_for_and_unmasked_by_the_plugin(tmp_path):
    cfg = ServingConfig(logprobs="raw")
    engine = VllmEngine("0", Path("/m"), ModelConfig(), cfg, tmp_path, tmp_path, port=9)
    assert _flag(engine.argv(), "--logprobs-mode") == "raw_logprobs"
    env = engine.env(tmp_path)
    assert env[UNMASKED_LOGPROBS_ENV] == "1" and BEHAVIOUR_LOGPROBS_ENV not in env


def test_dynamo_workers_get_the_same_engine_flags(tmp_path):
    worker = DynamoWorker("decode0", "decode", Path("/m"), ModelConfig(), ServingConfig(),
                          tmp_path / "a-run-folder-of-any-depth", tmp_path,
                          {SOCKETS_ENV: "/tmp/rollfleet-x"})
    argv, env = worker.argv(), worker.env()
    assert _flag(argv, "--logprobs-mode") == "processed_logprobs"
    assert env[BEHAVIOUR_LOGPROBS_ENV] == "1"
    assert _flag(argv, "--disaggregation-mode") == "decode"
    # unix socket paths stay short whatever the run folder (sun_path holds 107 bytes)
    assert json.loads(_flag(argv, "--kv-events-config"))["endpoint"] == (
        "ipc:///tmp/rollfleet-x/kv-events-decode0")
    assert env["TMPDIR"] == "/tmp/rollfleet-x"  # removed with the control plane
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"


def test_a_dynamo_workers_listening_ports_are_not_ones_an_outgoing_connection_can_take(
        tmp_path):
    """The kernel hands outgoing connections ports from 32768 up: a listener's port picked
    there early can be taken before the worker binds it (CI: NIXL's handshake thread died on
    "Address already in use" and the worker hung unready for 300 s). Such a line now fails the
    start at once."""
    workers = [DynamoWorker(f"prefill{i}", "prefill", Path("/m"), ModelConfig(),
                            ServingConfig(), tmp_path, tmp_path, {SOCKETS_ENV: "/tmp/x"})
               for i in range(20)]
    ports = [p for w in workers for p in (w.system_port, w.nixl_port)]
    assert max(ports) < 32768 and len(set(ports)) == len(ports)
    assert int(workers[0].env()["VLLM_NIXL_SIDE_CHANNEL_PORT"]) == workers[0].nixl_port
    line = "zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:48919')"
    assert any(re.search(p, line) for p in worker_module.FATAL)
