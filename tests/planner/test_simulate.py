"""The fleet simulation on tiny configurations: the GLM-5.3 perf table from aiconfigurator-core,
the seed's topology read from conf/serving/glm5_gpu.yaml, Dynamo's offline replay of a P:D
fleet, live mocker engines behind the real frontend (loopback, nothing left running), and the
session shape read from a run folder's records."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from planner import descriptors, offline, perf, planner, workload
from planner.cli import load, main
from rollfleet.paths import ROOT
from rollfleet.stats import percentile
from tests.procs import new_job_processes, process_table

TINY = ["simulate.sessions=2", "simulate.lifetimes=2", "simulate.first_prompt=2000",
        "simulate.growth=1000", "simulate.max_prompt=4000", "simulate.output=16",
        "simulate.tool_s=0.2"]


def test_the_seed_topology_comes_from_the_serving_config():
    serving, cfg, _, _ = load(["serving=glm5_gpu", "simulate=h200"])
    from planner.config import topology

    topo = topology(serving)
    assert (topo["prefill"], topo["decode"], topo["tp"], topo["ep"]) == (1, 4, 8, 8)
    assert topo["kv_cache_dtype"] == "nvfp4" and topo["nextn"] == 1
    assert topo["prefill_batched_tokens"] == 16384
    assert cfg.system == "h200_sxm" and cfg.transfer_gbps == 40.0


def test_nvfp4_rows_hold_more_tokens_than_fp8_ones():
    # rows of ../shared/notes/kv-formats.md on 78 + 1 layers, and the DSA indexer's 132 B on
    # the 21 + 1 that keep one (GLM-5.3's "full" indexer layers and the MTP layer's)
    assert perf.indexer_caches() == 22
    assert perf.kv_bytes_per_token("nvfp4") == 79 * 352 + 22 * 132
    assert perf.kv_bytes_per_token("fp8") == 79 * 576 + 22 * 132
    assert perf.kv_bytes_per_token("fp8_ds_mla") == 79 * 656 + 22 * 132
    assert perf.kv_bytes_per_token("fp8") / perf.kv_bytes_per_token("nvfp4") > 1.57


def test_offline_replay_of_a_tiny_disaggregated_fleet(tmp_path: Path, capsys):
    out = tmp_path / "run.json"
    rc = main(["run", "serving=glm5_gpu", *TINY, f"simulate.out={out}",
               f"cache_dir={tmp_path / 'cache'}", f"work_dir={tmp_path / 'work'}"])
    assert rc == 0
    got = json.loads(out.read_text())
    r = got["result"]
    assert got["fleet"] == "1P:4D" and r["requests"] >= 3
    assert 0 < r["ttft_p90_s"] < 60 and r["tok_s_user"] > 10
    assert r["prefix_reuse"] > 0.2  # later turns reuse the earlier turns' prefix
    assert "aiconfigurator-core 0.12.0" in got["perf_model"] and "gb200" in got["perf_model"]
    profile = np.load(next((tmp_path / "cache" / "sim").glob("*.npz")))
    assert profile["decode_itl"].shape[0] == len(profile["decode_active_kv_tokens"])
    itl = profile["decode_itl"][:, -1]
    assert itl[-1] > 2 * itl[0]  # a step over 4 M tokens of KV is slower than over one request
    assert "| 1P:4D |" in capsys.readouterr().out


def test_the_same_seed_gives_the_same_trace_and_numbers(tmp_path: Path):
    """Ours is deterministic: the same seed writes the same trace, and the replay of it with
    round-robin routing gives the same figures. (With the KV router it does not: Dynamo 1.6.1's
    replay breaks ties between equal-cost workers at random; README, Known limits.)"""
    def run(name: str, seed: int, seeds: int = 1) -> tuple[dict, bytes]:
        out, work = tmp_path / f"{name}.json", tmp_path / name
        rc = main(["run", "serving=glm5_gpu", *TINY, "simulate.sessions=4",
                   "simulate.policy=round_robin", f"simulate.seed={seed}", f"simulate.out={out}",
                   f"simulate.seeds={seeds}", f"cache_dir={tmp_path / 'cache'}",
                   f"work_dir={work}"])
        assert rc == 0
        [trace] = work.glob("trace_*.jsonl")
        got = json.loads(out.read_text())
        runs.append([_no_wall(r) for r in got["by_seed"]])
        return _no_wall(got["result"]), trace.read_bytes()

    runs: list[list[dict]] = []
    first, again, other = run("a", 0), run("b", 0), run("c", 1)
    assert first == again
    # over two seeds: each seed's figures, as its own run gave them
    run("d", 0, seeds=2)
    assert runs[-1] == [first[0], other[0]]
    # the replay's own timestamps split each TTFT: the three parts add up to at least p50's
    parts = ("ttft_prefill_wait_p90_s", "ttft_prefill_p90_s", "ttft_handoff_p90_s")
    assert sum(first[0][k] for k in parts) >= first[0]["ttft_p50_s"] > 0
    assert first[0]["prefill_worker_share"] == [1.0]  # one prefill worker: every request
    assert other[1] != first[1] and other[0] != first[0]


def _no_wall(result: dict) -> dict:
    return {k: v for k, v in result.items() if k != "wall_s"}


def test_the_router_s_cache_credits_reach_the_replay(tmp_path: Path, capsys):
    """simulate.overlap_credit and host_hit_weight reach the replay's router config; values
    out of range are refused before anything runs, with the key's name."""
    def run(credit: float, host: float = 1.0) -> int:
        return main(["run", "serving=glm5_gpu", *TINY, f"simulate.overlap_credit={credit}",
                     f"simulate.host_hit_weight={host}", f"simulate.out={tmp_path / 'r.json'}",
                     f"cache_dir={tmp_path / 'cache'}", f"work_dir={tmp_path / 'work'}"])

    assert run(4.0) == 0
    result = json.loads((tmp_path / "r.json").read_text())["result"]
    assert (result["overlap_credit"], result["host_hit_weight"]) == (4.0, 1.0)
    assert run(-1.0) == 2
    assert "simulate.overlap_credit=-1.0 must be a number >= 0" in capsys.readouterr().err
    assert run(1.0, 1.5) == 2
    assert "simulate.host_hit_weight=1.5 must be within 0 ... 1" in capsys.readouterr().err


