"""`python -m serving.serve serving=<topology>`: a serving cluster for outside clients.

Starts any topology (embedded, kv_routed, disagg, ...) and keeps it up behind an OpenAI-compatible
front (serving/proxy.py: chat and completions, streaming, tools with tool_choice auto, required
or a named tool under the project's grammar, `/v1/models`) until Ctrl-C or SIGTERM, which stop
every process it started. Binds 127.0.0.1 unless `serve.host` says otherwise.
"""

from __future__ import annotations

import logging
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from serving.cluster import Cluster
from serving.config import ModelConfig, ServingConfig, ServingError, store_schema
from serving.process import port_in_use
from serving.proxy import ToolCallProxy

CONF = Path(__file__).resolve().parents[1] / "conf"
log = logging.getLogger("serving.serve")


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 8000


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def serve(argv: list[str]) -> int:
    store_schema("model", ModelConfig)
    store_schema("serving", ServingConfig)
    try:
        with initialize_config_dir(str(CONF), version_base="1.3"):
            cfg = compose("serve", overrides=argv)
        model = OmegaConf.to_object(cfg.model)
        serving = OmegaConf.to_object(cfg.serving)
        front = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ServeConfig),
                                                    cfg.serve))
    except (HydraException, OmegaConfBaseException) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    if port_in_use(front.host, front.port):
        print(f"error: port {front.port} on {front.host} is already in use; "
              "set serve.port", file=sys.stderr)
        return 2
    run_dir = Path(cfg.run_dir).absolute()  # relative paths: from where the command starts
    cache = Path(cfg.cache_dir).absolute() if cfg.cache_dir else CONF.parent / ".cache"
    signal.signal(signal.SIGTERM, _interrupt)  # unwinds like Ctrl-C: everything is stopped
    try:
        with Cluster(serving, model, run_dir, cache) as endpoint:
            app = ToolCallProxy(endpoint).app()
            print(f"serving {endpoint.model} at http://{front.host}:{front.port}/v1 "
                  f"(topology {serving.mode}; logs in {run_dir}); Ctrl-C stops it", flush=True)
            # returns on Ctrl-C or SIGTERM (aiohttp takes the KeyboardInterrupt)
            web.run_app(app, host=front.host, port=front.port, print=None,
                        handle_signals=False, access_log=None)
    except ServingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass  # during start-up: the cluster stopped what it had started
    print("stopped: every process this command started is stopped", file=sys.stderr)
    return 0

if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    sys.exit(serve(sys.argv[1:]))
