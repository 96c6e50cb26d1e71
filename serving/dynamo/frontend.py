"""Dynamo's OpenAI frontend with its KV-aware router: the cluster's front door."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx

from rollfleet.run_dir import RunDir
from serving.config import AFFINITY, ROUTER_MODES, ServingConfig
from serving.errors import ServingError
from serving.process import ManagedProcess, free_port, port_in_use, wait_serving


def router_args(cfg: ServingConfig) -> list[str]:
    """The routing policy as frontend flags.

    `kv` scores each engine by the prompt's cached prefix there against its load. A session id
    (header `x-dynamo-session-id`) binds a session to the engine that served it: `soft` keeps
    that binding only while the engine is eligible, and an engine whose KV use passes
    `busy_threshold` is not, so its sessions move rather than queue; `hard` always pins.
    Bindings are replicated between frontends over the event plane and released by a request
    with `x-dynamo-session-final`, or after `session_ttl_s` idle.
    """
    if cfg.router_mode not in ROUTER_MODES:
        raise ServingError(f"unknown serving.router_mode {cfg.router_mode!r}; "
                           f"expected one of {ROUTER_MODES}")
    if cfg.session_affinity not in AFFINITY:
        raise ServingError(f"unknown serving.session_affinity {cfg.session_affinity!r}; "
                           f"expected one of {AFFINITY}")
    args = ["--router-mode", cfg.router_mode]
    if cfg.router_mode != "kv":
        return args
    if cfg.session_affinity != "off":
        args += ["--router-session-affinity-ttl-secs", str(cfg.session_ttl_s),
                 "--router-session-affinity-mode", cfg.session_affinity]
    if cfg.session_affinity == "soft" and 0 < cfg.busy_threshold < 1:
        args += ["--active-decode-blocks-threshold", str(cfg.busy_threshold)]
    if cfg.frontends > 1:
        args.append("--router-replica-sync")
    return args


# The frontend retries a model it cannot load (a missing tokenizer file, a bad model card) with
# a doubling wait, forever; the third failure in a row (about 3 s) is taken as final.
FATAL = (r"Model materialization failed.*attempt=([3-9]|\d\d)",)


class DynamoFrontend:
    """`python -m dynamo.frontend` on `host:port`; `start()` returns once it answers."""

    def __init__(self, name: str, cfg: ServingConfig, run_dir: Path, plane_env: dict[str, str],
                 port: int = 0, extra_args: list[str] | None = None) -> None:
        self.name, self.cfg, self.run_dir = name, cfg, run_dir
        self.plane_env = plane_env
        self.port = port or free_port(cfg.host)
        self.extra_args = list(extra_args or [])
        self.process: ManagedProcess | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.cfg.host}:{self.port}"

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "dynamo.frontend", "--http-host", self.cfg.host,
                "--http-port", str(self.port), *router_args(self.cfg), *self.extra_args]

    def start(self) -> None:
        if port_in_use(self.cfg.host, self.port):
            raise ServingError(f"port {self.port} on {self.cfg.host} is already in use; "
                               "free it or set serving.port=0 to pick a free one")
        env = {**os.environ, **self.plane_env, "PYTHONUNBUFFERED": "1"}
        self.process = ManagedProcess(f"frontend-{self.name}", self.argv(), env,
                                      RunDir(self.run_dir).log(f"frontend-{self.name}"),
                                      fatal=FATAL)

    def wait_model(self, model: str, deadline: float) -> None:
        """Block until the frontend lists `model` (a worker set for it has registered)."""
        assert self.process is not None

        def listed(http: httpx.Client) -> bool:
            data = http.get(f"{self.base_url}/v1/models").json().get("data", [])
            return any(m.get("id") == model for m in data)

        wait_serving(self.process, f"frontend {self.name}", listed, deadline,
                     f"listed model {model!r}")

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(grace_s=5)
            self.process = None
