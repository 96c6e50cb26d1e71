"""`python -m serving.serve serving=<topology>`: a serving cluster for outside clients.

Starts any topology (embedded, kv_routed, disagg, ...) and keeps it up behind an
OpenAI-compatible front (serving/serve/proxy.py: chat and completions, streaming, tools with
tool_choice auto, required or a named tool under the project's grammar, `/v1/models`) until
Ctrl-C or SIGTERM, which stop every process it started. Binds 127.0.0.1 unless `serve.host`
says otherwise.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from rollfleet.cli import ConfigError, bad_config, compose, terminate_on_sigterm
from rollfleet.paths import cache_dir
from serving.cluster import Cluster
from serving.config import ModelConfig, ServingConfig
from serving.errors import ServingError
from serving.process import port_in_use
from serving.serve.proxy import ToolCallProxy

log = logging.getLogger("serving.serve")


SHUTDOWN_GRACE_S = 5.0


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"  # the address outside clients connect to; 0.0.0.0 serves other hosts
    port: int = 8000  # the OpenAI-compatible server's port


def serve(argv: list[str]) -> int:
    try:
        cfg, groups = compose("serve", argv, {"model": ModelConfig, "serving": ServingConfig,
                                              "serve": ServeConfig})
    except ConfigError as exc:
        return bad_config(str(exc))
    model, serving, front = groups["model"], groups["serving"], groups["serve"]
    if port_in_use(front.host, front.port):
        return bad_config(f"port {front.port} on {front.host} is already in use; set serve.port")
    run_dir = Path(cfg.run_dir).absolute()  # relative paths: from where the command starts
    terminate_on_sigterm()  # unwinds like Ctrl-C: everything is stopped
    try:
        with Cluster(serving, model, run_dir, cache_dir(cfg.cache_dir)) as endpoint:
            app = ToolCallProxy(endpoint).app()
            ready = (f"serving {endpoint.model} at http://{front.host}:{front.port}/v1 "
                     f"(topology {serving.mode}; logs in {run_dir}); Ctrl-C stops it")
            # aiohttp calls `print` once the port listens: a client that waits for the line
            # never finds the port closed. Returns on Ctrl-C or SIGTERM (aiohttp takes the
            # interrupt); requests in flight get SHUTDOWN_GRACE_S, not aiohttp's 60 s.
            web.run_app(app, host=front.host, port=front.port,
                        print=lambda _: print(ready, flush=True),
                        handle_signals=False, access_log=None,
                        shutdown_timeout=SHUTDOWN_GRACE_S)
    except ServingError as exc:
        return bad_config(str(exc))
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (Terminated)
        pass  # during start-up: the cluster stopped what it had started
    print("stopped: every process this command started is stopped", file=sys.stderr)
    return 0
