"""`serving=external`: an OpenAI-compatible server someone else runs, at serving.base_url."""

from __future__ import annotations

import logging

import httpx

from serving.endpoint import EngineSlot
from serving.errors import ServingError
from serving.metrics import MetricsError, kv_state
from serving.policy import EngineControl, VllmControl
from serving.topologies.base import Started, Topology

log = logging.getLogger(__name__)


class External(Topology):
    name = "external"
    takes_kv_tier = False
    declares_version = False  # not ours: it may not have the routes until an update needs them

    def check(self) -> None:
        if not (self.where.serving.base_url or "").rstrip("/"):
            raise ServingError("serving.mode=external needs serving.base_url "
                               "(e.g. serving.base_url=http://127.0.0.1:8000/v1)")

    def start(self) -> Started:
        serving, model = self.where.serving, self.where.model
        url = (serving.base_url or "").rstrip("/")
        headers = {"Authorization": f"Bearer {serving.api_key}"}
        try:
            resp = httpx.get(f"{url}/models", headers=headers, timeout=10.0)
            resp.raise_for_status()
        except httpx.HTTPError as exc:
            raise ServingError(f"external server {url} does not answer: "
                               f"{type(exc).__name__}: {exc}") from None
        served = [m["id"] for m in resp.json().get("data", [])]
        if served and model.name not in served:
            raise ServingError(f"external server {url} does not serve model "
                               f"{model.name!r}; it serves {served}")
        root = url.removesuffix("/v1")
        # A vLLM server's /metrics give the KV-budget admission its cache size and use and the
        # summary its prefix-cache hits; a server without them is admitted by group only.
        metrics = f"{root}/metrics"
        try:
            kv_state(metrics)
        except MetricsError as exc:
            log.info("external server: no vLLM KV metrics (%s); rollout.admission=kv_budget "
                     "admits one group at a time", exc)
            metrics = ""
        return Started(root, [EngineSlot("external", "agg", metrics)])

    def controls(self) -> list[EngineControl]:
        """A vLLM server started with VLLM_SERVER_DEV_MODE=1 takes new weights; others answer
        404, which the update reports."""
        root = (self.where.serving.base_url or "").rstrip("/").removesuffix("/v1")
        return [VllmControl("external", root, self.where.serving.request_timeout_s)]

    def stop(self) -> None:
        pass  # nothing of ours runs
