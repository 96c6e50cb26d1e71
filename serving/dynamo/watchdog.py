"""Puts back workers that Dynamo's file discovery dropped while they were still alive.

Measured here: when a worker's process stalls for more than 10 s on a starved 2-core machine,
its discovery entries expire, the frontend drops it (requests for the model get 404), and the
worker never writes them again. The watchdog restarts such a worker, which registers anew. The
main cause seen, NIXL's spinning progress threads, is gone (serving/engine/plugin.py); the
watchdog stays for the stalls that remain possible.
A worker that died is left alone: the router has already dropped it, and restarting it is the
caller's choice (`Cluster.restart_worker`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from serving.dynamo.worker import DynamoWorker

log = logging.getLogger(__name__)


def registered(discovery: Path, instance_id: str) -> bool:
    """Whether the worker's `generate` endpoint is still in the discovery folder."""
    folder = discovery / "v1" / "instances"
    return any(p.name.endswith(f"%2F{instance_id}") and "generate" in p.name
               for p in folder.iterdir()) if folder.is_dir() else False


class DeregistrationWatchdog(threading.Thread):
    """Every `interval_s`: a worker that is alive, known, not being stopped, and unregistered
    for `grace_s` is restarted through `restart(name, worker)` (which leaves it alone if it
    has been replaced meanwhile)."""

    def __init__(self, workers: Callable[[], list[DynamoWorker]], discovery: Path,
                 restart: Callable[[str, DynamoWorker], None], interval_s: float = 2.0,
                 grace_s: float = 6.0) -> None:
        super().__init__(name="dynamo-watchdog", daemon=True)
        self.workers, self.discovery, self.restart = workers, discovery, restart
        self.interval_s, self.grace_s = interval_s, grace_s
        self.stopping = threading.Event()
        self.restarts: list[str] = []

    def run(self) -> None:
        missing_since: dict[str, float] = {}
        while not self.stopping.wait(self.interval_s):
            now = time.monotonic()
            for worker in self.workers():
                if not (worker.alive() and worker.instance_id) or worker.retired or registered(
                        self.discovery, worker.instance_id):
                    missing_since.pop(worker.name, None)
                    continue
                since = missing_since.setdefault(worker.name, now)
                if now - since >= self.grace_s and not self.stopping.is_set():
                    log.warning("worker %s is alive but no longer registered with Dynamo; "
                                "restarting it", worker.name)
                    missing_since.pop(worker.name)
                    self.restarts.append(worker.name)
                    try:
                        self.restart(worker.name, worker)
                    except Exception as exc:  # noqa: BLE001 - keep watching the others
                        log.error("restarting worker %s failed: %s", worker.name, exc)

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=60)  # a restart in progress is abandoned by the stopping cluster
