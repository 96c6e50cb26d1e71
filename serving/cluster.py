"""The serving cluster as one context manager: start everything, hand out an Endpoint, stop all."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from serving.config import MODES, ModelConfig, ServingConfig, ServingError
from serving.dynamo.frontend import DynamoFrontend
from serving.dynamo.mocker import MockerWorker, ReplayFrontDoor, replay_trace
from serving.dynamo.plane import ControlPlane
from serving.dynamo.watchdog import DeregistrationWatchdog
from serving.dynamo.worker import DynamoWorker
from serving.endpoint import Endpoint
from serving.kvtier import MooncakeTier, kv_transfer_config
from serving.metrics import MetricsError, kv_state
from serving.model_dir import resolve_model_dir, tokenizer_markup_ids
from serving.vllm_engine import VllmEngine

log = logging.getLogger(__name__)


def worker_roles(serving: ServingConfig) -> list[tuple[str, str]]:
    """(name, role) of every worker the topology runs."""
    if serving.mode in ("kv_routed", "mocker"):
        if serving.engines < 1:
            raise ServingError(f"serving.engines must be >= 1, got {serving.engines}")
        return [(f"agg{i}", "agg") for i in range(serving.engines)]
    if serving.prefill_engines < 1 or serving.decode_engines < 1:
        raise ServingError("serving=disagg needs prefill_engines >= 1 and decode_engines >= 1, "
                           f"got {serving.prefill_engines} and {serving.decode_engines}")
    return ([(f"prefill{i}", "prefill") for i in range(serving.prefill_engines)]
            + [(f"decode{i}", "decode") for i in range(serving.decode_engines)])


def _stop_together(stops: list[Callable[[], None]]) -> None:
    """Run every stop at once and wait for all; the first failure is raised after all ran."""
    errors: list[BaseException] = []

    def run(stop) -> None:
        try:
            stop()
        except BaseException as exc:  # noqa: BLE001 - re-raised below, after the others
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(stop,), daemon=True) for stop in stops]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def _gpus() -> int:
    if not shutil.which("nvidia-smi"):
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


class Cluster:
    """`with Cluster(...) as endpoint:` runs the configured servers for the block's duration."""

    def __init__(self, serving: ServingConfig, model: ModelConfig, run_dir: Path,
                 cache_dir: Path) -> None:
        if serving.mode not in MODES:
            raise ServingError(f"unknown serving.mode {serving.mode!r}; expected one of {MODES}")
        self.serving = serving
        self.model = model
        # absolute, so that every process started (cwd or HOME elsewhere) finds the same files
        self.run_dir = run_dir.absolute()
        self.cache_dir = cache_dir.absolute()
        self.markup_ids: dict[str, int] = {}
        self.engines: list[VllmEngine] = []
        self.plane: ControlPlane | None = None
        self.workers: list[DynamoWorker] = []
        self.frontends: list[DynamoFrontend] = []
        self.endpoint: Endpoint | None = None
        self.watchdog: DeregistrationWatchdog | None = None
        self.kv_tier: MooncakeTier | None = None
        self._stopping = threading.Event()
        self._restarting = threading.Lock()

    def __enter__(self) -> Endpoint:
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    def _start(self) -> Endpoint:
        model_dir = resolve_model_dir(self.model, self.cache_dir)
        self.markup_ids = tokenizer_markup_ids(model_dir)
        if self.serving.mode == "external":
            return self._external(model_dir)
        self._start_kv_tier()
        if self.serving.mode in ("kv_routed", "disagg", "mocker"):
            return self._dynamo(model_dir)
        transfer = kv_transfer_config(self.serving, "agg", self._tier_settings())
        engine = VllmEngine("0", model_dir, self.model, self.serving, self.run_dir,
                            self.cache_dir, port=self.serving.port, extra_args=[
                                "--kv-transfer-config", json.dumps(transfer)] if transfer else [])
        self.engines.append(engine)
        log.info("starting vLLM engine %s on %s (model %s)", engine.engine_id, engine.base_url,
                 model_dir)
        engine.start()
        return self._endpoint(model_dir, f"{engine.base_url}/v1", "vllm",
                              engine_ids=(engine.engine_id,),
                              metrics_urls={engine.engine_id: f"{engine.base_url}/metrics"})

    def _start_kv_tier(self) -> None:
        """The host-DRAM KV tier (serving.kv_tier), up before any engine connects to it."""
        if self.serving.kv_tier == "none":
            return
        if self.serving.mode in ("mocker", "external"):
            raise ServingError(f"serving.kv_tier={self.serving.kv_tier} needs engines this job "
                               f"starts; serving={self.serving.mode} has none")
        self.kv_tier = MooncakeTier(self.serving, self.run_dir)
        self.kv_tier.start()

    def _tier_settings(self) -> dict | None:
        return self.kv_tier.extra_config() if self.kv_tier is not None else None

    def _endpoint(self, model_dir: Path, base_url: str, front_door: str, **facts) -> Endpoint:
        return Endpoint(base_url=base_url, model=self.model.name, model_dir=str(model_dir),
                        front_door=front_door, api_key=self.serving.api_key,
                        enable_thinking=self.model.enable_thinking,
                        max_model_len=self.model.max_model_len,
                        request_timeout_s=self.serving.request_timeout_s,
                        logprobs_mode=self.serving.logprobs,
                        markup_token_ids=self.markup_ids, **facts)

    def _dynamo(self, model_dir: Path) -> Endpoint:
        """Control plane, then the workers (in parallel), then the frontend(s); warm up."""
        cfg = self.serving
        roles = worker_roles(cfg)
        if cfg.device == "cuda":
            need, have = len(roles) * cfg.tensor_parallel * cfg.data_parallel, _gpus()
            if have < need:
                raise ServingError(f"serving.device=cuda with this topology needs {need} GPUs; "
                                   f"this machine has {have}")
        if cfg.frontends < 1:
            raise ServingError(f"serving.frontends must be >= 1, got {cfg.frontends}")
        mocker = cfg.mode == "mocker"
        if mocker and cfg.replay_trace:
            replay_trace(cfg)  # a missing trace is refused before anything starts
        self.plane = ControlPlane(cfg, self.run_dir)
        self.plane.start()
        cores = os.cpu_count() or 1
        worker_cls = MockerWorker if mocker else DynamoWorker
        for i, (name, role) in enumerate(roles):
            self.workers.append(worker_cls(name, role, model_dir, self.model, cfg,
                                           self.run_dir, self.cache_dir, self.plane.env(),
                                           core=i % cores if cfg.device == "cpu" else None,
                                           **({"kv_tier": self._tier_settings()}
                                              if self.kv_tier else {})))
        log.info("starting %d Dynamo %s workers (%s) for %s", len(roles),
                 "mocker" if mocker else "vLLM", ", ".join(f"{n}:{r}" for n, r in roles),
                 model_dir)
        for worker in self.workers:
            worker.start()
        deadline = time.monotonic() + cfg.startup_timeout_s
        for worker in self.workers:
            worker.wait_ready(deadline)
        for i in range(cfg.frontends):
            frontend = DynamoFrontend(str(i), cfg, self.run_dir, self.plane.env(),
                                      port=cfg.port if i == 0 else 0)
            self.frontends.append(frontend)
            frontend.start()
        for frontend in self.frontends:
            frontend.wait_model(self.model.name, deadline)
        front = self.frontends[0]
        log.info("Dynamo frontend on %s (router %s, sessions %s)", front.base_url,
                 cfg.router_mode, cfg.session_affinity)
        self._warm_up(front.base_url)
        if cfg.discovery == "file":
            self.watchdog = DeregistrationWatchdog(lambda: list(self.workers),
                                                   self.run_dir / "dynamo" / "discovery",
                                                   self.restart_worker)
            self.watchdog.start()
        metrics = {w.name: w.metrics_url for w in self.workers}
        metrics["router"] = f"{front.base_url}/metrics"
        door = ReplayFrontDoor.name if mocker and cfg.replay_trace else "dynamo"
        self.endpoint = self._endpoint(
            model_dir, f"{front.base_url}/v1", door,
            engine_ids=tuple(w.name for w in self.workers), metrics_urls=metrics,
            engine_names={w.instance_id: w.name for w in self.workers if w.instance_id})
        return self.endpoint

    def restart_worker(self, name: str, expected: DynamoWorker | None = None) -> None:
        """Replace a Dynamo worker (dead or alive) by a fresh one with the same role; it
        registers under a new instance id, which the endpoint's engine names learn. With
        `expected` (the watchdog's), only if that worker is still the one serving: a restart
        by the caller may have replaced it since it was seen. One restart at a time."""
        with self._restarting:
            old = next((w for w in self.workers if w.name == name), None)
            if old is None or self.plane is None:
                raise ServingError(f"no worker named {name!r}; workers: "
                                   f"{[w.name for w in self.workers]}")
            if expected is not None and old is not expected:
                log.info("worker %s was already replaced; not restarting it again", name)
                return
            old.stop()
            if self._stopping.is_set():
                raise ServingError(f"not restarting worker {name}: the cluster is stopping")
            new = type(old)(old.name, old.role, old.model_dir, self.model, self.serving,
                            self.run_dir, self.cache_dir, self.plane.env(), core=old.core,
                            **({"kv_tier": old.kv_tier} if old.kv_tier else {}))
            self.workers[self.workers.index(old)] = new
            new.start()
            new.wait_ready(time.monotonic() + self.serving.startup_timeout_s, self._stopping)
        if self.endpoint is not None:
            self.endpoint.engine_names[new.instance_id] = new.name
            self.endpoint.metrics_urls[new.name] = new.metrics_url

    def _warm_up(self, url: str) -> None:
        """One short request through every decode path, so the first real turn does not pay
        for NIXL's handshake and the first prefill (seconds on CPU)."""
        decoders = sum(1 for w in self.workers if w.role != "prefill")
        for _ in range(decoders):
            try:
                httpx.post(f"{url}/v1/completions", timeout=self.serving.request_timeout_s,
                           json={"model": self.model.name, "prompt": "warm up", "max_tokens": 2})
            except httpx.HTTPError as exc:
                raise ServingError(f"warm-up request through {url} failed: {exc}") from None

    def _external(self, model_dir: Path) -> Endpoint:
        url = (self.serving.base_url or "").rstrip("/")
        if not url:
            raise ServingError("serving.mode=external needs serving.base_url "
                               "(e.g. serving.base_url=http://127.0.0.1:8000/v1)")
        headers = {"Authorization": f"Bearer {self.serving.api_key}"}
        try:
            resp = httpx.get(f"{url}/models", headers=headers, timeout=10.0)
            resp.raise_for_status()
        except httpx.HTTPError as exc:
            raise ServingError(f"external server {url} does not answer: "
                               f"{type(exc).__name__}: {exc}") from None
        served = [m["id"] for m in resp.json().get("data", [])]
        if served and self.model.name not in served:
            raise ServingError(f"external server {url} does not serve model "
                               f"{self.model.name!r}; it serves {served}")
        # A vLLM server's /metrics gives the KV-budget admission its cache size and use and the
        # summary its prefix-cache hits; a server without them is admitted by group only.
        metrics = f"{url.removesuffix('/v1')}/metrics"
        try:
            kv_state(metrics)
        except MetricsError as exc:
            log.info("external server: no vLLM KV metrics (%s); rollout.admission=kv_budget "
                     "admits one group at a time", exc)
            return self._endpoint(model_dir, url, "vllm")
        return self._endpoint(model_dir, url, "vllm", metrics_urls={"external": metrics})

    def stop(self) -> None:
        self._stopping.set()  # a worker restart in progress gives up instead of finishing
        if self.watchdog is not None:
            self.watchdog.stop()
            self.watchdog = None
        frontends, self.frontends = self.frontends, []
        _stop_together([f.stop for f in frontends])
        with self._restarting:  # a restart under way gives up (it sees _stopping) first
            workers, self.workers = self.workers, []
        if workers:  # together: each waits out its grace after deregistering (dynamo/worker.py)
            log.info("stopping workers %s", ", ".join(w.name for w in workers))
        _stop_together([w.stop for w in workers])
        if self.plane is not None:
            self.plane.stop()
            self.plane = None
        while self.engines:
            engine = self.engines.pop()
            log.info("stopping engine %s", engine.engine_id)
            engine.stop()
        if self.kv_tier is not None:  # after the engines, its clients
            log.info("stopping the KV tier")
            self.kv_tier.stop()
            self.kv_tier = None