def test_sessions_are_bound_to_groups_in_proportion_to_their_decoders():
    assert offline.bind_sessions([1, 1], 5) == [0, 1, 0, 1, 0]
    bound = offline.bind_sessions([2, 1], 9)
    assert bound == [0, 0, 1, 0, 0, 1, 0, 0, 1]
    assert [bound[:k].count(0) for k in (3, 6, 9)] == [2, 4, 6]  # 2:1 at every point
    groups = offline.affine_groups(offline.Fleet(prefill_workers=2, decode_workers=5))
    assert [(g.prefill_workers, g.decode_workers) for g in groups] == [(1, 3), (1, 2)]
    assert [g.agg_workers for g in offline.affine_groups(offline.Fleet(agg_workers=3))] == [1] * 3
    with pytest.raises(ValueError, match="fewer decode workers than prefill workers"):
        offline.affine_groups(offline.Fleet(prefill_workers=2, decode_workers=1))


def test_hard_affinity_keeps_every_session_on_its_prefill_worker_and_its_decoders(tmp_path):
    """kv_affine: every turn of a session is prefilled by one prefill worker and decoded by
    that worker's own decoders (2P:3D: worker 0 has decoders 0-1 and two thirds of the
    sessions, worker 1 decoder 2; the same 5 GPUs aggregated: one worker per session), in the
    replay's own per-request records; through the CLI,
    every returning turn counts as kept home; soft and hard affinity are refused where they
    do not run."""
    from planner.sim import Sim

    args = ["serving=glm5_gpu", "serving.prefill_engines=2", "serving.decode_engines=3", *TINY,
            "simulate.sessions=6", "simulate.policy=kv_affine",
            f"cache_dir={tmp_path / 'cache'}", f"work_dir={tmp_path / 'work'}"]
    serving, cfg, _, _ = load(args)
    sim = Sim(serving, cfg, tmp_path / "work", tmp_path / "cache")
    sessions = sim.sessions(12)
    trace = workload.write_trace(tmp_path / "trace.jsonl", sessions, 0)
    _, done = offline._replay_groups(trace, sim.fleet(), 6, {})
    assert len(done) == sum(len(s) for s in sessions)  # every turn of every session, once
    assert all(r["terminal_status"] == "completed" for r in done)
    group = offline.bind_sessions([2, 1], 12)
    decoders = {0: {0, 1}, 1: {2}}
    for r in done:
        g = group[int(r["session_id"][1:])]
        assert r["prefill_worker_idx"] == g and r["decode_worker_idx"] in decoders[g], r
    assert {r["decode_worker_idx"] for r in done} == {0, 1, 2}  # both of group 0's decoders
    # aggregated: a group per worker, each session's turns all on its own
    _, done = offline._replay_groups(trace, sim.fleet(agg=True), 6, {})
    assert len(done) == sum(len(s) for s in sessions)
    group = offline.bind_sessions([1] * 5, 12)
    assert all(r["decode_worker_idx"] == group[int(r["session_id"][1:])] for r in done)
    assert {r["decode_worker_idx"] for r in done} == set(range(5))

    out = tmp_path / "affine.json"
    assert main(["run", *args, f"simulate.out={out}"]) == 0
    r = json.loads(out.read_text())["result"]
    assert r["policy"] == "kv_affine" and r["next_turn_same_prefill"] == 1.0
    assert r["prefill_worker_share"] == [pytest.approx(2 / 3, abs=0.01),
                                         pytest.approx(1 / 3, abs=0.01)]
    assert r["itl_p90_ms"] > 0 and r["requests"] > 0
    assert main(["run", *args[:-3], "simulate.policy=kv_soft"]) == 2
    assert main(["run", *args, "simulate.mode=live"]) == 2


