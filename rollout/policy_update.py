"""A weight update as the job runs it: the sessions' side (the PolicyBoard,
rollout/policy_fence.py) and the engines' side (the cluster's `update_weights`) in the order the
update mode needs."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from serving import ServingError

log = logging.getLogger(__name__)
SETTLE_TIMEOUT_S = 600.0


class TurnsDidNotSettle(ServingError):
    """Turns were still in flight when the update had to start; nothing was updated (a job
    stops with its one line, as with any update the fleet refused)."""


def update_policy(cluster: Any, board: Any, source: Path | dict[str, Any],
                  version: int | None, mode: str) -> dict[str, float]:
    """New weights for every engine of `cluster` (from serving's `running_cluster`) in the order
    `mode` needs; every turn recorded afterwards is tagged with `version` (default: the next),
    none holds tokens of two versions. Returns the seconds each step took (serving's
    UpdateTimes: pause_s, weights_s, invalidate_s, resume_s, total_s)."""
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
    return times.as_dict()


def _until_settled(board: Any, nudge: Callable[[], None]) -> None:
    """Until no turn is in flight (`nudge` between looks: aborting what engines still hold)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while ray.get(board.turns_in_flight.remote()):
        if time.monotonic() > deadline:
            raise TurnsDidNotSettle(f"turns still in flight after {SETTLE_TIMEOUT_S:.0f} s; "
                                    "the update did not start")
        nudge()
        time.sleep(0.05)
