"""One vLLM OpenAI-compatible server process on loopback, started and stopped by the job."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

from rollfleet.run_dir import RunDir
from serving.config import LOGPROBS_MODES, ModelConfig, ServingConfig
from serving.engine.plugin import (
    BEHAVIOUR_LOGPROBS_ENV,
    CPU_SEEDS_ENV,
    FORK_ENGINE_CORE_ENV,
    GRAMMAR_RESUME_ENV,
    SAFE_GRAMMARS_ENV,
    UNMASKED_LOGPROBS_ENV,
    WEIGHT_UPDATES_ENV,
)
from serving.errors import ServingError
from serving.policy import DEV_MODE_ENV
from serving.process import (
    ManagedProcess,
    free_port,
    port_in_use,
    socket_folder,
    wait_serving,
)
from serving.weight_transfer import BACKEND as TRANSFER_BACKEND


def engine_args(m: ModelConfig, c: ServingConfig) -> list[str]:
    """vLLM engine flags shared by the plain server and Dynamo's vLLM worker."""
    args = [
        "--dtype", m.dtype, "--max-model-len", str(m.max_model_len),
        "--seed", str(c.seed), "--generation-config", "auto",
        "--structured-outputs-config",
        json.dumps({"backend": "xgrammar", "disable_any_whitespace": True}),
        "--enable-prefix-caching" if c.enable_prefix_caching else "--no-enable-prefix-caching",
        "--logprobs-mode", LOGPROBS_MODES[c.logprobs],
        # weights straight from a trainer's ranks (serving/weight_transfer.py)
        "--weight-transfer-config", json.dumps({"backend": TRANSFER_BACKEND}),
    ]
    if c.enforce_eager:
        args.append("--enforce-eager")
    if c.routed_experts:
        args.append("--enable-return-routed-experts")
    return args


def engine_env(c: ServingConfig, cache: Path, scratch: Path) -> dict[str, str]:
    """Environment of an engine process: bounded KV space, caches under the project, offline,
    and its temp files in `scratch`, a folder its owner removes: in the system temp folder vLLM
    left 3 ZMQ socket files per engine start and a `vllm_dist_*` file store, for good."""
    env = dict(os.environ)
    env.update({
        "TMPDIR": str(scratch),  # vLLM's ZMQ sockets and file stores go to tempfile.gettempdir()
        "VLLM_CPU_KVCACHE_SPACE": str(c.kv_cache_gib),
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "TRITON_CACHE_DIR": str(cache / "triton"),
        "HF_HOME": str(cache / "hf"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_HOST_IP": c.host,
        "PYTHONUNBUFFERED": "1",
        SAFE_GRAMMARS_ENV: "1",  # see serving/engine/plugin.py
        GRAMMAR_RESUME_ENV: "1",
        # vLLM's routes for pausing, cache resets and new weights (serving/policy.py); the
        # server binds loopback unless configured otherwise
        DEV_MODE_ENV: "1",
        WEIGHT_UPDATES_ENV: "1",  # see serving/engine/plugin.py
    })
    if c.device == "cpu":
        env["VLLM_TARGET_DEVICE"] = "cpu"
        # The model runs inside the engine-core process (vLLM's `uni` executor) instead of a
        # third process: one vLLM import fewer per engine. Measured here, 2026-12-02, one
        # embedded engine twice each way (an ad-hoc script, same greedy tokens): start 60-68 s
        # with the worker process, 41-44 s without; decoding alike.
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        env[FORK_ENGINE_CORE_ENV] = "1"  # see serving/engine/plugin.py
        env[CPU_SEEDS_ENV] = "1"
    # see serving/engine/plugin.py
    env[BEHAVIOUR_LOGPROBS_ENV if c.logprobs == "behaviour" else UNMASKED_LOGPROBS_ENV] = "1"
    env.update(c.extra_env)
    return env


class VllmEngine:
    """A `vllm` API server for one model; `start()` returns once `/health` answers."""

    def __init__(self, engine_id: str, model_dir: Path, model: ModelConfig, cfg: ServingConfig,
                 run_dir: Path, cache_dir: Path, port: int = 0,
                 extra_args: list[str] | None = None, extra_env: dict[str, str] | None = None):
        self.engine_id = engine_id
        self.model_dir = model_dir
        self.model = model
        self.cfg = cfg
        self.run_dir = run_dir
        self.cache_dir = cache_dir
        self.port = port or free_port(cfg.host)
        self.extra_args = list(extra_args or [])
        self.extra_env = dict(extra_env or {})
        self.process: ManagedProcess | None = None
        self.sockets: Path | None = None  # its temp files (ZMQ sockets, ...), while it runs

    @property
    def base_url(self) -> str:
        return f"http://{self.cfg.host}:{self.port}"

    def argv(self) -> list[str]:
        m, c = self.model, self.cfg
        args = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir), "--served-model-name", m.name,
            "--host", c.host, "--port", str(self.port),
            *engine_args(m, c),
            "--enable-auto-tool-choice", "--tool-call-parser", m.tool_call_parser,
            "--tool-strict-level", "parameter",
            "--disable-uvicorn-access-log", "--enable-prompt-tokens-details",
        ]
        if m.reasoning_parser:
            args += ["--reasoning-parser", m.reasoning_parser]
        return args + list(m.extra_args) + list(c.extra_args) + self.extra_args

    def env(self, scratch: Path) -> dict[str, str]:
        return {**engine_env(self.cfg, self.cache_dir, scratch), **self.extra_env}

    def start(self) -> None:
        if port_in_use(self.cfg.host, self.port):
            raise ServingError(f"port {self.port} on {self.cfg.host} is already in use; "
                               "free it or set serving.port=0 to pick a free one")
        log = RunDir(self.run_dir).log(f"engine-{self.engine_id}")
        self.sockets = socket_folder("vllm")
        self.process = ManagedProcess(f"vllm-{self.engine_id}", self.argv(),
                                      self.env(self.sockets), log)
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        assert self.process is not None
        wait_serving(self.process, f"engine {self.engine_id}",
                     lambda http: http.get(f"{self.base_url}/health").status_code == 200,
                     time.monotonic() + self.cfg.startup_timeout_s,
                     f"healthy in {self.cfg.startup_timeout_s:.0f}s")

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None
        if self.sockets is not None:
            shutil.rmtree(self.sockets, ignore_errors=True)
            self.sockets = None
