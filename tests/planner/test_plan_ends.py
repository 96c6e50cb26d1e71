"""`plan` across the pinned knobs' ends (issue 50): a fleet counts only if it meets the target
at the calibrated knobs and at every end the calibration left standing; ends that cannot move a
fleet are skipped for it; fleets say how many NVL72 racks they take."""

from __future__ import annotations

import json
from pathlib import Path

from planner import planner
from planner.cli import main
from planner.ends import End
from planner.plan_cmd import matters, racks

TINY = ["simulate.lifetimes=2", "simulate.first_prompt=2000", "simulate.growth=1000",
        "simulate.max_prompt=4000", "simulate.output=100", "simulate.tool_s=0.2",
        "simulate.sessions=6", "simulate.policy=round_robin", "simulate.plan_max_prefill=1",
        "simulate.plan_max_decode=4", "simulate.plan_layouts=[TP8]", "simulate.target_stat=mean",
        "simulate.ttft_slo_s=5"]


def test_an_end_matters_only_to_fleets_it_can_change():
    base = (8, 8)
    tp8, tp4 = planner.Shape(1, 2), planner.Shape(1, 2, 4, 8, 4, 8)
    dep = planner.Shape(1, 2, 1, 8, 8, 8)
    carry = End("layout_efficiency_carry", 0.0, {}, False, True)
    overlap = End("dp_prefill_overlap", 0.0, {}, False, True)
    tool = End("tool_s", 60.0, {}, True, True)
    assert [matters(carry, s, base) for s in (tp8, tp4, dep)] == [False, True, True]
    assert [matters(overlap, s, base) for s in (tp8, tp4, dep)] == [False, False, True]
    assert all(matters(tool, s, base) for s in (tp8, tp4, dep))
    assert (racks(72, 72), racks(80, 72), racks(16, 72)) == (1, 2, 1)


def test_a_plan_meets_the_target_at_every_end_or_not_at_all(tmp_path: Path):
    """At the knobs alone a 1P:2D fleet meets 92 tok/s per user; at MTP acceptance 0.6 refitted
    (an end the calibration kept: decode efficiency 1.12) 2 decoders make 90 and 3 make 93, so
    the plan across the ends needs more of them, and its fleet's record shows it judged at that
    end. An end marked ruled out is not judged at all."""
    knobs = {"decode_efficiency": 1.0, "prefill_efficiency": 1.0, "tool_s": 0.2,
             "mtp_acceptance": 0.85, "host_kv_gb_per_gpu": 0.0,
             "layout_efficiency_carry": 1.0, "dp_prefill_overlap": 1.0}
    ends = [{"knob": "mtp_acceptance", "value": 0.6, "refitted": True, "consistent": True,
             "knobs": {**knobs, "mtp_acceptance": 0.6, "decode_efficiency": 1.12}},
            {"knob": "mtp_acceptance", "value": 0.95, "refitted": True, "consistent": False,
             "knobs": {**knobs, "mtp_acceptance": 0.95, "decode_efficiency": 0.1}}]
    fit = tmp_path / "fit.json"
    fit.write_text(json.dumps({"calibration": {"knobs": knobs, "ends": ends}}))
    args = ["serving=glm5_gpu", *TINY, "simulate.target_tok_s=92", f"simulate.calibrated={fit}",
            f"cache_dir={tmp_path / 'cache'}", f"work_dir={tmp_path / 'work'}"]
    got = {}
    for k, ends_on in (("alone", "false"), ("ends", "true")):
        out = tmp_path / f"{k}.json"
        assert main(["plan", *args, f"simulate.knob_ends={ends_on}", f"simulate.out={out}"]) == 0
        got[k] = json.loads(out.read_text())
    assert got["ends"]["ends"] == ["mtp_acceptance=0.6"]
    alone, across = got["alone"]["best"], got["ends"]["best"]
    assert alone is not None and across is not None and across["decode"] > alone["decode"]
    best = next(j for j in got["ends"]["judged"] if j["decode"] == across["decode"])
    assert [r["setting"] for r in best["by_setting"]] == ["seed 0", "mtp_acceptance=0.6"]
    assert all(r["ok"] for r in best["by_setting"]) and best["racks"] == 1
    failed = [j for j in got["ends"]["judged"] if not j["ok"] and j.get("fits", True)]
    assert any(j["failed_at"] == "mtp_acceptance=0.6" for j in failed)
