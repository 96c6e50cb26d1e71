"""Which policy each turn is sampled under, and the fence that keeps a turn to one policy.

The `PolicyBoard` (a Ray actor beside the driver) holds the version the engines serve and the
turns in flight. A session asks it before each turn (`begin`: the version, or a wait while an
update is under way) and after it (`end`: whether the engines were paused meanwhile). The driver
updates the weights in the mode chosen (rollout.update_mode; rollout/rl/policy_update.py):

- `wait`: no new turn begins; the turns in flight finish on the old weights; then the engines
  are paused, updated and resumed. Every turn is of one version, none is sampled twice.
- `abort`: the engines are paused at once and every request they hold is aborted; a turn cut
  short is sampled again, on the new weights.
- `keep`: the engines are paused at once and keep their requests, whose KV is dropped and
  computed again with the new weights on resume; such a turn holds tokens of both versions, so
  it too is sampled again (its first sample is never recorded).

- `continue`: the engines pause as in `abort`; a turn the pause cut goes on under the new
  weights from its tokens so far, and records which version sampled which (its `parts`). Only
  a request one pause cut is taken so: one that two pauses fell inside (it reached an engine
  after the first and ran on the new weights before the second cut it) holds tokens of an
  unknown version, and only those are sampled again. A request one pause fell inside but did
  not cut reached the engines after it (they abort what they hold), so it ran whole on what
  that update installed, and is tagged so.
Otherwise a turn is recorded only if no pause fell inside it, so no recorded turn holds tokens
of two versions unbeknown. Without a board (a plain run) every turn is version 0.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TurnEnd:
    """What a turn's request ran across: `pauses` engine pauses, and `after`, the (version,
    digest) the engines served once the first of them was over (None: no pause, or its update
    had not finished when the turn ended)."""

    pauses: int
    after: tuple[int, str] | None = None


class PolicyBoard:
    """The served version and the turns in flight (one per job, driven by the driver)."""

    def __init__(self, version: int = 0, checkpoint: str = "") -> None:
        self.version, self.checkpoint = version, checkpoint  # the served policy, its digest
        self.pauses = 0  # engine pauses so far: a turn that saw one is not recorded
        self.updating = False
        self.in_flight: dict[str, int] = {}  # turn -> pauses when it began
        self.served_after: dict[int, tuple[int, str]] = {}  # pause -> what its update served
        self._open = asyncio.Event()
        self._open.set()

    async def begin(self, turn: str) -> tuple[int, str]:
        """The version (and checkpoint digest) this turn is sampled under; waits while an
        update is under way."""
        while self.updating:
            await self._open.wait()
        self.in_flight[turn] = self.pauses
        return self.version, self.checkpoint

    def end(self, turn: str) -> TurnEnd:
        """The engine pauses that fell inside the turn: none, and it ran whole on one version;
        one, and what it sampled before the pause cut it is of its version."""
        began = self.in_flight.pop(turn, self.pauses)
        return TurnEnd(self.pauses - began, self.served_after.get(began + 1))

    def start_update(self) -> None:
        """No turn begins until `finish_update`."""
        self.updating = True
        self._open.clear()

    def paused(self) -> None:
        """The engines are (about to be) paused: turns in flight now are not recorded."""
        self.pauses += 1

    def turns_in_flight(self) -> int:
        return len(self.in_flight)

    def finish_update(self, version: int, checkpoint: str) -> None:
        self.version, self.checkpoint = version, checkpoint
        self.served_after[self.pauses] = (version, checkpoint)
        self.updating = False
        self._open.set()

    def current(self) -> int:
        return self.version


class TurnFence:
    """A session's side of the board (or of no board: version 0 from `checkpoint`, every turn
    recorded)."""

    def __init__(self, board: Any | None = None, checkpoint: str = "") -> None:
        self.board = board  # a PolicyBoard Ray actor handle
        self.checkpoint = checkpoint

    async def begin(self, turn: str) -> tuple[int, str]:
        if self.board is None:
            return 0, self.checkpoint
        return tuple(await self.board.begin.remote(turn))

    async def end(self, turn: str) -> TurnEnd:
        return TurnEnd(0) if self.board is None else await self.board.end.remote(turn)


def remote_board(version: int = 0, checkpoint: str = "") -> Any:
    """A PolicyBoard as a Ray actor (async: a waiting `begin` blocks no other call)."""
    import ray

    return ray.remote(num_cpus=0, max_concurrency=10_000)(PolicyBoard).remote(version,
                                                                               checkpoint)
