"""A seeded request whose prompt is prefilled over several steps, on the CPU engine (the engine
plugin's part 8): vLLM 0.31 died at the first such step, and the project seeds every request."""

from __future__ import annotations

import asyncio
import random

import pytest

from serving import Generation, Sampling, open_front_door

pytestmark = pytest.mark.e2e
# longer than one step's token budget (vLLM's 2,048 on CPU): its prefill is split in two
PROMPT = [random.Random(3).randrange(100, 8000) for _ in range(3000)]


def _sample(endpoint, prompts: list[list[int]], seed: int) -> list[Generation]:
    async def all_at_once() -> list[Generation]:
        door = open_front_door(endpoint)
        try:
            return await asyncio.gather(*[door.generate(p, Sampling(8, 1.0, 1.0, seed + i),
                                                        None, "") for i, p in enumerate(prompts)])
        finally:
            await door.aclose()
    return asyncio.run(all_at_once())


def test_a_seeded_request_draws_the_same_whether_its_prefill_was_split_or_not(shared_engine):
    [split] = _sample(shared_engine, [PROMPT], seed=11)
    assert split.cached_tokens == 0 and len(split.token_ids) == 8
    # the same request again: its prompt comes from the prefix cache, one step prefills the
    # rest; the seeded draws match only if the split run's thrown-away draws were wound back
    [whole] = _sample(shared_engine, [PROMPT], seed=11)
    assert whole.cached_tokens >= 2048
    assert whole.token_ids == split.token_ids
    # and beside others whose prompts split too, every one is answered
    others = [[t + 1 for t in PROMPT], [t + 2 for t in PROMPT]]
    assert all(len(g.token_ids) == 8 for g in _sample(shared_engine, others, seed=20))
