"""Resident memory of processes, and how far it rose while a block ran: how the rollout service
and its benchmark show that an update holds no copy of the weights where none belongs."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path


def rss_mib(pid: int | str = "self") -> float:
    """A process's resident memory now, MiB (Linux's /proc)."""
    pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


class PeakRss:
    """The highest resident memory of each named process while the block runs, sampled every
    `every_s` and once more at its end, against the memory it had when this was made."""

    def __init__(self, pids: Mapping[str, int | str], every_s: float = 0.01) -> None:
        self.pids, self.every_s = dict(pids), every_s
        self.start = {k: rss_mib(p) for k, p in self.pids.items()}
        self.peak = dict(self.start)
        self.done = threading.Event()

    def __enter__(self) -> PeakRss:
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        for k, p in self.pids.items():
            self.peak[k] = max(self.peak[k], rss_mib(p))

    def _watch(self) -> None:
        while not self.done.wait(self.every_s):
            self._sample()

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()
        self._sample()

    def above_start_mib(self) -> dict[str, float]:
        return {k: round(self.peak[k] - self.start[k], 1) for k in self.pids}
