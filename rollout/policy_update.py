"""A weight update as the driver runs it: the sessions' side (the PolicyBoard) and the
engines' side (the cluster) in the order the update mode needs (rollout/policy_fence.py)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import ray

from serving.cluster import Cluster
from serving.policy import PolicyUpdateError, UpdateTimes

log = logging.getLogger(__name__)
SETTLE_TIMEOUT_S = 600.0


def update_policy(cluster: Cluster, board: Any, source: Path | dict[str, Any],
                  version: int | None, mode: str) -> UpdateTimes:
    """New weights for every engine; every turn recorded afterwards is tagged with `version`
    (default: the next), none holds tokens of two versions."""
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


def _until_settled(board: Any, nudge) -> None:
    """Until no turn is in flight (`nudge` between looks: aborting what engines still hold)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while ray.get(board.turns_in_flight.remote()):
        if time.monotonic() > deadline:
            raise PolicyUpdateError(f"turns still in flight after {SETTLE_TIMEOUT_S:.0f} s; "
                                    "the update did not start")
        nudge()
        time.sleep(0.05)
