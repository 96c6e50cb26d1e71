"""Sandbox start + teardown time: create a session folder, run `true` isolated, remove it.

Prints a table comparing the isolated sandbox with an unisolated subprocess, measured side by
side in one run, and writes the same figures as JSON to --out.
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

from envs.sandbox import SandboxPolicy
from envs.workspace import Workspace

REPO = Path(__file__).resolve().parents[1] / "envs" / "tasks" / "mini_swe" / "roman_subtractive"


def measure(policy: SandboxPolicy, n: int) -> dict[str, float]:
    start_s, run_s, total_s = [], [], []
    for _ in range(n):
        t0 = time.perf_counter()
        ws = Workspace(lambda dest: shutil.copytree(REPO / "repo", dest, dirs_exist_ok=True),
                       policy=policy)
        t1 = time.perf_counter()
        res = ws.run(["true"], 10, 100)
        t2 = time.perf_counter()
        ws.close()
        t3 = time.perf_counter()
        assert res.exit_code == 0, res.output
        start_s.append(t1 - t0)
        run_s.append(t2 - t1)
        total_s.append(t3 - t0)
    ms = lambda xs: round(statistics.median(xs) * 1000, 2)  # noqa: E731
    return {"create_ms": ms(start_s), "run_true_ms": ms(run_s), "total_median_ms": ms(total_s),
            "total_p90_ms": round(sorted(total_s)[int(0.9 * n)] * 1000, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=200, help="start/teardown cycles per variant")
    parser.add_argument("--out", type=Path, default=Path("bench_sandbox.json"))
    args = parser.parse_args()
    variants = {"bwrap+setpriv+rlimits": SandboxPolicy(),
                "plain subprocess": SandboxPolicy(isolate=False)}
    results = {name: measure(policy, args.n) for name, policy in variants.items()}
    print(f"{'variant':<24}{'create ms':>10}{'run ms':>10}{'total p50':>11}{'total p90':>11}")
    for name, r in results.items():
        print(f"{name:<24}{r['create_ms']:>10}{r['run_true_ms']:>10}{r['total_median_ms']:>11}"
              f"{r['total_p90_ms']:>11}")
    bwrap = subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip()
    args.out.write_text(json.dumps({
        "date": datetime.now(UTC).isoformat(), "machine": platform.platform(),
        "cpus": os.cpu_count(), "versions": {"bwrap": bwrap,
                                                          "python": platform.python_version()},
        "parameters": {"n": args.n, "repo": str(REPO / "repo")}, "results": results}, indent=2))


if __name__ == "__main__":
    main()