def test_the_ratio_search_runs_once_per_seed_and_counts_each_seeds_winner(tmp_path):
    """Each seed searches every ratio's capacity on its own sessions; side by side
    (`simulate.jobs=2`) the same numbers as one after another (round-robin replays repeat)."""
    from planner import predict
    from planner.sim import Sim

    serving, cfg, _, _ = load(["serving=glm5_gpu", *TINY, "simulate.policy=round_robin",
                               "simulate.target_tok_s=97.5", "simulate.ttft_slo_s=0.7",
                               f"cache_dir={tmp_path / 'cache'}"])
    (tmp_path / "work").mkdir()
    sims = [Sim(serving, replace(cfg, seed=s), tmp_path / "work", tmp_path / "cache")
            for s in (0, 1)]
    one = predict.best_ratio(sims, jobs=1, low=1, high=8)
    two = predict.best_ratio(sims, jobs=2, low=1, high=8)
    strip = [[{k: v for k, v in x.items() if k != "wall_s"} for x in r["runs"]]
             for r in one["rows"]]
    assert strip == [[{k: v for k, v in x.items() if k != "wall_s"} for x in r["runs"]]
                     for r in two["rows"]]
    assert one["seeds"] == [0, 1] and sum(one["wins"].values()) == 2
    for r in one["rows"]:
        assert len(r["sessions_by_seed"]) == 2 and r["sessions"] == sum(r["sessions_by_seed"]) / 2
        assert {x["seed"] for x in r["runs"]} == {0, 1}
        for seed, found in zip((0, 1), r["sessions_by_seed"], strict=True):
            ok = [x["sessions"] for x in r["runs"] if x["seed"] == seed and x["ok"]]
            assert found == max(ok, default=0)  # the largest count that met the target
    assert one["best"] == max(one["rows"], key=lambda r: r["sessions_per_gpu"])["ratio"]
    assert len({r["sessions_per_gpu"] for r in one["rows"]}) > 1  # the target separates them
    assert predict.same_ratio("2:8", "1:4") and not predict.same_ratio("2:6", "1:4")


def _request(session: str, turn: int, worker: int, arrival: float, admit: float, held: float,
             first: float) -> dict:
    return {"session_id": session, "turn_index": turn, "prefill_worker_idx": worker,
            "arrival_time_ms": arrival, "prefill_admit_ms": admit, "source_held_ms": held,
            "first_token_ms": first}


def test_ttft_is_split_at_the_replay_s_own_timestamps_and_stickiness_counts_returns():
    done = [  # s0 stays on worker 0 twice, then moves; s1 starts on 1 and stays
        _request("s0", 0, 0, 0, 1000, 3000, 3100), _request("s0", 1, 0, 0, 0, 500, 600),
        _request("s0", 2, 1, 0, 200, 700, 1700), _request("s1", 0, 1, 0, 0, 400, 450),
        _request("s1", 1, 1, 0, 0, 400, 450)]
    got = offline.where_ttft_goes(done)
    assert got["prefill_worker_share"] == [0.4, 0.6]
    assert got["next_turn_same_prefill"] == pytest.approx(2 / 3)  # s0: 1 of 2 returns, s1: 1 of 1
    assert got["ttft_prefill_wait_p90_s"] == pytest.approx(percentile([1, 0, 0.2, 0, 0], 0.9))
    assert got["ttft_prefill_p90_s"] == pytest.approx(percentile([2, 0.5, 0.5, 0.4, 0.4], 0.9))
    assert got["ttft_handoff_p90_s"] == pytest.approx(percentile([0.1, 0.1, 1, .05, .05], 0.9))
    aggregated = [{k: v for k, v in r.items() if k != "prefill_admit_ms"} for r in done]
    assert offline.where_ttft_goes(aggregated) == {}  # no prefill pool: nothing to split


