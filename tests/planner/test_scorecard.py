"""The scorecard (issue 50): rows with figure, published, predicted (mean and interval), error
and within_15; the pinned knobs' ends refitted only where the fit's fleet depends on them; the
committed calibration carries the scorecard and the planner page's table is it."""

from __future__ import annotations

import json
import re

import pytest

from planner import calibrate, ends, scorecard
from rollfleet.paths import ROOT

CALIBRATION = ROOT / "bench" / "simulate_calibration.json"


def test_a_row_scores_its_mean_against_the_published_figure_at_15_percent():
    hit = scorecard.Row("x", 100.0, 114.0, 90.0, 130.0, "u", "seeds")
    miss = scorecard.Row("y", 100.0, 84.0, 80.0, 120.0, "u", "seeds")
    assert hit.within_15 and not miss.within_15
    rec = hit.record()
    assert rec["predicted"] == {"mean": 114.0, "low": 90.0, "high": 130.0}
    assert rec["error"] == pytest.approx(0.14) and rec["within_15"] is True
    assert set(rec) >= {"figure", "published", "predicted", "error", "within_15"}
    assert scorecard.summary([hit, miss])["within_15"] == 1


def test_the_itl_row_scores_the_per_token_definition_and_reports_all_three():
    def run(request: float, token: float, mean: float) -> dict:
        return {"itl_request_p90_ms": request, "itl_p90_ms": token, "itl_mean_ms": mean}

    center = [{"disagg": run(6, 8, 5), "agg": run(10, 10, 10)}]
    at_ends = [{"disagg": run(5, 9, 5), "agg": run(10, 10, 10)}]
    row, every = scorecard.itl_rows(center, at_ends, 0.40)
    assert scorecard.SEED_ITL == "per_token"
    assert (row.mean, row.low, row.high) == pytest.approx((0.2, 0.1, 0.2))
    assert every["per_request"]["mean"] == pytest.approx(0.4)
    assert every["mean"]["mean"] == pytest.approx(0.5)


def test_pinned_ends_are_refitted_only_where_the_fit_depends_on_them():
    """A known world where tok/s per user = 70 x decode efficiency x MTP acceptance / 0.85 and
    TTFT p90 = 40 s / prefill efficiency^2 x (8 s / tool time): each end of tool time and MTP
    acceptance is refitted (MTP 0.6 needs decode efficiency ~2.0), an end that needs a prefill
    efficiency beyond its range is kept and marked ruled out, and the layout-only knobs take
    the center's efficiencies untouched."""
    def measure(k: dict) -> dict:
        return {"tok_s_user": 70 * k["decode_efficiency"] * k["mtp_acceptance"] / 0.85,
                "ttft_p90_s": 40 / k["prefill_efficiency"] ** 2 * 8 / k["tool_s"]}

    center = calibrate.fit(measure, 101.0, 10.0).knobs
    got = {e.name: e for e in ends.ends(center, ends.refitter(measure, 101.0, 10.0), 101.0, 10.0)}
    assert set(got) == {"tool_s=2", "tool_s=60", "mtp_acceptance=0.6", "mtp_acceptance=0.95",
                        "host_kv_gb_per_gpu=22.5", "layout_efficiency_carry=0",
                        "dp_prefill_overlap=0"}
    assert got["mtp_acceptance=0.6"].refitted and got["mtp_acceptance=0.6"].consistent
    assert got["mtp_acceptance=0.6"].knobs["decode_efficiency"] == pytest.approx(
        101 / 70 * 0.85 / 0.6, rel=0.03)
    assert not got["tool_s=2"].consistent  # needs prefill efficiency 4: outside 0.5 - 2.5
    assert got["tool_s=2"].knobs["prefill_efficiency"] > calibrate.KNOBS["prefill_efficiency"].high
    carry = got["layout_efficiency_carry=0"]
    assert not carry.refitted and carry.knobs == {**center, "layout_efficiency_carry": 0.0}


def test_the_committed_calibration_carries_the_scorecard_and_the_docs_show_it():
    """bench/simulate_calibration.json's scorecard: eight numeric rows and the ratio; the
    planner page's and the README's scorecard tables have each row's error as the JSON says,
    and say hit or miss."""
    got = json.loads(CALIBRATION.read_text())["scorecard"]
    numeric = [r for r in got["rows"] if "within_15" in r]
    assert len(numeric) == 8 and got["within_15"] == sum(r["within_15"] for r in numeric)
    for r in numeric:
        p = r["predicted"]
        assert p["low"] <= p["mean"] <= p["high"]
        assert r["error"] == pytest.approx(p["mean"] / r["published"] - 1)
        assert r["within_15"] == (abs(r["error"]) <= 0.15)
    for page in (ROOT / "docs" / "planner.md", ROOT / "README.md"):
        text = page.read_text()
        table = text[text.index("<!-- scorecard -->"):text.index("<!-- /scorecard -->")]
        lines = {m[0]: m for m in re.findall(r"^\| ([^|]+?) \| ([^|]+) \| ([^|]+) \| "
                                             r"([^|]+) \| (hit|miss)[^|]* \|", table, re.M)}
        assert len(lines) == len(numeric), (page.name, sorted(lines))
        for r in numeric:
            line = lines[r["figure"]]
            assert f"{r['error']:+.0%}" in line[3], (page.name, r["figure"], line)
            assert line[4] == ("hit" if r["within_15"] else "miss"), (page.name, line)
