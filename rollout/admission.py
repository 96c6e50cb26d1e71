"""How many sessions run at once: a fixed window, or as many as the engines' KV cache holds.

`KvBudget` is the rule prime-rl publishes for adaptive concurrency, n = clamp(k * C / G, group,
max), fed by the engines' own numbers:
- C: the KV capacity of every engine, in tokens (vLLM's `cache_config_info`: num_gpu_blocks x
  block_size), read through the endpoint's metrics URLs (behind Dynamo too);
- G: the tokens one session holds at its end (its last prompt + completion), an EWMA over the
  sessions that finished, starting from a configured guess;
- k: the share of the cache sessions may fill. When the engines preempt (a rise in
  `vllm:num_preemptions_total`), k halves; every `recover_s` without a preemption it grows by a
  tenth again, up to `fill`;
- clamped below by one group (all samples of a task) and above by `max_sessions`.
A session that is admitted runs to its end: the limit only gates new admissions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from serving import ServingError

log = logging.getLogger(__name__)


class Admission(Protocol):
    def limit(self) -> int:
        """How many sessions may be in flight now."""

    def observe(self, record: dict[str, Any]) -> None:
        """A session finished (its record)."""


class KvReading(Protocol):
    """One engine's KV cache as its metrics say (serving's KvState)."""

    capacity_tokens: int
    preemptions: float


class FixedWindow:
    def __init__(self, size: int) -> None:
        self.size = size

    def limit(self) -> int:
        return self.size

    def observe(self, record: dict[str, Any]) -> None:
        return None


def session_tokens(record: dict[str, Any]) -> int:
    """The KV a session held at its end: its last prompt plus that turn's completion."""
    turns = record.get("turns") or []
    return turns[-1]["prompt_tokens"] + turns[-1]["completion_tokens"] if turns else 0


class KvBudget:
    def __init__(self, read_state: Callable[[], list[KvReading]], group: int, maximum: int,
                 fill: float = 0.9, guess_tokens: int = 4096, alpha: float = 0.2,
                 poll_s: float = 2.0, recover_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.read_state, self.group, self.maximum = read_state, group, max(group, maximum)
        self.fill, self.k, self.session = fill, fill, float(guess_tokens)
        self.alpha, self.poll_s, self.recover_s, self.clock = alpha, poll_s, recover_s, clock
        self.capacity = 0
        self.preemptions: float | None = None
        self.polled = self.calm_since = float("-inf")

    def limit(self) -> int:
        self._poll()
        if not self.capacity:
            return self.group
        return max(self.group, min(self.maximum, int(self.k * self.capacity / self.session)))

    def observe(self, record: dict[str, Any]) -> None:
        tokens = session_tokens(record)
        if tokens:
            self.session += self.alpha * (tokens - self.session)

    def _poll(self) -> None:
        now = self.clock()
        if now - self.polled < self.poll_s:
            return
        self.polled = now
        try:
            states = self.read_state()
        except ServingError as exc:  # keep the last figures; the next poll may see the engines
            log.warning("KV budget: engine metrics unavailable: %s", exc)
            return
        self.capacity = sum(s.capacity_tokens for s in states)
        preemptions = sum(s.preemptions for s in states)
        if self.preemptions is not None and preemptions > self.preemptions:
            self.k /= 2
            self.calm_since = now
            log.warning("KV budget: %d preemptions; sessions may now fill %.0f%% of the cache",
                        preemptions - self.preemptions, 100 * self.k)
        elif now - self.calm_since >= self.recover_s and self.k < self.fill:
            self.k = min(self.fill, self.k * 1.1)
            self.calm_since = now
        self.preemptions = preemptions
