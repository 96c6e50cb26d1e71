"""One configured fleet simulation (serving topology x hardware x workload): builds fleets from
the serving config or any planner shape, runs them offline or live, and judges the target."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from planner import connector, offline, perf, planner, workload
from planner.config import SimulateConfig, topology
from serving import ServingConfig

CAPACITY_STEPS = (4, 8, 12, 16, 24, 32, 40, 48, 56, 66, 80, 100, 132)
log = logging.getLogger("planner")


class Sim:
    """One configured simulation: serving topology x hardware x workload."""

    def __init__(self, serving: ServingConfig, cfg: SimulateConfig, work_dir: Path,
                 cache_dir: Path) -> None:
        self.serving, self.cfg, self.work_dir, self.cache_dir = serving, cfg, work_dir, cache_dir
        self.topo = topology(serving)
        self.shapes = (None if cfg.workload in ("seed", "static")
                       else workload.read_records(Path(cfg.workload).expanduser()))
        self.shared = cfg.prefix if cfg.workload == "static" else 0  # tokens all sessions share
        probe = self.sessions(64)
        self.spec = perf.PerfSpec(
            system=cfg.system, backend=cfg.perf_backend, tp=self.topo["tp"],
            moe_ep=self.topo["ep"], nextn=self.topo["nextn"], mtp_acceptance=cfg.mtp_acceptance,
            mean_prefix=workload.mean_prefix(probe, self.shared),
            max_batched_tokens=self.topo["prefill_batched_tokens"],
            prefill_efficiency=cfg.prefill_efficiency, decode_efficiency=cfg.decode_efficiency)
        self.profile = perf.build_profile(self.spec, cache_dir / "sim")
        self.budget = perf.kv_budget_bytes(self.spec, cfg.gpu_memory_utilization)
        self._by_layout = {self.spec: (self.profile, self.budget)}
        self.runs = 0

    @property
    def worker_gpus(self) -> int:
        """GPUs of one of the serving config's workers."""
        return planner.worker_gpus(self.spec.tp, self.spec.moe_ep)

    @property
    def layout(self) -> str:
        return planner.layout_name(self.spec.tp, self.spec.moe_ep)

    def seeded(self) -> list[Sim]:
        """This simulation and one per further seed (`simulate.seeds`): the same fleets and
        session shape, other sessions, and the KV router's own draws."""
        c = self.cfg
        return [self] + [Sim(self.serving, replace(c, seed=s), self.work_dir, self.cache_dir)
                         for s in range(c.seed + 1, c.seed + max(1, c.seeds))]

    def layout_spec(self, tp: int, ep: int, role: str = "decode") -> perf.PerfSpec:
        """The perf spec of a `role` worker of layout TP `tp` EP `ep`. The efficiencies were
        fitted on the serving config's layout: another layout gets `layout_efficiency_carry` of
        their gain (as a power). An attention-DP prefill worker keeps `dp_prefill_overlap` of
        the dp-fold rate its table assumes (every rank prefilling at once, equally loaded)."""
        spec = replace(self.spec, tp=tp, moe_ep=ep)
        if (tp, ep) != (self.spec.tp, self.spec.moe_ep):
            carry = self.cfg.layout_efficiency_carry
            spec = replace(spec, prefill_efficiency=self.spec.prefill_efficiency ** carry,
                           decode_efficiency=self.spec.decode_efficiency ** carry)
        if role == "prefill" and spec.attention_dp > 1:
            dp, overlap = spec.attention_dp, self.cfg.dp_prefill_overlap
            spec = replace(spec, prefill_efficiency=spec.prefill_efficiency
                           * (1 + (dp - 1) * overlap) / dp)
        return spec

    def at_layout(self, tp: int, ep: int, role: str = "decode") -> tuple[Path, float]:
        """The perf table and KV bytes per GPU of a `role` worker of layout TP `tp` EP `ep`; a
        budget <= 0: the weights do not fit. aiconfigurator has MoE data at EP = TP, EP > TP
        (attention DP) and EP 1; other layouts raise perf.NoPerfData."""
        spec = self.layout_spec(tp, ep, role)
        if spec not in self._by_layout:
            try:
                budget = perf.kv_budget_bytes(spec, self.cfg.gpu_memory_utilization)
            except ValueError:  # aiconfigurator: "no KV budget: non-KV memory ... exceeds"
                budget = 0.0
            profile = perf.build_profile(spec, self.cache_dir / "sim") if budget > 0 else Path()
            self._by_layout[spec] = (profile, budget)
        return self._by_layout[spec]

    def host_blocks(self, gpus: int) -> int:
        """A worker's host tier in blocks: its GPUs' share of host memory, in tokens."""
        per_token = perf.kv_bytes_per_token(self.topo["kv_cache_dtype"])
        return int(self.cfg.host_kv_gb_per_gpu * 1e9 * gpus // per_token) // offline.BLOCK

    def transfer_gbps(self, transport: str | None = None) -> float:
        """The handoff's bandwidth per rank: `transfer_gbps` if set, else the transport's bytes
        and descriptors (the layout's regions x the probe's runs per block) as one rate."""
        if self.cfg.transfer_gbps is not None:
            return self.cfg.transfer_gbps
        return connector.transfer_gbps(self.topo["kv_cache_dtype"], self.cfg.kv_layout,
                                       transport or self.cfg.kv_transport)

    def shape_fleet(self, shape: planner.Shape) -> offline.Fleet | None:
        """A fleet of `shape`'s worker counts and layouts (None: a role's weights do not fit).
        A fleet beyond one rack moves KV with `cross_rack_transport` (all of it: which
        transfers cross is the router's choice, unknown here)."""
        (p_table, p_budget), (d_table, d_budget) = (
            self.at_layout(shape.tp_prefill, shape.ep_prefill, "prefill"),
            self.at_layout(shape.tp_decode, shape.ep_decode, "decode"))
        if p_budget <= 0 or d_budget <= 0:
            return None
        per_token = perf.kv_bytes_per_token(self.topo["kv_cache_dtype"])
        dp = replace(self.spec, tp=shape.tp_decode, moe_ep=shape.ep_decode).attention_dp
        prefill_dp = replace(self.spec, tp=shape.tp_prefill, moe_ep=shape.ep_prefill).attention_dp
        fleet = replace(self.fleet(prefill=shape.prefill, decode=shape.decode),
                        profile=str(d_table), kv_blocks=int(d_budget // per_token) // offline.BLOCK,
                        dp=dp, prefill_profile=str(p_table), prefill_dp=prefill_dp,
                        prefill_kv_blocks=int(p_budget // per_token) // offline.BLOCK,
                        host_blocks=self.host_blocks(planner.worker_gpus(shape.tp_decode,
                                                                         shape.ep_decode)),
                        prefill_host_blocks=self.host_blocks(
                            planner.worker_gpus(shape.tp_prefill, shape.ep_prefill)))
        if shape.gpus > self.cfg.rack_gpus and self.cfg.cross_rack_transport:
            fleet = replace(fleet, transfer_gbps=self.transfer_gbps(self.cfg.cross_rack_transport))
        return fleet

    def sessions(self, count: int) -> list[list[workload.Turn]]:
        c = self.cfg
        if c.workload == "static":
            return workload.static_sessions(c.isl, c.osl, count)
        if self.shapes is None:
            shape = workload.SeedShape(c.first_prompt, c.growth, c.max_prompt, c.output, c.tool_s)
            return workload.seed_sessions(shape, count, c.seed)
        return workload.record_sessions(self.shapes, count, c.token_scale, c.seed)

    def capacity(self, kv_cache_dtype: str | None = None) -> int:
        return int(self.budget // perf.kv_bytes_per_token(kv_cache_dtype
                                                          or self.topo["kv_cache_dtype"]))

    def fleet(self, groups: int = 1, decode: int | None = None, agg: bool = False,
              kv_cache_dtype: str | None = None, prefill: int | None = None) -> offline.Fleet:
        t, c = self.topo, self.cfg
        dtype = kv_cache_dtype or t["kv_cache_dtype"]
        prefill = prefill or t["prefill"] or 1
        dec = t["decode"] if decode is None else decode
        agg_workers = 0
        if agg:  # the same GPUs, every worker doing both phases
            agg_workers = groups * (prefill + dec)
        elif not t["prefill"]:
            agg_workers = groups * (t["agg"] or 1)
        return offline.Fleet(
            prefill_workers=groups * prefill, decode_workers=groups * dec,
            agg_workers=agg_workers, kv_blocks=self.capacity(dtype) // offline.BLOCK,
            dp=self.spec.attention_dp,
            kv_bytes_per_token=perf.kv_bytes_per_token(dtype), transfer_gbps=self.transfer_gbps(),
            host_blocks=self.host_blocks(self.worker_gpus), host_gbps=c.host_gbps,
            profile=str(self.profile), decode_speedup=self.spec.decode_speedup,
            prefill_batched_tokens=t["prefill_batched_tokens"])

    def run(self, fleet: offline.Fleet, lanes: int, policy: str | None = None) -> dict:
        policy = policy or self.cfg.policy
        count = lanes * max(2, self.cfg.lifetimes)
        trace = workload.write_trace(self.work_dir / f"trace_{lanes}_{os.getpid()}.jsonl",
                                     self.sessions(count), self.shared)
        if self.cfg.mode == "live":
            from planner.live import run_live

            result = run_live(self, fleet, lanes, policy)
        else:
            lo = lanes if self.cfg.lifetimes >= 3 else lanes // 2
            result = offline.run(trace, fleet, lanes, policy, measure=(lo, count - lanes),
                                 overlap_credit=self.cfg.overlap_credit,
                                 host_hit_weight=self.cfg.host_hit_weight)
        self.runs += 1
        result["ok"] = self.meets(result)
        log.info("%s lanes=%d %s: %.1f tok/s/user, TTFT p90 %.2f s, %.1f s", policy, lanes,
                 fleet_name(fleet), result["tok_s_user"], result["ttft_p90_s"], result["wall_s"])
        return result

    def meets(self, r: dict) -> bool:
        """tok/s per user (`target_stat`: the requests' p10, or the mean) at the target and
        TTFT p90 within the SLO."""
        tok_s = r["tok_s_user_p10"] if self.cfg.target_stat == "p10" else r["tok_s_user"]
        return tok_s >= self.cfg.target_tok_s and r["ttft_p90_s"] <= self.cfg.ttft_slo_s

    def max_sessions(self, fleet: offline.Fleet, policy: str | None = None,
                     steps: tuple[int, ...] = CAPACITY_STEPS, scale: int = 1) -> tuple[int, dict]:
        """The most sessions (of `steps` x `scale`) that still meet the target; stops at the
        first step that misses it."""
        best, best_run = 0, {}
        for step in steps:
            r = self.run(fleet, step * scale, policy)
            if not r["ok"]:
                return best, best_run or r
            best, best_run = step * scale, r
        return best, best_run


def fleet_name(f: offline.Fleet) -> str:
    return f"{f.agg_workers} agg" if f.agg_workers else f"{f.prefill_workers}P:{f.decode_workers}D"


def over_seeds(sims: list[Sim], fleet: offline.Fleet, lanes: int, jobs: int) -> list[dict]:
    """`fleet` with `lanes` sessions under each of `sims` (one per seed), `jobs` at a time;
    the first Sim counts them all, wherever they ran."""
    counted = sims[0].runs
    out = side_by_side(lambda i: sims[i].run(fleet, lanes), list(range(len(sims))), jobs)
    sims[0].runs = counted + len(out)
    return out


_TASK: Callable[[Any], Any] | None = None  # side_by_side's function, inherited when forked


def side_by_side(fn: Callable[[Any], Any], items: list, jobs: int) -> list:
    """`fn` over `items`, `jobs` processes at a time (replays are single-threaded: one per
    core). The workers are forked, so `fn` and what it holds (Sims, perf tables) are inherited;
    only items and results cross. Simulations run there are not counted by this process's Sims."""
    if jobs <= 1:
        return [fn(x) for x in items]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    global _TASK
    _TASK = fn
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as ex:
        return list(ex.map(_call, items))


def _call(item: Any) -> Any:
    assert _TASK is not None
    return _TASK(item)
