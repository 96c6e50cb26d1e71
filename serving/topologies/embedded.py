"""`serving=embedded`: one vLLM OpenAI server on loopback."""

from __future__ import annotations

import json
import logging

from serving.endpoint import EngineSlot
from serving.kvtier import kv_transfer_config
from serving.policy import EngineControl, VllmControl
from serving.topologies.base import Started, Topology
from serving.vllm_engine import VllmEngine

log = logging.getLogger(__name__)


class Embedded(Topology):
    name = "embedded"

    engine: VllmEngine | None = None

    def start(self) -> Started:
        w = self.where
        transfer = kv_transfer_config(w.serving, "agg", w.kv_tier)
        self.engine = VllmEngine("0", w.model_dir, w.model, w.serving, w.run_dir, w.cache_dir,
                                 port=w.serving.port, extra_args=[
                                     "--kv-transfer-config", json.dumps(transfer)]
                                 if transfer else [])
        log.info("starting vLLM engine 0 on %s (model %s)", self.engine.base_url, w.model_dir)
        self.engine.start()
        url = self.engine.base_url
        return Started(url, [EngineSlot("0", "agg", f"{url}/metrics")])

    def controls(self) -> list[EngineControl]:
        assert self.engine is not None
        return [VllmControl("0", self.engine.base_url, self.where.serving.request_timeout_s)]

    def stop(self) -> None:
        if self.engine is not None:
            log.info("stopping engine 0")
            self.engine.stop()
            self.engine = None
