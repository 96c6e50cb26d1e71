"""The driver's hold on the serving cluster: the only module in rollout/ that touches it.

A job starts its own cluster and stops it at its end (`own_cluster`). A sweep's members share
one (`SWEEP_CLUSTER`): Hydra's basic launcher runs a multirun's members one after another in
one process, and members with equal serving and model settings need the same engines, so the
first member starts them and the later ones reuse them (a temperature sweep over a large model
pays for its engines' start once). The shared cluster is stopped when a member needs other
settings, when a member fails (the next one starts afresh), and when the process exits. A
weight update runs here too (`update_policy`): the sessions' side and the engines' side in
the order the update mode needs.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ray

from serving import ModelConfig, ServingConfig
from serving.cluster import Cluster
from serving.policy import PolicyUpdateError, UpdateTimes

log = logging.getLogger(__name__)
SETTLE_TIMEOUT_S = 600.0


@contextlib.contextmanager
def own_cluster(serving: ServingConfig, model: ModelConfig, run_dir: Path,
                cache_dir: Path) -> Iterator[Cluster]:
    """A job's cluster, started for it and stopped at its end on every exit path."""
    cluster = Cluster(serving, model, run_dir, cache_dir)
    with cluster:
        yield cluster


class SharedCluster:
    """At most one running cluster, handed to every member whose settings match it."""

    def __init__(self) -> None:
        self._key: tuple[ServingConfig, ModelConfig, Path] | None = None
        self._cluster: Cluster | None = None

    @contextlib.contextmanager
    def use(self, serving: ServingConfig, model: ModelConfig, run_dir: Path,
            cache_dir: Path) -> Iterator[Cluster]:
        key = (serving, model, cache_dir)
        if self._cluster is not None and key != self._key:
            log.info("this sweep member serves with other settings: stopping the shared cluster")
            self.stop()
        if self._cluster is None:
            cluster = Cluster(serving, model, run_dir, cache_dir)
            cluster.__enter__()  # stops what it started if it fails
            self._cluster, self._key = cluster, key
        else:
            log.info("reusing this sweep's serving cluster (its logs are in %s)",
                     self._cluster.run_dir)
        try:
            yield self._cluster
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        cluster, self._cluster, self._key = self._cluster, None, None
        if cluster is not None:
            cluster.stop()


SWEEP_CLUSTER = SharedCluster()
atexit.register(SWEEP_CLUSTER.stop)


def update_policy(cluster: Cluster, board: Any, source: Path | dict[str, Any],
                  version: int | None, mode: str) -> UpdateTimes:
    """New weights for every engine, the sessions' side (the PolicyBoard,
    rollout/policy_fence.py) and the engines' side in the order `mode` needs; every turn recorded
    afterwards is tagged with `version` (default: the next), none holds tokens of two versions."""
    current = cluster.roster.policy_version
    ray.get(board.start_update.remote())
    try:
        if mode == "wait":  # the turns in flight finish on the old weights first
            _until_settled(board, lambda: None)
            ray.get(board.paused.remote())
            times = cluster.update_weights(source, version, mode)
        else:
            ray.get(board.paused.remote())
            settle = (lambda: _until_settled(board, cluster.abort_requests)) \
                if mode == "abort" else (lambda: None)
            times = cluster.update_weights(source, version, mode, after_pause=settle)
    except BaseException:
        ray.get(board.finish_update.remote(cluster.roster.policy_version))
        raise
    ray.get(board.finish_update.remote(cluster.roster.policy_version))
    log.info("policy %d -> %d (%s): pause %.2f s, weights %.2f s, caches %.2f s, resume %.2f s",
             current, cluster.roster.policy_version, mode, times.pause_s, times.weights_s,
             times.invalidate_s, times.resume_s)
    return times


def _until_settled(board: Any, nudge: Callable[[], None]) -> None:
    """Until no turn is in flight (`nudge` between looks: aborting what engines still hold)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while ray.get(board.turns_in_flight.remote()):
        if time.monotonic() > deadline:
            raise PolicyUpdateError(f"turns still in flight after {SETTLE_TIMEOUT_S:.0f} s; "
                                    "the update did not start")
        nudge()
        time.sleep(0.05)
