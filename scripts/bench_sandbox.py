"""Sandbox start + teardown time: open a session (folder, uid, disk quota, cgroup, the task's
files, their git history), run `true` isolated, close it.

Prints a table comparing the full sandbox, the sandbox without a cgroup (a uid per session
only), and an unisolated subprocess, measured side by side in one run, and writes the same
figures as JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

from envs.cgroups import detect
from envs.sandbox import SandboxPolicy
from envs.workspace import Workspace
from rollfleet.paths import ROOT

REPO = ROOT / "envs" / "tasks" / "mini_swe" / "roman_subtractive"


def cycle(policy: SandboxPolicy) -> tuple[float, float, float]:
    """One session: (open, run `true`, open + run + close) in seconds."""
    t0 = time.perf_counter()
    ws = Workspace(lambda dest: shutil.copytree(REPO / "repo", dest, dirs_exist_ok=True),
                   policy=policy)
    t1 = time.perf_counter()
    res = ws.run(["true"], 10, 100)
    t2 = time.perf_counter()
    ws.close()
    t3 = time.perf_counter()
    assert res.exit_code == 0, res.output
    return t1 - t0, t2 - t1, t3 - t0


def summary(cycles: list[tuple[float, float, float]]) -> dict[str, float]:
    start_s, run_s, total_s = zip(*cycles, strict=True)
    ms = lambda xs: round(statistics.median(xs) * 1000, 2)  # noqa: E731
    return {"create_ms": ms(start_s), "run_true_ms": ms(run_s), "total_median_ms": ms(total_s),
            "total_p90_ms": round(sorted(total_s)[int(0.9 * len(total_s))] * 1000, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=200, help="start/teardown cycles per variant")
    parser.add_argument("--out", type=Path, default=Path("bench_sandbox.json"))
    args = parser.parse_args()
    layout = detect()
    variants = {"sandbox, cgroup": SandboxPolicy(),
                "sandbox, no cgroup": SandboxPolicy(cgroup="none"),
                "plain subprocess": SandboxPolicy(isolate=False)}
    cycles: dict[str, list] = {name: [] for name in variants}
    load_before = os.getloadavg()[0]
    for _ in range(args.n):  # interleaved, so load from other jobs falls on every variant alike
        for name, policy in variants.items():
            cycles[name].append(cycle(policy))
    results = {name: summary(c) for name, c in cycles.items()}
    print(f"cgroups: {layout.describe() if layout else 'none writable'}")
    print(f"{'variant':<24}{'create ms':>10}{'run ms':>10}{'total p50':>11}{'total p90':>11}")
    for name, r in results.items():
        print(f"{name:<24}{r['create_ms']:>10}{r['run_true_ms']:>10}{r['total_median_ms']:>11}"
              f"{r['total_p90_ms']:>11}")
    bwrap = subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip()
    args.out.write_text(json.dumps({
        "date": datetime.now(UTC).isoformat(), "machine": platform.platform(),
        "cpus": os.cpu_count(), "versions": {"bwrap": bwrap,
                                                          "python": platform.python_version()},
        "cgroup": layout.describe() if layout else None,
        "load_avg_1m": {"before": load_before, "after": os.getloadavg()[0]},
        "parameters": {"n": args.n, "repo": str(REPO / "repo")}, "results": results}, indent=2))


if __name__ == "__main__":
    main()
