"""One Dynamo vLLM worker (`python -m dynamo.vllm`): aggregated, prefill-only or decode-only."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import httpx

from rollfleet.run_dir import RunDir
from serving.config import ModelConfig, ServingConfig
from serving.dynamo.plane import SOCKETS_ENV
from serving.engine.plugin import NIXL_PROGRESS_DELAY_ENV
from serving.errors import ServingError
from serving.kvtier import kv_transfer_config
from serving.process import ManagedProcess, free_port, wait_serving
from serving.vllm_engine import engine_args, engine_env

ROLES = ("agg", "prefill", "decode")
NIXL_PROGRESS_DELAY_US = 1000  # CPU hosts: NIXL's progress thread sleeps 1 ms between polls

# log lines after which a worker never becomes ready although it keeps running: a listener
# thread (NIXL's handshake) that could not bind dies alone
FATAL = (r"ZMQError: Address already in use",)


class DynamoWorker:
    """A vLLM engine registered with Dynamo; `start()` returns once it serves its endpoints.

    KV events go to the router over an ipc socket (vLLM publishes nothing on a tcp loopback
    address), prefill/decode workers move KV with NIXL over UCX on loopback, and the worker's
    system port serves `/health` and vLLM's Prometheus `/metrics`.
    """

    def __init__(self, name: str, role: str, model_dir: Path, model: ModelConfig,
                 cfg: ServingConfig, run_dir: Path, cache_dir: Path, plane_env: dict[str, str],
                 core: int | None = None, kv_tier: dict | None = None) -> None:
        if role not in ROLES:
            raise ServingError(f"unknown worker role {role!r}; expected one of {ROLES}")
        self.name, self.role = name, role
        self.model_dir, self.model, self.cfg = model_dir, model, cfg
        self.run_dir, self.cache_dir = run_dir, cache_dir
        self.plane_env = plane_env
        self.core = core
        self.kv_tier = kv_tier  # the KV tier's connector settings (serving/kvtier/), if any
        # Both below the kernel's ephemeral ports (32768 up): a port from there can be taken by
        # any outgoing connection before the worker binds it (CI: the NIXL side channel's bind
        # failed, "Address already in use", and the worker hung unready). Dynamo reads the
        # system port as an i16 besides.
        self.system_port = free_port(cfg.host, below=32768)
        self.nixl_port = free_port(cfg.host, below=32768)
        self.instance_id = ""  # Dynamo's worker id (hex), known once it has registered
        self.retired = False  # being stopped or replaced: nobody should restart it
        self.process: ManagedProcess | None = None

    @property
    def metrics_url(self) -> str:
        return f"http://{self.cfg.host}:{self.system_port}/metrics"

    def argv(self) -> list[str]:
        m, c = self.model, self.cfg
        sockets = Path(self.plane_env[SOCKETS_ENV])
        events = {"enable_kv_cache_events": True, "publisher": "zmq", "topic": "kv-events",
                  "endpoint": f"ipc://{sockets / f'kv-events-{self.name}'}"}
        args = [sys.executable, "-m", "dynamo.vllm", "--model", str(self.model_dir),
                "--served-model-name", m.name, *engine_args(m, c),
                "--kv-events-config", json.dumps(events),
                "--dyn-tool-call-parser", m.tool_call_parser]
        if m.reasoning_parser:
            args += ["--dyn-reasoning-parser", m.reasoning_parser]
        if c.tensor_parallel > 1:
            args += ["--tensor-parallel-size", str(c.tensor_parallel)]
        if c.data_parallel > 1:
            args += ["--data-parallel-size", str(c.data_parallel)]
        if c.kv_cache_dtype != "auto":
            args += ["--kv-cache-dtype", c.kv_cache_dtype]
        if self.role != "agg":
            args += ["--disaggregation-mode", self.role]
        transfer = kv_transfer_config(c, self.role, self.kv_tier)
        if transfer is not None:
            args += ["--kv-transfer-config", json.dumps(transfer)]
        role_args = {"prefill": c.prefill_args, "decode": c.decode_args}.get(self.role, [])
        return args + list(m.extra_args) + list(c.extra_args) + list(role_args)

    def env(self) -> dict[str, str]:
        env = engine_env(self.cfg, self.cache_dir, Path(self.plane_env[SOCKETS_ENV]))
        env.update(self.plane_env)
        env.update({
            "DYN_SYSTEM_PORT": str(self.system_port),
            "VLLM_NIXL_SIDE_CHANNEL_HOST": self.cfg.host,
            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(self.nixl_port),
            # After deregistering, a stopping worker keeps serving this long (Dynamo's default
            # is 5 s) so that routers elsewhere see it leave first. Ours are on this host and
            # see it within milliseconds, and the cluster stops its frontends first.
            "DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS": "1",
        })
        if self.cfg.device == "cpu":
            env.update({"UCX_TLS": "tcp,self,sm", "UCX_NET_DEVICES": "lo"})
            if self.role != "agg":  # see serving/engine/plugin.py
                env[NIXL_PROGRESS_DELAY_ENV] = str(NIXL_PROGRESS_DELAY_US)
            if self.core is not None:
                env["VLLM_CPU_OMP_THREADS_BIND"] = str(self.core)
        return env

    def start(self) -> None:
        self.process = ManagedProcess(f"dynamo-{self.name}", self.argv(), self.env(),
                                      RunDir(self.run_dir).log(f"worker-{self.name}"),
                                      fatal=FATAL)

    def wait_ready(self, deadline: float, abort: threading.Event | None = None) -> None:
        """Block until the worker's endpoints are ready, then learn its Dynamo instance id."""
        assert self.process is not None

        def ready(http: httpx.Client) -> bool:
            health = http.get(f"http://{self.cfg.host}:{self.system_port}/health")
            body = health.json() if health.status_code == 200 else {}
            endpoints = body.get("endpoints", {})
            if body.get("status") != "ready" or endpoints.get("generate") != "ready":
                return False
            self.instance_id = _instance_id(http.get(self.metrics_url).text)
            return True

        wait_serving(self.process, f"worker {self.name}", ready, deadline,
                     f"ready in {self.cfg.startup_timeout_s:.0f}s", abort)

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def stop(self) -> None:
        self.retired = True  # from now on, a missing registration is expected
        if self.process is not None:
            self.process.stop()
            self.process = None


def _instance_id(metrics: str) -> str:
    marker = 'worker_id="'
    at = metrics.find(marker)
    return metrics[at + len(marker):metrics.index('"', at + len(marker))] if at >= 0 else ""
