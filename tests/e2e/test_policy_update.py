"""Policy updates mid-run on every topology, through the trainer-facing API (rollout/rl/loop.py),
with real engines and real Ray: nothing lost, every turn tagged with its version, and no KV of
the old weights reused anywhere (the replayed prompt's greedy token matches a fresh engine on the
new weights, with no cached token)."""

from __future__ import annotations

import asyncio
import random
import shutil
from pathlib import Path

import pytest
import torch
from datasets import load_from_disk
from safetensors.torch import load_file, save_file

from rollfleet.paths import ROOT
from rollout.rl.loop import Rollouts
from serving import Endpoint, Generation, ModelConfig, Sampling, ServingConfig, open_front_door
from serving.cluster import Cluster
from serving.tiny_model import ensure_tiny_glm
from tests.e2e.records import assert_fidelity, check_behaviour
from tests.procs import new_job_processes, process_table

pytestmark = pytest.mark.e2e
_RNG = random.Random(7)
PROMPT = [_RNG.randrange(100, 8000) for _ in range(700)]  # 5 full KV blocks
TOPOLOGIES = {  # (overrides, the first update's mode, the second's): every mode on a Dynamo
    # topology, abort on both
    "embedded": (["serving=embedded"], "abort", "wait"),
    "kv_routed_with_tier": (["serving=kv_routed", "serving.kv_tier=mooncake",
                             "serving.kv_tier_gib=0.5"], "keep", "abort"),
    "disagg": (["serving=disagg"], "wait", "abort"),
}


def perturbed(src: Path, out: Path, scale: float = 0.5, seed: int = 1) -> Path:
    """A model folder like `src` whose every matrix moved by `scale` of its own spread."""
    shutil.copytree(src, out)
    tensors = load_file(str(src / "model.safetensors"))
    gen = torch.Generator().manual_seed(seed)
    for name, t in tensors.items():
        if t.dim() >= 2:
            noise = torch.randn(t.shape, generator=gen) * t.float().std() * scale
            tensors[name] = (t.float() + noise).to(t.dtype)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def greedy(endpoint, names=None) -> Generation:
    """The greedy token after PROMPT: the prefill's answer. Later tokens are decode steps
    batched with the sessions still running, and on an AMX CPU (vLLM's bf16 GEMMs choose
    kernels by shape) their rounding is not a lone request's; the random model's near-even
    logits (every logprob about -7.8) let that flip a greedy pick. Seen on a Sapphire Rapids
    host: the third of 6 tokens differed from a fresh engine's in 5 runs of 6, while an
    updated engine answering a lone request matched the fresh one's 6 tokens exactly."""
    async def one() -> Generation:
        door = open_front_door(endpoint, names)
        try:
            return await door.generate(PROMPT, Sampling(1, 0.0, 1.0, 0), None, "")
        finally:
            await door.aclose()
    return asyncio.run(one())


@pytest.fixture(scope="module")
def new_weights(tmp_path_factory) -> Path:
    return perturbed(ensure_tiny_glm(ROOT / ".cache" / "models"),
                     tmp_path_factory.mktemp("weights") / "v1")


@pytest.fixture(scope="module")
def fresh_engine(new_weights, tmp_path_factory) -> Endpoint:
    """An engine started on the new weights."""
    with Cluster(ServingConfig(), ModelConfig(path=str(new_weights)),
                 tmp_path_factory.mktemp("fresh"), ROOT / ".cache") as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def fresh(fresh_engine) -> Generation:
    """The replay on the engine started on the new weights."""
    return greedy(fresh_engine)


def _same(a: Generation, b: Generation) -> bool:
    return a.token_ids == b.token_ids and all(
        abs(x - y) < 0.05 for x, y in zip(a.logprobs, b.logprobs, strict=True))