def test_live_mocker_engines_behind_the_real_frontend(tmp_path: Path):
    before = process_table()
    out = tmp_path / "live.json"
    rc = main(["run", "serving=kv_routed", "serving.engines=1", "serving.tensor_parallel=8",
               "simulate.mode=live",
               "simulate.policy=kv_soft", "simulate.speedup_ratio=10", *TINY,
               f"simulate.out={out}", f"cache_dir={tmp_path / 'cache'}",
               f"work_dir={tmp_path / 'work'}"])
    assert rc == 0
    r = json.loads(out.read_text())["result"]
    assert r["mode"] == "live" and r["policy"] == "kv_soft" and r["requests"] == 2 * 2 * 3
    assert r["ttft_p50_s"] > 0 and r["tok_s_user"] > 0
    assert new_job_processes(before) == []


def test_record_shapes_are_read_from_a_run_folder(tmp_path: Path):
    (tmp_path / "data").mkdir()
    turns = [[{"prompt_tokens": 1000, "completion_tokens": 50, "tool_s": 1.5},
              {"prompt_tokens": 1600, "completion_tokens": 40, "tool_s": 0.5}]]
    pq.write_table(pa.table({"turns": turns}), tmp_path / "data" / "part-00000000.parquet")
    shapes = workload.read_records(tmp_path)
    assert shapes == [[workload.Turn(1000, 50, 1.5), workload.Turn(1600, 40, 0.5)]]
    drawn = workload.record_sessions(shapes, 3, token_scale=10.0)
    assert drawn[0][1] == workload.Turn(16000, 400, 0.5)
    summary = workload.shape_summary(drawn)
    assert summary["mean_growth"] == 6000 and summary["turns_per_session"] == 2
    trace = workload.write_trace(tmp_path / "t.jsonl", drawn[:1])
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    assert lines[1]["hash_ids"][:len(lines[0]["hash_ids"])] == lines[0]["hash_ids"]
    assert lines[1]["delay"] == 1500.0


def test_a_tiny_sweep_runs_its_points_side_by_side(tmp_path: Path):
    out = tmp_path / "sweep.json"
    tiny = [x for x in TINY if not x.startswith("simulate.sessions=")]
    rc = main(["sweep", "serving=glm5_gpu", *tiny, "simulate.sweep_sessions=[2]",
               "simulate.sweep_policies=[kv]", "simulate.jobs=2", f"simulate.out={out}",
               f"cache_dir={tmp_path / 'cache'}", f"work_dir={tmp_path / 'work'}"])
    assert rc == 0
    got = json.loads(out.read_text())
    assert [x["ratio"] for x in got["results"]] == [f"1:{k}" for k in range(1, 7)]
    assert all(x["requests"] >= 3 and x["policy"] == "kv" for x in got["results"])
    assert got["simulations"] == 6 and set(got["breaks"]) == {f"1:{k} kv" for k in range(1, 7)}


LOOPBACK_RUNS = ["bench/kv_layout.json", "bench/simulate_kv_layout_holdout.json",
                 "bench/simulate_kv_layout_rerun.json"]


def test_the_descriptor_model_counts_the_measured_layouts():
    """scripts/bench_kv_layout.py's runs (three geometries and days): the descriptors and bytes
    each layout moved are the model's, from the geometry alone."""
    for name in LOOPBACK_RUNS:
        run = json.loads((ROOT / name).read_text())
        p = {k: int(v) for k, v in run["parameters"].items() if v.isdigit()}
        geo = descriptors.Geometry(p["layers"], p["row"], p["block"])
        for layout, measured in run["results"].items():
            assert descriptors.descriptors(layout, geo, p["tokens"]) == measured["descriptors"]
            assert geo.bytes(p["tokens"]) == measured["bytes"]
    committed = json.loads((ROOT / LOOPBACK_RUNS[0]).read_text())["results"]
    assert (committed["per_layer"]["descriptors"], committed["block_major"]["descriptors"]) == \
        (99_840, 1_280)


def test_the_loopback_transport_times_its_committed_run():
    """TRANSPORTS' loopback constants are bench/kv_layout.json's: 1504.7 and 176.7 ms back."""
    run = json.loads((ROOT / LOOPBACK_RUNS[0]).read_text())["results"]
    t = descriptors.TRANSPORTS["mooncake_tcp_loopback"]
    for r in run.values():
        assert abs(t.ms(r["descriptors"], r["bytes"]) / r["ms_median"] - 1) < 0.01


