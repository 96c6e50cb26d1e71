"""The modelling errors issue 50 names, each fixed: the host tier per GPU, efficiencies on
layouts the fit has not seen, a DEP8 prefill worker's rate, the tok/s target at p10, the docs'
plan command at the fitted knobs; and the replay's KV handoff timed by the transfer model."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from planner import connector, descriptors, offline, perf, planner
from planner.cli import at_calibrated, load
from planner.sim import Sim
from rollfleet.paths import ROOT

TINY = ["simulate.first_prompt=2000", "simulate.growth=1000", "simulate.max_prompt=4000",
        "simulate.output=100", "simulate.tool_s=1", "simulate.sessions=8",
        "simulate.lifetimes=2"]


@pytest.fixture(scope="module")
def sim(tmp_path_factory) -> Sim:
    tmp = tmp_path_factory.mktemp("fixes")
    serving, cfg, _, _ = load(["serving=glm5_gpu", *TINY, "simulate=gb200_host",
                               "simulate.decode_efficiency=1.5",
                               "simulate.prefill_efficiency=2.0"])
    return Sim(serving, cfg, tmp / "work", ROOT / ".cache")


def changed(sim: Sim, **settings) -> Sim:
    return Sim(sim.serving, replace(sim.cfg, **settings), sim.work_dir, sim.cache_dir)


def test_a_worker_s_host_tier_is_its_gpus_share(sim: Sim):
    """180 GB of distinct KV per GPU: a TP8 worker's tier is twice a TP4 worker's, and a DEP8
    worker's (8 GPUs) is a TP8 worker's, shared out among its 8 ranks."""
    per_token = perf.kv_bytes_per_token("nvfp4")
    tp8 = int(180e9 * 8 // per_token) // offline.BLOCK
    fleet = sim.shape_fleet(planner.Shape(1, 2, 4, 8, 4, 8))
    assert (fleet.prefill_host_blocks, fleet.host_blocks) == (tp8 // 2, tp8)
    args = offline.engine_args(fleet, "prefill")["engine"]
    assert args["native_host_offload"]["num_host_blocks"] == tp8 // 2
    dep = sim.shape_fleet(planner.Shape(1, 1, 8, 1, 8, 8))
    assert dep.host_blocks == tp8
    assert offline.engine_args(dep, "decode")["engine"]["native_host_offload"][
        "num_host_blocks"] == tp8 // 8
    assert sim.fleet(1).host_blocks == tp8  # the serving config's TP8 workers


def test_efficiencies_fitted_on_tp8_reach_other_layouts_only_as_far_as_the_carry_says(sim):
    spec = sim.layout_spec(8, 8)
    assert (spec.prefill_efficiency, spec.decode_efficiency) == (2.0, 1.5)  # the fit's layout
    for carry, want in ((1.0, 1.5), (0.5, 1.5 ** 0.5), (0.0, 1.0)):
        other = changed(sim, layout_efficiency_carry=carry)
        tp4 = other.layout_spec(4, 4)
        assert tp4.decode_efficiency == pytest.approx(want)
        assert tp4.prefill_efficiency == pytest.approx(2.0 ** carry)
        assert other.layout_spec(8, 8).decode_efficiency == 1.5


def test_a_dep8_prefill_worker_keeps_only_its_overlap_of_the_eightfold_rate(sim):
    """aiconfigurator times each of a DEP8 prefill worker's 8 ranks as if all prefilled at once;
    the worker keeps 1 + 7 x overlap rank rates of the 8 (at 0: one rank's rate). Decoders and
    TP prefill workers are untouched; the table's prefill times scale by the same factor."""
    for overlap in (1.0, 0.5, 0.0):
        other = changed(sim, dp_prefill_overlap=overlap)
        dep = other.layout_spec(1, 8, "prefill")
        assert dep.prefill_efficiency == pytest.approx(2.0 * (1 + 7 * overlap) / 8)
        assert other.layout_spec(1, 8, "decode").prefill_efficiency == 2.0
        assert other.layout_spec(8, 8, "prefill").prefill_efficiency == 2.0
    import numpy as np

    full = np.load(perf.build_profile(sim.layout_spec(1, 8, "prefill"), sim.cache_dir / "sim"))
    other = changed(sim, dp_prefill_overlap=0.0)
    alone = np.load(perf.build_profile(other.layout_spec(1, 8, "prefill"), sim.cache_dir / "sim"))
    assert alone["prefill_ttft_ms"] == pytest.approx(8 * full["prefill_ttft_ms"])


def test_the_target_is_the_slowest_users_tok_s_not_the_mean(sim: Sim):
    run = {"tok_s_user": 104.0, "tok_s_user_p10": 96.0, "ttft_p90_s": 1.0}
    assert sim.cfg.target_stat == "p10" and not sim.meets(run)
    assert changed(sim, target_stat="mean").meets(run)


def test_every_plan_command_in_the_docs_runs_at_the_fitted_knobs(tmp_path: Path):
    """The planner page's `plan` commands name the fit (`simulate.calibrated=`), and a
    calibrated run takes its knobs from there."""
    text = (ROOT / "docs" / "planner.md").read_text()
    commands = re.findall(r"python -m planner plan (?:[^\n\\]|\\\n)*", text)
    assert commands and all("simulate.calibrated=" in c for c in commands), commands
    fit = tmp_path / "fit.json"
    fit.write_text(json.dumps({"calibration": {"knobs": {
        "decode_efficiency": 1.4, "prefill_efficiency": 2.1, "tool_s": 8.0,
        "mtp_acceptance": 0.85, "host_kv_gb_per_gpu": 180.0, "layout_efficiency_carry": 1.0,
        "dp_prefill_overlap": 1.0}}}))
    _, cfg, _, _ = load([f"simulate.calibrated={fit}"])
    got = at_calibrated(cfg)
    assert (got.decode_efficiency, got.prefill_efficiency, got.host_kv_gb_per_gpu) == \
        (1.4, 2.1, 180.0)


def test_itl_is_summarized_three_ways():
    """Per-token p90 is the replay's own; per request, the p90 of each request's mean gap;
    and the mean gap over every decoded token."""
    done = [{"session_id": f"s{i}", "terminal_status": "completed", "itl_ms": itl,
             "output_length": n, "ttft_ms": 100.0, "input_length": 1000,
             "arrival_time_ms": 0.0, "terminal_time_ms": 1000.0}
            for i, (itl, n) in enumerate([(10.0, 11), (20.0, 11), (30.0, 101), (40.0, 11)])]
    got = offline.summarize({"p90_itl_ms": 33.0}, done, None)
    assert got["itl_p90_ms"] == 33.0
    assert got["itl_request_p90_ms"] == pytest.approx(37.0)  # 30 + 0.7 x (40 - 30)
    assert got["itl_mean_ms"] == pytest.approx((100 + 200 + 3000 + 400) / 130)


def test_the_replay_moves_kv_as_the_transfer_model_times_it(sim: Sim):
    """The handoff's bandwidth is the one at which a token's bytes and its share of the
    layout's descriptors (101 regions x the probe's runs per block / 64 tokens) take the
    transport's time: a whole 74k-token prompt in the time descriptors.Transport gives."""
    gbps = sim.fleet(1).transfer_gbps
    assert gbps == connector.transfer_gbps("nvfp4", "per_layer", "nixl_cuda_ipc_gb200") < 50
    geo = perf.kv_geometry("nvfp4", offline.BLOCK)
    tokens = 74_000
    share = connector.run_share().share
    want = descriptors.TRANSPORTS["nixl_cuda_ipc_gb200"].ms(
        geo.regions * tokens / geo.block * share, tokens * geo.bytes_per_token)
    assert tokens * geo.bytes_per_token / (gbps * 1e6) == pytest.approx(want)
