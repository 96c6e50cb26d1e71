"""Hands sessions to RolloutWorker actors, a bounded window in flight; retries infra errors."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import ray
from ray.exceptions import RayError

from rollout.record import Job, Provenance, error_record

log = logging.getLogger(__name__)


class Scheduler:
    """Least-loaded dispatch over a fixed set of actors.

    A session that ends with status `infra_error` (or whose actor died) is run again, up to
    `max_retries` times, as a new attempt: infrastructure failures never become rewards.
    Attempt n waits `backoff_s * 2**(n-1)` first, so a retry outlives what failed it (an engine
    that restarts takes tens of seconds).
    """

    def __init__(self, make_worker: Callable[[], Any], num_workers: int, window: int,
                 max_retries: int, provenance: Provenance, backoff_s: float = 0.0) -> None:
        self.make_worker = make_worker
        self.provenance = provenance
        self.workers = [make_worker() for _ in range(num_workers)]
        self.window = window
        self.max_retries = max_retries
        self.backoff_s = backoff_s

    def run(self, jobs: list[Job], on_record: Callable[[dict[str, Any]], None]) -> None:
        queue = list(reversed(jobs))
        delayed: list[tuple[float, Job]] = []  # retries waiting out their backoff
        pending: dict[ray.ObjectRef, tuple[Job, int, Any]] = {}
        load = [0] * len(self.workers)
        while queue or pending or delayed:
            now = time.monotonic()
            queue.extend(job for due, job in delayed if due <= now)
            delayed = [(due, job) for due, job in delayed if due > now]
            if not pending and not queue:
                time.sleep(min(1.0, min(due for due, _ in delayed) - now))
                continue
            while queue and len(pending) < self.window:
                job = queue.pop()
                w = min(range(len(self.workers)), key=load.__getitem__)
                worker = self.workers[w]
                pending[worker.run.remote(job)] = (job, w, worker)
                load[w] += 1
            if not pending:
                continue
            with _signals_pass_through():
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            for ref in ready:
                job, w, worker = pending.pop(ref)
                load[w] -= 1
                record = self._result(ref, job, w, worker)
                if record["status"] == "infra_error" and job.attempt < self.max_retries:
                    wait = self.backoff_s * 2 ** job.attempt
                    log.warning("rollout %s attempt %d failed (%s); retrying in %.0fs",
                                job.rollout_id, job.attempt, record["error"], wait)
                    delayed.append((time.monotonic() + wait, replace(job, attempt=job.attempt + 1)))
                else:
                    on_record(record)

    def _result(self, ref: ray.ObjectRef, job: Job, w: int, worker: Any) -> dict[str, Any]:
        try:
            with _signals_pass_through():
                return ray.get(ref)
        except RayError as exc:  # the actor died: replace it once, and fail this attempt
            log.warning("worker %d failed on %s: %s", w, job.rollout_id, exc)
            if self.workers[w] is worker:
                self.workers[w] = self.make_worker()
            return error_record(job, self.provenance,
                                f"worker failed: {type(exc).__name__}: {exc}")


@contextlib.contextmanager
def _signals_pass_through() -> Iterator[None]:
    """A signal handler's exception (Ctrl-C, the job's SIGTERM) raised while Ray's Cython code
    runs comes out as a SystemError caused by it: let the signal's own exception through."""
    try:
        yield
    except SystemError as exc:
        cause = exc.__cause__
        if cause is not None and not isinstance(cause, Exception):
            raise cause from None
        raise