def test_two_constants_time_gpu_transfers_of_another_row_size():
    """Fit on the H200 pair's 352-byte runs (both layouts, 16/64-token blocks, whole and TP-split
    requests), the model times the 576-byte runs within 12%, from 391 to 975,000 copies."""
    cases = json.loads((ROOT / "kernels/results/h200x2_bench_kv_transfer.json").read_text())
    points = {row: [(c[k]["copies"], c[k]["bytes"], c[k]["ms"]) for c in cases["cases"]
                    if c["row"] == row for k in ("a_per_layer", "b_block_major")]
              for row in (352, 576)}
    for c in cases["cases"]:  # 78 layers: one copy per (layer, block), one per block
        geo = descriptors.Geometry(78, c["row"], c["block"])
        tokens = c["blocks_moved"] * c["block"]
        assert c["a_per_layer"]["copies"] == descriptors.descriptors("per_layer", geo, tokens)
        assert c["b_block_major"]["copies"] == descriptors.descriptors("block_major", geo, tokens)
    t = descriptors.fit(points[352], "352-byte runs")
    errors = [t.ms(n, b) / ms - 1 for n, b, ms in points[576]]
    assert max(abs(e) for e in errors) < 0.12, errors
    registered = descriptors.TRANSPORTS["cudamemcpy_h200_nvlink"]
    both = descriptors.fit(points[352] + points[576], "all")
    assert abs(registered.descriptor_us / both.descriptor_us - 1) < 0.01
    assert abs(registered.gbps / both.gbps - 1) < 0.01


def test_layouts_predicts_the_seed_workers_transfer(tmp_path: Path, capsys):
    """The seed's sessions (8k + 6k a turn to 140k) move 74,000 tokens a turn on average when
    the whole prompt moves: 1,157 blocks of 64 tokens, 101 regions (79 MLA + 22 indexer
    caches) per block per-layer, 1 block-major, each at the real connector's runs per block."""
    from planner.connector import run_share

    out = tmp_path / "layouts.json"
    assert main(["layouts", "serving=glm5_gpu", f"simulate.out={out}",
                 f"cache_dir={tmp_path / 'cache'}"]) == 0
    whole = json.loads(out.read_text())["cases"]["whole prompt"]
    share = run_share().share
    assert whole["tokens"] == 74_000
    assert whole["per_layer"] == pytest.approx(101 * 1_157 * share)
    assert whole["block_major"] == pytest.approx(1_157 * share)
    assert f"| whole prompt | 74,000 | {101 * 1_157 * share:,.0f} ->" in capsys.readouterr().out


def _brute_force(meets, fleets: list[planner.Shape]) -> int | None:
    """The fewest GPUs of any fleet that meets the target: every fleet judged."""
    return min((s.gpus for s in fleets if meets(s)), default=None)


def test_the_planner_finds_the_brute_force_minimum_of_monotone_fleets():
    """Over 300 random targets on fleets whose capacity grows with both roles, with TP4, TP8,
    TP1EP8 (8 GPUs of attention DP) and TP4EP8 (8 GPUs) workers per role, the staircase finds
    the fewest GPUs the full grid finds, judging fewer fleets."""
    rng = random.Random(0)
    layouts = [(4, 4), (8, 8), (1, 8), (4, 8)]
    fleets = planner.grid(3, 8, layouts)
    assert {planner.worker_gpus(*x) for x in layouts} == {4, 8}
    assert planner.Shape(1, 2, 4, 1, 4, 8).gpus == 4 + 2 * 8
    for _ in range(300):
        prefill_rate = {x: rng.uniform(1, 3) * planner.worker_gpus(*x) for x in layouts}
        decode_rate = {x: rng.uniform(1, 4) * planner.worker_gpus(*x) for x in layouts}
        need = rng.uniform(2, 80)

        def meets(s: planner.Shape, pr=prefill_rate, dr=decode_rate, need=need) -> bool:
            return min(s.prefill * pr[s.tp_prefill, s.ep_prefill],
                       s.decode * dr[s.tp_decode, s.ep_decode]) >= need

        best, judged = planner.smallest(meets, 3, 8, layouts)
        assert (best.gpus if best else None) == _brute_force(meets, fleets)
        assert best is None or meets(best)
        assert len(judged) < len(fleets)


