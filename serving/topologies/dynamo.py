"""What the Dynamo topologies share: a control plane, workers, frontends, restarts.

The workers start in parallel, then the frontend(s) with the KV-aware router; one short request
warms each decode path. With file discovery, a watchdog restarts a worker whose registration
expired while it was alive. A restarted worker registers under a new instance id (and system
port), which the roster learns through `on_restart`.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import httpx

from rollfleet.run_dir import RunDir
from serving.dynamo.frontend import DynamoFrontend
from serving.dynamo.plane import ControlPlane
from serving.dynamo.watchdog import DeregistrationWatchdog
from serving.dynamo.worker import DynamoWorker
from serving.endpoint import EngineSlot
from serving.errors import ServingError
from serving.policy import DynamoControl, EngineControl
from serving.topologies.base import Started, Topology

log = logging.getLogger(__name__)


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


def _slot(worker: DynamoWorker) -> EngineSlot:
    return EngineSlot(worker.name, worker.role, worker.metrics_url, worker.instance_id)


class DynamoTopology(Topology):
    """Subclasses name their workers (`roles`) and may change the worker class."""

    front_door = "dynamo"
    worker_cls: ClassVar[type[DynamoWorker]] = DynamoWorker

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.plane: ControlPlane | None = None
        self.workers: list[DynamoWorker] = []
        self.frontends: list[DynamoFrontend] = []
        self.watchdog: DeregistrationWatchdog | None = None
        self._stopping = threading.Event()

    def roles(self) -> list[tuple[str, str]]:
        """(name, role) of every worker."""
        raise NotImplementedError

    def check(self) -> None:
        super().check()
        cfg = self.where.serving
        roles = self.roles()
        if cfg.device == "cuda":
            need, have = len(roles) * cfg.tensor_parallel * cfg.data_parallel, _gpus()
            if have < need:
                raise ServingError(f"serving.device=cuda with this topology needs {need} GPUs; "
                                   f"this machine has {have}")
        if cfg.frontends < 1:
            raise ServingError(f"serving.frontends must be >= 1, got {cfg.frontends}")

    def _worker(self, name: str, role: str, core: int | None) -> DynamoWorker:
        """A worker serving what the fleet serves now (the latest weights; its tier connector
        reads their version from the served policy file)."""
        w = self.where
        assert self.plane is not None
        extra = {"kv_tier": w.kv_tier} if w.kv_tier else {}
        return self.worker_cls(name, role, Path(self.served.path), w.model, w.serving,
                               w.run_dir, w.cache_dir, self.plane.env(), core=core, **extra)

    def after_update(self) -> None:
        """One short request on each worker: vLLM publishes a cache reset to the router with
        its next step's KV events, so each engine steps at once and the router drops the
        blocks the reset removed (it would route by them until then; no KV is reused)."""
        front = self.frontends[0].base_url
        for worker in self.workers:
            if worker.role == "prefill" or not worker.instance_id:
                continue
            try:
                httpx.post(f"{front}/v1/completions", timeout=60, json={
                    "model": self.where.model.name, "prompt": "reset", "max_tokens": 1,
                    "nvext": {"backend_instance_id": int(worker.instance_id, 16)}})
            except httpx.HTTPError as exc:
                log.warning("nudging worker %s after the update: %s", worker.name, exc)

    def controls(self) -> list[EngineControl]:
        return [self._control(w) for w in self.workers]

    def _control(self, worker: DynamoWorker) -> DynamoControl:
        host, timeout = self.where.serving.host, self.where.serving.request_timeout_s
        return DynamoControl(worker.name, f"http://{host}:{worker.system_port}", timeout,
                             hands_off_kv=worker.role == "prefill")

    def start(self) -> Started:
        """Control plane, then the workers (in parallel), then the frontend(s); warm up."""
        w, cfg = self.where, self.where.serving
        roles = self.roles()
        self.plane = ControlPlane(cfg, w.run_dir)
        self.plane.start()
        cores = os.cpu_count() or 1
        for i, (name, role) in enumerate(roles):
            self.workers.append(self._worker(name, role,
                                             i % cores if cfg.device == "cpu" else None))
        log.info("starting %d Dynamo %s workers (%s) for %s", len(roles), self.name,
                 ", ".join(f"{n}:{r}" for n, r in roles), w.model_dir)
        for worker in self.workers:
            worker.start()
        deadline = time.monotonic() + cfg.startup_timeout_s
        for worker in self.workers:
            worker.wait_ready(deadline)
        for i in range(cfg.frontends):
            frontend = DynamoFrontend(str(i), cfg, w.run_dir, self.plane.env(),
                                      port=cfg.port if i == 0 else 0)
            self.frontends.append(frontend)
            frontend.start()
        for frontend in self.frontends:
            frontend.wait_model(w.model.name, deadline)
        front = self.frontends[0]
        log.info("Dynamo frontend on %s (router %s, sessions %s)", front.base_url,
                 cfg.router_mode, cfg.session_affinity)
        self._warm_up(front.base_url)
        if cfg.discovery == "file":
            self.watchdog = DeregistrationWatchdog(lambda: list(self.workers),
                                                   RunDir(w.run_dir).discovery,
                                                   self._restart)
            self.watchdog.start()
        return Started(front.base_url, [_slot(worker) for worker in self.workers],
                       f"{front.base_url}/metrics")

    def restart(self, name: str) -> None:
        self._restart(name)

    def _restart(self, name: str, expected: DynamoWorker | None = None) -> None:
        """Replace a worker (dead or alive) by a fresh one with the same role. With
        `expected` (the watchdog's), only if that worker is still the one serving: a restart
        by the caller may have replaced it since it was seen. One restart at a time, never
        during an update; the new worker is told the version it serves."""
        with self.lock:
            old = next((w for w in self.workers if w.name == name), None)
            if old is None or self.plane is None:
                raise ServingError(f"no worker named {name!r}; workers: "
                                   f"{[w.name for w in self.workers]}")
            if expected is not None and old is not expected:
                log.info("worker %s was already replaced; not restarting it again", name)
                return
            if not self.served.path:
                raise ServingError(
                    f"worker {name} cannot be restarted: the weights served "
                    f"({self.served.label}) came from a trainer's ranks and no folder holds "
                    f"them; the fleet serves on without it until the next update")
            old.stop()
            if self._stopping.is_set():
                raise ServingError(f"not restarting worker {name}: the cluster is stopping")
            new = self._worker(old.name, old.role, old.core)
            self.workers[self.workers.index(old)] = new
            new.start()
            new.wait_ready(time.monotonic() + self.where.serving.startup_timeout_s,
                           self._stopping)
            if self.declares_version:
                self._control(new).declare(self.served)
        self.on_restart(_slot(new))

    def _warm_up(self, url: str) -> None:
        """One short request through every decode path, so the first real turn does not pay
        for NIXL's handshake and the first prefill (seconds on CPU)."""
        cfg = self.where.serving
        for _ in range(sum(1 for w in self.workers if w.role != "prefill")):
            try:
                httpx.post(f"{url}/v1/completions", timeout=cfg.request_timeout_s,
                           json={"model": self.where.model.name, "prompt": "warm up",
                                 "max_tokens": 2})
            except httpx.HTTPError as exc:
                raise ServingError(f"warm-up request through {url} failed: {exc}") from None

    def stop(self) -> None:
        self._stopping.set()  # a worker restart in progress gives up instead of finishing
        if self.watchdog is not None:
            self.watchdog.stop()
            self.watchdog = None
        frontends, self.frontends = self.frontends, []
        _stop_together([f.stop for f in frontends])
        with self.lock:  # a restart under way gives up (it sees _stopping) first
            workers, self.workers = self.workers, []
        if workers:  # together: each waits out its grace after deregistering (dynamo/worker.py)
            log.info("stopping workers %s", ", ".join(w.name for w in workers))
        _stop_together([w.stop for w in workers])
        if self.plane is not None:
            self.plane.stop()
            self.plane = None
