"""Simulated engines: NVIDIA Dynamo's mocker (`python -m dynamo.mocker`) behind the real frontend.

A mocker worker registers with Dynamo like a vLLM worker (KV blocks, prefix caching, KV events
for the router, preemptions, vLLM-named Prometheus metrics on its system port) but runs no
model: its timing is simulated (`serving.speedup_ratio` divides it) and its tokens are random ids.
Random ids never make a tool call, so the mocker can answer from a response replay trace
instead (`serving.replay_trace`): a Mooncake-format JSONL whose lines carry `output_token_ids`,
each keyed by its `request_id`, else `<session_id>:<n>` for the n-th line of that session id.
A request picks its line with the annotation `output_replay_id:<key>` (Dynamo 1.6.1: the
session header alone selects nothing, and a replayed answer has the line's length whatever
`max_tokens` says). The `dynamo_replay` front door (serving/frontdoor.py) sends
`<session id>:<turn>` as that key, the session id being the one the rollout already sends in
`x-dynamo-session-id`.

The mocker reports no `vllm:cache_config_info`, so KV-budget admission cannot size itself from
it: run the job with `rollout.admission=fixed`.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import httpx

from serving.config import ModelConfig, ServingConfig
from serving.dynamo.worker import DynamoWorker, _instance_id
from serving.errors import ServingError
from serving.process import wait_serving


class MockerWorker(DynamoWorker):
    """One `python -m dynamo.mocker` process serving one simulated engine."""

    def __init__(self, name: str, role: str, model_dir: Path, model: ModelConfig,
                 cfg: ServingConfig, run_dir: Path, cache_dir: Path, plane_env: dict[str, str],
                 core: int | None = None) -> None:
        if role != "agg":
            raise ServingError(f"the mocker topology runs aggregated workers only, not {role!r}")
        super().__init__(name, role, model_dir, model, cfg, run_dir, cache_dir, plane_env, core)

    def argv(self) -> list[str]:
        m, c = self.model, self.cfg
        args = [sys.executable, "-m", "dynamo.mocker", "--model-path", str(self.model_dir),
                "--model-name", m.name, "--max-model-len", str(m.max_model_len),
                "--speedup-ratio", str(c.speedup_ratio)]
        if not c.enable_prefix_caching:
            args.append("--no-enable-prefix-caching")
        if c.replay_trace:
            args += ["--response-replay-trace-path", str(replay_trace(c))]
        return args + list(c.extra_args)

    def wait_ready(self, deadline: float, abort: threading.Event | None = None) -> None:
        """Block until the `generate` endpoint is ready (a mocker's overall `/health` status
        stays `notready` in Dynamo 1.6.1), then learn its Dynamo instance id."""
        assert self.process is not None

        def ready(http: httpx.Client) -> bool:
            health = http.get(f"http://{self.cfg.host}:{self.system_port}/health")
            if health.json().get("endpoints", {}).get("generate") != "ready":
                return False
            self.instance_id = _instance_id(http.get(self.metrics_url).text)
            return bool(self.instance_id)

        wait_serving(self.process, f"mocker {self.name}", ready, deadline,
                     f"ready in {self.cfg.startup_timeout_s:.0f}s", abort)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DYN_")}
        env.update(self.plane_env)
        env.update({"DYN_SYSTEM_PORT": str(self.system_port), "PYTHONUNBUFFERED": "1"})
        env.update(self.cfg.extra_env)
        return env


def replay_trace(cfg: ServingConfig) -> Path:
    """The configured trace, checked before any process starts."""
    path = Path(cfg.replay_trace or "").expanduser().resolve()
    if not path.is_file():
        raise ServingError(f"serving.replay_trace={cfg.replay_trace}: no such file (a Mooncake "
                           "JSONL with output_token_ids per line)")
    return path


def trace_line(session_id: str, token_ids: list[int]) -> dict[str, Any]:
    """One trace line: the completion a session's next turn replays (lines of one session id
    are its turns, in order)."""
    return {"session_id": session_id, "output_length": len(token_ids),
            "output_token_ids": [int(t) for t in token_ids]}


def write_trace(path: Path, lines: list[dict[str, Any]]) -> None:
    with path.open("w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
