"""vLLM general plugin (entry point `vllm.general_plugins`): NIXL agents that do not spin.

NIXL's Python API creates every agent with a 0 us progress-thread delay, so the thread loops
on sched_yield: a spare core on a GPU server, most of a core per engine on a small CPU host.
Measured on a 2-core host (2026-11-29), one prefill : decode pair: the two progress threads
took ~1.3 cores, a 100 ms sleeper woke up to 13 s late, and the decode worker stalled past
Dynamo's 10 s discovery lease, was dropped and lost 3-6 of 10 rollouts in 5 of 9 runs of
`+experiment=swe_rl serving=disagg`; with a 1 ms delay, 3 of 3 runs had no retry and took
99-124 s instead of 150-290 s.

It acts only in processes started with ROLLFLEET_NIXL_PROGRESS_DELAY_US, which the serving
layer sets for CPU prefill and decode workers; vLLM loads it in every engine process.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

NIXL_PROGRESS_DELAY_ENV = "ROLLFLEET_NIXL_PROGRESS_DELAY_US"


class DelayedProgressBinding:
    """NIXL's binding module, except that agents get `delay_us` between progress polls."""

    def __init__(self, binding: Any, delay_us: int) -> None:
        self.binding, self.delay_us = binding, delay_us

    def __getattr__(self, name: str) -> Any:
        return getattr(self.binding, name)

    def nixlAgent(self, name: str, config: Any) -> Any:  # noqa: N802 - the binding's name
        config.pthrDelay = self.delay_us
        return self.binding.nixlAgent(name, config)


def register() -> None:
    value = os.environ.get(NIXL_PROGRESS_DELAY_ENV)
    if not value:
        return
    api = importlib.import_module("nixl._api")
    if not isinstance(api.nixlBind, DelayedProgressBinding):
        api.nixlBind = DelayedProgressBinding(api.nixlBind, int(value))