def test_an_attention_dp_worker_is_as_many_engines_each_holding_one_rank_s_kv(tmp_path):
    """TP1EP8 ("DEP8") decoders: a worker of 8 GPUs is 8 attention-DP ranks. Its table is
    aiconfigurator's at attention DP 8, each rank holds the KV aiconfigurator's memory model
    leaves one GPU at that layout and an eighth of the worker's host tier, and the replay
    spreads the worker's sessions over its 8 ranks (engines of their own), where a TP8 worker
    is one engine."""

    from aiconfigurator_core.sdk import memory

    from planner.sim import Sim

    serving, cfg, _, _ = load(["serving=glm5_gpu", *TINY])
    sim = Sim(serving, cfg, tmp_path / "work", tmp_path / "cache")
    dep = sim.shape_fleet(planner.Shape(1, 1, 8, 1, 8, 8))
    assert (dep.dp, dep.prefill_dp) == (8, 1)
    assert offline.engine_args(dep, "decode")["dp_size"] == 8
    assert offline.engine_args(dep, "prefill")["dp_size"] == 1
    host = replace(dep, host_blocks=8000)
    assert [offline.engine_args(host, role)["engine"]["native_host_offload"]["num_host_blocks"]
            for role in ("prefill", "decode")] == [8000, 1000]  # a worker's tier, per rank
    est = memory.estimate_kv_cache(
        sim.spec.checkpoint, "gb200", "vllm", "current", max_num_tokens=16384,
        max_batch_size=256, memory_fraction_kind="of_total", memory_fraction_value=0.9,
        tp_size=1, attention_dp_size=8, moe_tp_size=1, moe_ep_size=8, kvcache_quant_mode="fp8",
        nextn=1)
    per_token = perf.kv_bytes_per_token("nvfp4")
    assert dep.kv_blocks == int(est["total_kv_size_bytes"] // per_token) // offline.BLOCK
    assert dep.kv_blocks != dep.prefill_kv_blocks  # the TP8 prefill worker's is its own
    assert "TP1 EP8 (attention DP8)" in perf.describe(Path(dep.profile))["label"]
    assert planner.Shape(1, 1, 8, 1, 8, 8).name == "1P:1D (TP8/TP1EP8)"
    trace = workload.write_trace(tmp_path / "trace.jsonl", sim.sessions(32), 0)
    for fleet, engines in ((dep, 8), (sim.shape_fleet(planner.Shape(1, 1)), 1)):
        _, done = offline._replay(trace, fleet, 16, "kv_router", {})
        assert len({r["decode_worker_idx"] for r in done}) == engines


def test_a_small_plan_is_the_smallest_fleet_that_simulation_finds_by_brute_force(tmp_path):
    """`plan` on a tiny workload (6 sessions, prompts 2k-4k), prefill/decode 1-2 x 1-3 workers,
    TP 4 or 8 per role, over 2 seeds side by side: every fleet of the grid simulated under each
    seed (round-robin routing: repeatable), none with fewer GPUs than the plan's meets the target
    under both (a 12-GPU fleet meets it under one), the plan's does, each judged fleet's figures
    are its seeds' own runs, and the plan simulated fewer fleets."""
    tiny = [x for x in TINY if not x.startswith("simulate.sessions=")]
    args = ["serving=glm5_gpu", *tiny, "simulate.sessions=6", "simulate.policy=round_robin",
            "simulate.plan_max_prefill=2", "simulate.plan_max_decode=3",
            "simulate.plan_layouts=[TP4,TP8]", "simulate.target_tok_s=89.3",
            "simulate.target_stat=mean",
            "simulate.ttft_slo_s=0.75",
            "simulate.seeds=2", "simulate.jobs=2",
            f"cache_dir={tmp_path / 'cache'}", f"work_dir={tmp_path / 'work'}"]
    out = tmp_path / "plan.json"
    assert main(["plan", *args, f"simulate.out={out}"]) == 0
    got = json.loads(out.read_text())
    serving, cfg, _, _ = load(args)
    from planner.sim import Sim

    sims = Sim(serving, cfg, tmp_path / "work", tmp_path / "cache").seeded()
    assert [x.cfg.seed for x in sims] == got["seeds"] == [0, 1]
    fleets = planner.grid(2, 3, [(4, 4), (8, 8)])
    runs = {s: [x.run(sims[0].shape_fleet(s), 6) for x in sims] for s in fleets}
    ok = {s: all(r["ok"] for r in rs) for s, rs in runs.items()}
    assert got["best"] is not None and len(got["judged"]) < len(fleets)
    best = planner.Shape(**got["best"])
    assert ok[best] and best.gpus == _brute_force(ok.__getitem__, fleets)
    assert any(ok.values()) and not all(ok.values())  # the target separates the fleets
    # and the seeds disagree on some (1P:1D with TP8 decode: 88.4 and 90.2 tok/s per user)
    assert any(len({r["ok"] for r in rs}) == 2 for rs in runs.values())
    assert got["simulations"] == sum(j.get("judged", 0) for j in got["judged"])
    for judged in got["judged"]:
        shape = planner.Shape(**{k: judged[k] for k in ("prefill", "decode", "tp_prefill",
                                                          "tp_decode", "ep_prefill", "ep_decode")})
        assert judged["ok"] == ok[shape]
        seen = [(r["tok_s_user"], r["ttft_p90_s"]) for r in judged["by_setting"]]
        assert seen == [(r["tok_s_user"], r["ttft_p90_s"]) for r in runs[shape]][:len(seen)]


def test_the_fit_recovers_known_efficiencies_and_leaves_the_pinned_knobs_alone():
    """A known world: tok/s per user = 70 x decode efficiency (less a little per prefill
    slowness), TTFT p90 = 40 s / prefill efficiency^2. The fit lands on the efficiencies that
    give 101 tok/s and 10 s, within its tolerances, and never moves tool time, MTP or host tier."""
    from planner import calibrate

    def measure(k: dict) -> dict:
        return {"tok_s_user": 70 * k["decode_efficiency"] * (1 - 0.02 / k["prefill_efficiency"]),
                "ttft_p90_s": 40 / k["prefill_efficiency"] ** 2}

    got = calibrate.fit(measure, 101.0, 10.0)
    assert abs(got.result["tok_s_user"] / 101 - 1) < 0.02
    assert got.result["ttft_p90_s"] <= 10.0
    assert 2.0 <= got.knobs["prefill_efficiency"] < 2.0 * 1.04
    assert abs(got.knobs["decode_efficiency"] - 101 / 70 / (1 - 0.02 / 2)) < 0.04
    pinned = {k: v.value for k, v in calibrate.KNOBS.items() if not v.fitted_to}
    assert all(s["knobs"][k] == v for s in got.steps for k, v in pinned.items())
    assert len(got.steps) < 30


def test_calibrate_fits_the_published_point_and_predicts_the_rest(tmp_path: Path, capsys):
    """A tiny workload: the fit lands 66 sessions on 1P:4D at 101 tok/s per user (within 2%)
    with TTFT p90 at most the SLO, over 2 seeds; pinned knobs stay as stated; the predictions
    table holds the KV rows' capacities as aiconfigurator's budget over 79 x (row + 132 B)."""
    tiny = [x for x in TINY if not x.startswith("simulate.sessions=")]
    out = tmp_path / "cal.json"
    assert main(["calibrate", "serving=glm5_gpu", *tiny, "simulate.policy=round_robin",
                 "simulate.seeds=2", "simulate.predict_ratios=false", "simulate.ttft_slo_s=1",
                 "simulate.knob_ends=false",
                 f"simulate.out={out}", f"cache_dir={tmp_path / 'cache'}",
                 f"work_dir={tmp_path / 'work'}"]) == 0
    got = json.loads(out.read_text())
    cal = got["calibration"]
    assert [abs(r["tok_s_user"] / 101 - 1) < 0.02 for r in cal["point"]] == [True, True]
    assert cal["point"][0]["ttft_p90_s"] <= 1.0
    assert (cal["knobs"]["tool_s"], cal["knobs"]["mtp_acceptance"]) == (8.0, 0.85)
    kv = got["predictions"]["kv_tokens"]
    assert kv["nvfp4"] / kv["fp8"] == pytest.approx((79 * 576 + 22 * 132) / (79 * 352 + 22 * 132),
                                                    rel=1e-4)
    assert len(got["predictions"]["itl"]) == 2
    assert "| p90 ITL, 1P:4D vs the same 5 workers aggregated" in capsys.readouterr().out


def test_the_sensitivity_sweep_moves_one_knob_at_a_time_once_per_value_and_seed():
    """Each knob across its range (4 points and its calibrated value), the others held: every
    setting measured once per seed, and each figure is the mean of its seeds' with their range."""
    from planner import calibrate, sensitivity

    knobs = {k: v.value for k, v in calibrate.KNOBS.items()}
    calls = []

    def measure(settings: list[dict]) -> list[list[dict]]:
        calls.extend(settings)
        return [[{"tok_s_user": 50 * k["decode_efficiency"] + seed,
                  "ttft_p90_s": 20 / k["tool_s"] * (1 + seed)} for seed in (0, 1)]
                for k in settings]

    got = sensitivity.sweep(measure, knobs)
    assert len(calls) == sum(len(v) for v in got.values()) == 5 * 5 - 1  # host tier: at an end
    tool_s = (2.0, 8.0, 21.333333, 40.666667, 60.0)
    assert [r["value"] for r in got["tool_s"]] == list(tool_s)
    assert [r["ttft_p90_s"] for r in got["tool_s"]] == [30 / v for v in tool_s]
    assert [r["ttft_p90_s_range"] for r in got["tool_s"]] == [[20 / v, 40 / v] for v in tool_s]
    assert [r["tok_s_user_range"] for r in got["decode_efficiency"]] == [
        [50 * r["value"], 50 * r["value"] + 1] for r in got["decode_efficiency"]]
    assert all(sum(c[j] != knobs[j] for j in knobs) <= 1 for c in calls)


def test_a_static_trace_opens_every_request_with_the_same_cached_prefix(tmp_path: Path):
    sessions = workload.static_sessions(4000, 50, 3)
    trace = workload.write_trace(tmp_path / "t.jsonl", sessions, shared=3000)
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    shared = 3000 // workload.TRACE_BLOCK
    assert [x["input_length"] for x in lines] == [4000] * 3
    assert all(x["hash_ids"][:shared] == list(range(shared)) for x in lines)
    rest = [set(x["hash_ids"][shared:]) for x in lines]
    assert all(len(r) == -(-4000 // workload.TRACE_BLOCK) - shared for r in rest)
    assert not (rest[0] & rest[1]) and not (rest[1] & rest[2]) and not (rest[0] & set(
        range(shared)))
    assert workload.mean_prefix(sessions, 3000) == 3000  # every computed token follows them


def test_static_asks_aiconfigurators_cli_the_same_question_the_replay_answers(tmp_path, capsys):
    """Real aiconfigurator CLI (estimate and its own search) beside the replay, on a small
    static question: its estimate reports the fleet and batch we asked for, both sides see the
    cached prefix (TTFT within 2x of each other; a side that computed the whole prompt would take
    ~5x longer), and its search's fleets fit the GPU budget and meet the targets."""
    out = tmp_path / "static.json"
    args = ["serving=glm5_gpu", "simulate.isl=20000", "simulate.prefix=16384", "simulate.osl=64",
            "simulate.static_batches=[1,2]", "simulate.total_gpus=8", "simulate.ttft_slo_s=5",
            "simulate.target_tok_s=50", "simulate.lifetimes=3", f"simulate.out={out}",
            f"cache_dir={tmp_path / 'cache'}", f"work_dir={tmp_path / 'work'}"]
    assert main(["static", *args]) == 0
    got = json.loads(out.read_text())
    assert got["fleet"] == "1P:4D TP8" and got["gpus"] == 40
    assert got["simulate"]["workload"] == "static"
    for point in got["points"]:
        theirs, ours = point["aiconfigurator"], point["replay"]
        assert theirs["concurrency"] == point["in_flight"] == 4 * point["decode_batch"]
        assert 0.5 < ours["ttft_p50_ms"] / theirs["ttft_ms"] < 2.0, point
    assert got["search"], "aiconfigurator found no fleet"
    for fleet in got["search"]:
        assert fleet["gpus"] <= 8 and fleet["tok_s_user"] >= 50 and fleet["ttft_ms"] <= 5000
    assert "tok/s/user: aiconfigurator" in capsys.readouterr().out


@pytest.mark.parametrize("bad, says", [
    (["simulate.decode_efficiency=1.47"], "no efficiency knob"),
    (["simulate.prefix=20000"], "must be >= 0 and below simulate.isl=20000"),
])
def test_static_refuses_what_aiconfigurator_cannot_match(bad, says, tmp_path, capsys):
    rc = main(["static", "serving=glm5_gpu", "simulate.isl=20000", *bad,
               f"cache_dir={tmp_path / 'cache'}"])
    assert rc == 2 and says in capsys.readouterr().err


@pytest.mark.parametrize("bad, says", [
    (["simulate.plan_layouts=[TP8,DEP8]"], "simulate.plan_layouts: worker layout 'DEP8': "
                                            "expected TP<n> or TP<n>EP<m>"),
    (["simulate.plan_layouts=[TP4EP6]"], "TP and EP must divide one another"),
    (["simulate.plan_layouts=[TP8,TP8EP4]"], "simulate.plan_layouts: aiconfigurator-core 0.12.0 "
                                             "has no vllm data for TP8 EP4 on gb200"),
    (["serving.data_parallel=2", "serving.decode_args=[]", "serving.prefill_args=[]"],
     "serving.data_parallel=2 without --enable-expert-parallel"),
    (["serving.decode_args=[]"], "--enable-expert-parallel in one role's args only"),
])
def test_a_layout_the_simulation_cannot_take_is_refused_before_any_simulation(bad, says,
                                                                              tmp_path, capsys):
    rc = main(["plan", "serving=glm5_gpu", *bad, f"cache_dir={tmp_path / 'cache'}",
               f"work_dir={tmp_path / 'work'}"])
    assert rc == 2 and says in capsys.readouterr().err
    assert not list((tmp_path / "work").glob("*.jsonl"))  # refused before any simulation