@pytest.fixture(scope="module")
def fresh_on_served(shared_engine) -> Generation:
    """The replay on an engine that never served anything but the original weights."""
    return greedy(shared_engine)


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_updates_mid_run_lose_nothing_tag_every_token_and_reuse_no_old_kv(
        topology, tmp_path, new_weights, fresh, fresh_on_served):
    """Two updates with sessions running: to the perturbed weights (v1), then back to the
    original ones as v2 (the same bytes as v0 under a new version: the KV tier must not hand
    v0's blocks to v2, nor v1's)."""
    overrides, first_mode, second_mode = TOPOLOGIES[topology]
    before_procs = process_table()
    run = tmp_path / "run"
    served = ensure_tiny_glm(ROOT / ".cache" / "models")
    with Rollouts(["+experiment=rl_loop", *overrides, f"output.dir={run}", "logger=none",
                   "env.task_ids=[stats_mean,stack_pop]", "rollout.samples_per_task=2",
                   "rollout.max_turns=2", "rollout.max_sessions=4",
                   "rollout.max_tokens_per_turn=384"], groups_per_step=2, ahead=2) as r:
        names = r.cluster.roster.names()
        old = greedy(r.cluster.endpoint, names)
        assert greedy(r.cluster.endpoint, names).cached_tokens >= 4 * 128  # cached under v0
        assert not _same(old, fresh)  # the new weights answer otherwise
        first = r.next_groups(2)
        r.update_weights(new_weights, mode=first_mode)
        assert r.policy_version == 1
        replay = greedy(r.cluster.endpoint, names)
        # no block computed with the old weights is reused: neither the engine's prefix cache
        # nor the host tier holds the prompt any more, and the answer is the new weights'
        assert replay.cached_tokens == 0
        assert _same(replay, fresh), (replay.token_ids, fresh.token_ids)
        second = r.next_groups(2)
        r.update_weights(served, mode=second_mode)
        assert r.policy_version == 2
        back = greedy(r.cluster.endpoint, names)
        assert back.cached_tokens == 0  # v1's blocks are not v2's, nor are v0's
        assert _same(back, fresh_on_served), (back.token_ids, fresh_on_served.token_ids)
        third = r.next_groups(2)
        labels = {c.name: c.version() for c in r.cluster.topology.controls()}
        assert set(labels.values()) == {r.cluster.served.label}  # read back from every engine
    records = load_from_disk(str(run / "dataset")).to_list()
    assert {r["status"] for r in records} <= {"ok", "truncated", "stale"}  # nothing lost
    assert len(records) >= 12 and len({r["rollout_id"] for r in records}) == len(records)
    turns = [t for r in records for t in r["turns"]]
    assert {t["policy_version"] for t in turns} == {0, 1, 2}
    digests = {t["policy_version"]: t["policy_checkpoint"] for t in turns}
    assert digests[0] == digests[2] != digests[1]  # each turn names the weights by content
    for r in records:  # a session's turns never go back in version; each turn is one version
        turn_versions = [t["policy_version"] for t in r["turns"]]
        assert turn_versions == sorted(turn_versions) and r["policy_versions"] == sorted(
            set(turn_versions))
    assert all(g.versions == [0] for g in first)  # taken before the first update
    assert any(1 in g.versions for g in second) or any(1 in g.versions for g in third)
    # each token's behaviour logprob is the one the weights its tag names give it: a trainer's
    # masked recompute at the old weights (v0, v2) and at the new (v1) matches it
    by_version = {v: [r for r in records if r["policy_versions"] == [v]] for v in (0, 1, 2)}
    assert by_version[0] and by_version[1]
    check_behaviour(by_version[0] + by_version[2])
    check_behaviour(by_version[1], str(new_weights))
    with pytest.raises(AssertionError):  # the tag matters: v1's tokens are not v0's
        check_behaviour(by_version[1])
    view = load_from_disk(str(run / "trainer"))
    assert set(view["policy_version"]) <= {0, 1, 2} and len(view) > 0
    assert new_job_processes(before_procs) == []


CONTINUE_ON = {
    "embedded": ["serving=embedded"],
    "kv_routed_with_tier": ["serving=kv_routed", "serving.kv_tier=mooncake",
                            "serving.kv_tier_gib=0.5"],
    "disagg": ["serving=disagg"],
}


@pytest.mark.parametrize("topology", CONTINUE_ON)
def test_a_turn_cut_by_an_update_goes_on_under_the_new_weights(topology, tmp_path, new_weights):
    """rollout.update_mode=continue with many sessions in flight: updates until one turn was
    cut mid-way. The cut turn's tokens carry two versions, the new one from where it was cut
    on; its call is valid; every token's behaviour logprob re-scores at its own version's
    checkpoint (the continuation's prefix computed again under the new weights: reusing the
    old KV would not), and nothing is lost."""
    from transformers import AutoModelForCausalLM

    from rollout.reports.rescore import check_logprobs
    from rollout.rl.behaviour import SessionLogprobs
    from serving.checkpoints import read_index

    before_procs = process_table()
    run = tmp_path / "run"
    served = ensure_tiny_glm(ROOT / ".cache" / "models")
    with Rollouts(["+experiment=rl_loop", *CONTINUE_ON[topology], f"output.dir={run}",
                   "logger=none", "rollout.update_mode=continue", "rollout.max_sessions=8",
                   "rollout.max_policy_lag=null", "serving.keep_checkpoints=100"],
                  groups_per_step=1, ahead=32) as r:  # sampling goes on through updates
        r.next_groups(1)
        for attempt in range(6):  # each update lands on whatever is being sampled then
            r.update_weights(new_weights if attempt % 2 == 0 else served)
            r.next_groups(1)
            done = load_from_disk_parts(run)
            if any(len(t["parts"]) > 1 for rec in done for t in rec["turns"]):
                break
    records = load_from_disk(str(run / "dataset")).to_list()
    assert {rec["status"] for rec in records} <= {"ok", "truncated"}  # nothing lost
    cut = [(rec, t) for rec in records for t in rec["turns"] if len(t["parts"]) > 1]
    assert cut, "no update cut a turn in six tries"
    for _, turn in cut:
        first, then = turn["parts"][0], turn["parts"][-1]
        assert then["version"] > first["version"] and first["tokens"] > 0
        assert sum(p["tokens"] for p in turn["parts"]) == len(turn["completion_token_ids"])
        assert turn["tool_calls"] and all(c["valid"] for c in turn["tool_calls"])
    kept = {v: (c.path, c.digest) for v, c in read_index(run).items()}
    result, skipped = check_logprobs(
        [rec for rec, _ in cut], kept,
        lambda folder: AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval(),
        SessionLogprobs(served))
    assert skipped.reasons == {}
    assert_fidelity(result)
    assert new_job_processes(before_procs) == []


def load_from_disk_parts(run: Path) -> list[dict]:
    """The records on disk so far (the run's part files), as a trainer would read them."""
    import pyarrow.parquet as pq

    files = sorted((run / "data").glob("*.parquet"))
    return [row for f in files for row in pq.read_table(f).to_pylist()]
