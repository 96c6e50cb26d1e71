"""Validate a task suite end to end: doing nothing scores 0.0 and the reference solver, through
the same tool calls a model would make, scores 1.0 on every task. Prints a table per suite and
every failure, and exits non-zero if any task misbehaves.

    python scripts/check_tasks.py --suite stdlib [--limit N] [--workers 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from envs import EnvConfig, load
from envs.solver import reference_calls


def check(env, task_id: str) -> tuple[str, str | None, float]:
    start = time.perf_counter()
    with env.episode(task_id) as ep:
        nothing = ep.score()
        if nothing.infra_error or nothing.reward != 0.0:
            return task_id, f"doing nothing scored {nothing.reward} {nothing.infra_error or ''}", 0
        for name, args in reference_calls(ep):
            result = ep.call(name, args)
            if not result.ok or result.failed:
                return task_id, f"reference call {name} failed: {result.output[:300]}", 0
        fixed = ep.score()
        if fixed.reward != 1.0:
            return task_id, f"reference fix scored {fixed.reward}: {fixed.output[-500:]}", 0
    return task_id, None, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", default="stdlib", choices=["mini", "stdlib"])
    parser.add_argument("--limit", type=int, default=None, help="first N tasks only")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    name = "mini_swe" if args.suite == "mini" else "stdlib"
    env = load(EnvConfig(name=name, suite=args.suite, max_tasks=args.limit, on_bad_task="fail"))
    ids = sorted(env.tasks)
    start = time.perf_counter()
    with ThreadPoolExecutor(args.workers) as pool:
        results = list(pool.map(lambda t: check(env, t), ids))
    bad = [(t, why) for t, why, _ in results if why]
    by_module = Counter(t.split(".")[0] for t in ids)
    print(f"{args.suite}: {len(ids) - len(bad)}/{len(ids)} tasks valid across {len(by_module)} "
          f"modules/groups in {time.perf_counter() - start:.0f}s")
    print("difficulty:", dict(Counter(env.tasks[t].difficulty for t in ids)))
    for task_id, why in bad:
        print(f"FAIL {task_id}: {why}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
