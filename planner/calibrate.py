"""Fit what the seed does not publish to the one operating point it does, openly (issue 27).

The point: 1P:4D serving 66 sessions per prefill group at ~101 tok/s per user, and 66 is the most
a group serves at that speed. One point cannot pin five knobs, so each knob is either fitted to
the one figure it drives or pinned at a stated value inside a stated range:
- decode efficiency -> tok/s per user at 66 sessions (the decode step's time is the speed);
- prefill efficiency -> the load: 66 sessions put TTFT p90 at the SLO (the group's capacity);
- tool time, MTP acceptance, host-tier size: pinned at a value inside a stated range; the
  predictions and plans are repeated at each range's ends, refitted there (planner/ends.py);
- how much of the fitted gain a worker of another layout gets, and how much of its dp-fold
  prefill rate an attention-DP prefill worker keeps: pinned with ranges too, but the fit's
  1P:4D of TP8 workers has neither, so their ends need no refit.
`measure` (one simulation, in the CLI) is the only way figures come in, so the fit is testable
on a known function.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Knob:
    name: str  # the SimulateConfig field
    value: float  # pinned value, or where the fit starts (the efficiencies: issue 27's fit)
    low: float
    high: float
    source: str  # where the value and the range come from
    fitted_to: str = ""  # the figure it is fitted to ("": pinned)
    moves_fit: bool = True  # whether the fit's own fleet depends on it (its ends are refitted)


KNOBS: dict[str, Knob] = {k.name: k for k in (
    Knob("decode_efficiency", 1.47, 0.5, 2.5,
         "aiconfigurator-core 0.12.0's backends time one GLM-5.3 decode step on GB200 (70k "
         "context) at 0.8x-2.2x vLLM's data: SGLang 9.1 vs 19.8 ms alone, 89 vs 70 ms at batch "
         "64; TRT-LLM 16.1 / 69.6 ms", fitted_to="tok/s per user at 66 sessions = 101"),
    Knob("prefill_efficiency", 2.04, 0.5, 2.5,
         "the same data for 6k new tokens after a 67k prefix: vLLM 822 ms, TRT-LLM 580 (1.4x), "
         "SGLang 252 (3.3x)",
         fitted_to="TTFT p90 at 66 sessions = the SLO (66 is the group's capacity)"),
    Knob("tool_s", 8.0, 2.0, 60.0,
         "not published; an agent's tool call (a shell command, a test run) takes seconds to a "
         "minute; 8 s is the simulation's default since its first version"),
    Knob("mtp_acceptance", 0.85, 0.6, 0.95,
         "DeepSeek-V3's report: 85-90% of second tokens accepted; Dynamo's default first-draft "
         "rate is 0.85"),
    Knob("host_kv_gb_per_gpu", 180.0, 22.5, 180.0,
         "Grace LPDDR5X, ~180 GB per GPU for KV: 180 GB of distinct KV per GPU when the tier "
         "keeps one copy striped over a worker's ranks (conf/simulate/gb200_host.yaml), 22.5 "
         "when each of a TP8 worker's 8 ranks keeps its own copy of the replicated MLA cache"),
    Knob("layout_efficiency_carry", 1.0, 0.0, 1.0,
         "the efficiencies are fitted on TP8 workers only; nothing says how much of that gain "
         "a TP4 or attention-DP worker gets: all of it (1) to none, the data as measured (0)",
         moves_fit=False),
    Knob("dp_prefill_overlap", 1.0, 0.0, 1.0,
         "aiconfigurator times an attention-DP rank's prefill as if all 8 ranks prefilled "
         "equal batches at once (a DEP8 worker = 8x a rank's rate); unvalidated: from that (1) "
         "down to one rank's rate, ranks that never overlap (0)", moves_fit=False),
)}


@dataclass(frozen=True)
class Fit:
    knobs: dict[str, float]
    result: dict  # the figures at the fitted knobs
    steps: list[dict]  # every simulation of the fit: knobs and figures


def fitted(fit: Fit, ttft_slo_s: float, target_tok_s: float, tol: float = 0.02) -> bool:
    """Whether a fit met its point: tok/s within `tol` of the target, TTFT within the SLO."""
    r = fit.result
    return abs(r["tok_s_user"] / target_tok_s - 1) <= tol and r["ttft_p90_s"] <= ttft_slo_s


def fit(measure: Callable[[dict[str, float]], dict], target_tok_s: float, ttft_slo_s: float,
        rounds: int = 2, tol: float = 0.02, start: dict[str, float] | None = None,
        limit: float = 64.0) -> Fit:
    """Decode efficiency by fixed-point steps (tok/s per user grows about in proportion), the
    least prefill efficiency meeting the SLO by doubling then bisection in log space; `rounds`
    alternations, since each knob moves the other's figure a little. `start`: every knob's
    value (else KNOBS'); prefill efficiency is not doubled past `limit` (the fit then stops
    there, over the SLO: no fit)."""
    knobs = dict(start) if start else {k.name: k.value for k in KNOBS.values()}
    steps: list[dict] = []
    seen: dict[tuple, dict] = {}

    def run(**change: float) -> dict:
        trial = {**knobs, **change}
        key = tuple(sorted(trial.items()))
        if key not in seen:
            seen[key] = measure(trial)
            steps.append({"knobs": trial, "tok_s_user": seen[key]["tok_s_user"],
                          "ttft_p90_s": seen[key]["ttft_p90_s"]})
        return seen[key]

    r = run()
    for _ in range(rounds):
        for _ in range(6):  # decode: tok/s per user ~ decode efficiency
            if abs(r["tok_s_user"] / target_tok_s - 1) <= tol:
                break
            knobs["decode_efficiency"] *= target_tok_s / r["tok_s_user"]
            r = run()
        lo, hi = None, knobs["prefill_efficiency"]  # prefill: the least that meets the SLO
        if r["ttft_p90_s"] <= ttft_slo_s:
            lo, hi = hi / 2, hi
            while run(prefill_efficiency=lo)["ttft_p90_s"] <= ttft_slo_s and lo > 0.05:
                lo, hi = lo / 2, lo
        else:
            while hi * 2 <= limit and run(prefill_efficiency=hi * 2)["ttft_p90_s"] > ttft_slo_s:
                hi *= 2
            if hi * 2 > limit:  # no prefill efficiency up to the limit meets the SLO
                knobs["prefill_efficiency"] = hi
                r = run()
                continue
            lo, hi = hi, hi * 2
        while hi / lo > 1 + tol * 2:
            mid = math.sqrt(lo * hi)
            if run(prefill_efficiency=mid)["ttft_p90_s"] <= ttft_slo_s:
                hi = mid
            else:
                lo = mid
        knobs["prefill_efficiency"] = hi
        r = run()
    return Fit(knobs, r, steps)
