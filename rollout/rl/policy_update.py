"""A weight update as the job runs it: the sessions' side (the PolicyBoard,
rollout/rl/policy_fence.py) and the engines' side (the cluster's `update_weights`) in the order the
update mode needs."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import ray

from rollout.fleet import ServingCluster
from serving import ServingError

log = logging.getLogger(__name__)
SETTLE_TIMEOUT_S = 600.0


class TurnsDidNotSettle(ServingError):
    """Turns were still in flight when the update had to start; nothing was updated (a job
    stops with its one line, as with any update the fleet refused)."""


def update_policy(cluster: ServingCluster, board: Any, source: Path | dict[str, Any],
                  version: int | None, mode: str) -> dict[str, float]:
    """New weights for every engine of `cluster` (from serving's `running_cluster`) in the order
    `mode` needs; every turn recorded afterwards is tagged with the new version (default: the
    next) and its checkpoint, none holds tokens of two versions. Returns the seconds each step
    took (serving's UpdateTimes: pause_s, weights_s, invalidate_s, resume_s, total_s).

    `wait`: no turn begins, the turns in flight end on the old weights, then the engines pause.
    `abort` and `keep`: the engines pause at once (aborting what they hold, or freezing it);
    every turn in flight then saw the pause and is sampled again after the update, whether its
    request was aborted, frozen, or still on its way and queued by the paused engine: the pause
    alone settles them, nothing waits for them. `continue`: the engines pause as in `abort`, and
    a turn the pause cut goes on from its tokens so far under the new weights (its tokens
    tagged with the policy that sampled each; rollout/session.py)."""
    current = cluster.served
    ray.get(board.start_update.remote())
    try:
        if mode == "wait":  # the turns in flight finish on the old weights first
            _until_settled(board)
        ray.get(board.paused.remote())
        times = cluster.update_weights(source, version, "abort" if mode == "continue" else mode)
    finally:
        served = cluster.served
        if not cluster.broken:  # a broken fleet: no turn may begin again
            ray.get(board.finish_update.remote(served.version, served.digest))
    log.info("policy %s -> %s (%s): pause %.2f s, weights %.2f s, caches %.2f s, "
             "resume %.2f s", current.label, served.label, mode, times.pause_s,
             times.weights_s, times.invalidate_s, times.resume_s)
    return times.as_dict()


def _until_settled(board: Any) -> None:
    """Until no turn is in flight."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while ray.get(board.turns_in_flight.remote()):
        if time.monotonic() > deadline:
            raise TurnsDidNotSettle(f"turns still in flight after {SETTLE_TIMEOUT_S:.0f} s; "
                                    "the update did not start")
        time.sleep(0.05)
