"""Hands sessions to RolloutWorker actors as admission allows; retries infrastructure failures.

What is retried, and what is not:
- a record with status `infra_error` (the engine was unreachable or answered 5xx, the sandbox
  could not start) and an actor that died (its process was killed, its node went away): the
  rollout runs again as a new attempt, up to `max_retries` times, attempt n after
  `backoff_s * 2**(n-1)` seconds (a retry outlives an engine restart). An actor that died is
  replaced by a fresh one.
- an exception raised by session or environment code (a bug): the rollout is recorded once with
  status `error` and the traceback, never retried, never scored.
After `max_consecutive_infra` infrastructure failures in a row the run stops (RunAborted) with
what finished already on disk.

Records are handed on in batches: those that land within `commit_s` of the first one go
together (the sink writes them as one file), and whatever landed is handed on before `run`
returns or raises.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

import ray
from ray.exceptions import RayError, RayTaskError

from rollout.admission import Admission
from rollout.record import Job, Provenance, error_record

log = logging.getLogger(__name__)


class RunAborted(RuntimeError):
    """The infrastructure kept failing: the run stops instead of burning every rollout."""


class JobSource:
    """Jobs handed out as they may start: `take()` None means none now, `finished()` none
    ever again."""

    def take(self) -> Job | None:
        raise NotImplementedError

    def finished(self) -> bool:
        raise NotImplementedError


class JobList(JobSource):
    def __init__(self, jobs: list[Job]) -> None:
        self.jobs = list(reversed(jobs))

    def take(self) -> Job | None:
        return self.jobs.pop() if self.jobs else None

    def finished(self) -> bool:
        return not self.jobs


class CommitWindow:
    """Records that land within `window_s` of the first one, handed on together."""

    def __init__(self, hand_on: Callable[[list[dict[str, Any]]], None], window_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.hand_on, self.window_s, self.clock = hand_on, window_s, clock
        self.records: list[dict[str, Any]] = []
        self.opened = 0.0

    def add(self, record: dict[str, Any]) -> None:
        if not self.records:
            self.opened = self.clock()
        self.records.append(record)

    def wait_s(self, longest: float) -> float:
        """How long the scheduler may wait for the next record before the window is due."""
        if not self.records:
            return longest
        return max(0.0, min(longest, self.opened + self.window_s - self.clock()))

    def flush_if_due(self) -> None:
        if self.records and self.clock() - self.opened >= self.window_s:
            self.flush()

    def flush(self) -> None:
        records, self.records = self.records, []  # emptied first: a failing hand_on runs once
        if records:
            self.hand_on(records)


class Scheduler:
    """Least-loaded dispatch over a fixed set of actors, as many in flight as admitted."""

    def __init__(self, make_worker: Callable[[], Any], num_workers: int, admission: Admission,
                 max_retries: int, provenance: Provenance, backoff_s: float = 0.0,
                 max_consecutive_infra: int = 20,
                 engine_names: Callable[[], dict[str, str]] = dict,
                 commit_s: float = 0.0) -> None:
        self.make_worker = make_worker
        self.workers = [make_worker() for _ in range(num_workers)]
        self.admission = admission
        self.max_retries = max_retries
        self.provenance = provenance
        self.backoff_s = backoff_s
        self.max_consecutive_infra = max_consecutive_infra
        self.engine_names = engine_names  # the engines as they are now (restarts rename them)
        self.commit_s = commit_s
        self.consecutive_infra = 0
        self.in_flight = 0  # sessions running now (for the progress display)

    def run(self, jobs: list[Job] | JobSource,
            on_records: Callable[[list[dict[str, Any]]], None]) -> None:
        """Run every job of `jobs` (a list, or a source that hands out jobs as it allows);
        `on_records` gets the records as they land, a commit window's at a time."""
        source = jobs if isinstance(jobs, JobSource) else JobList(jobs)
        landed = CommitWindow(on_records, self.commit_s)
        try:
            self._run(source, landed)
        finally:  # on every way out, what landed is handed on
            landed.flush()

    def _run(self, source: JobSource, landed: CommitWindow) -> None:
        due: list[Job] = []  # retries due now
        delayed: list[tuple[float, Job]] = []  # retries waiting out their backoff
        pending: dict[ray.ObjectRef, tuple[Job, int, Any]] = {}
        # Sessions that ended, as their futures complete: ray.wait over every pending ref, once
        # per landed record, was O(sessions in flight) each (10% of the driver's CPU at 1,024).
        ended: queue.SimpleQueue[tuple[ray.ObjectRef, Future]] = queue.SimpleQueue()
        load = [0] * len(self.workers)
        while due or pending or delayed or not source.finished():
            now = time.monotonic()
            due.extend(job for at, job in delayed if at <= now)
            delayed = [(at, job) for at, job in delayed if at > now]
            limit = self.admission.limit()
            while len(pending) < limit:
                job = due.pop() if due else source.take()
                if job is None:
                    break
                w = min(range(len(self.workers)), key=load.__getitem__)
                worker = self.workers[w]
                ref = worker.run.remote(job, self.engine_names())
                pending[ref] = (job, w, worker)
                ref.future().add_done_callback(lambda done, ref=ref: ended.put((ref, done)))
                load[w] += 1
            self.in_flight = len(pending)
            if not pending:
                landed.flush()  # nothing else can land before the next start
                time.sleep(0.05 if not delayed else min(1.0, min(d for d, _ in delayed) - now))
                continue
            for ref, done in _drain(ended, landed.wait_s(1.0)):
                job, w, worker = pending.pop(ref)
                load[w] -= 1
                record = self._result(done, job, w, worker)
                if record["status"] == "infra_error":
                    self._count_infra(record)
                    if job.attempt < self.max_retries:
                        wait = self.backoff_s * 2 ** job.attempt
                        log.warning("rollout %s attempt %d failed (%s); retrying in %.0fs",
                                    job.rollout_id, job.attempt, record["error"], wait)
                        delayed.append((time.monotonic() + wait,
                                        replace(job, attempt=job.attempt + 1)))
                        continue
                else:
                    self.consecutive_infra = 0
                    self.admission.observe(record)
                landed.add(record)
            landed.flush_if_due()

    def _count_infra(self, record: dict[str, Any]) -> None:
        self.consecutive_infra += 1
        if self.consecutive_infra >= self.max_consecutive_infra:
            raise RunAborted(f"{self.consecutive_infra} infrastructure errors in a row (last: "
                             f"{record['rollout_id']}: {record['error'][:300]}); the records "
                             "finished so far are on disk")

    def _result(self, done: Future, job: Job, w: int, worker: Any) -> dict[str, Any]:
        try:
            return done.result()
        except RayTaskError as exc:  # session or environment code raised: a bug, not retried
            log.error("rollout %s failed with an error in its code:\n%s", job.rollout_id, exc)
            return error_record(job, self.provenance, str(exc), status="error")
        except RayError as exc:  # the actor died: replace it once, and fail this attempt
            log.warning("worker %d failed on %s: %s", w, job.rollout_id, exc)
            if self.workers[w] is worker:
                self.workers[w] = self.make_worker()
            return error_record(job, self.provenance,
                                f"worker failed: {type(exc).__name__}: {exc}")


def _drain(ended: queue.SimpleQueue, timeout_s: float) -> list[tuple[ray.ObjectRef, Future]]:
    """What ended within `timeout_s`: the first to end, and every other that has by then."""
    try:
        out = [ended.get(timeout=timeout_s)]
    except queue.Empty:
        return []
    with contextlib.suppress(queue.Empty):
        while True:
            out.append(ended.get_nowait())
    return out
