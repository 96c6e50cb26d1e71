"""Rebuild the built-in stdlib task suite (envs/tasks/stdlib/tasks-v1.jsonl), deterministically.

    .venv/bin/python scripts/build_stdlib_tasks.py            # the whole suite, ~5 min on 2 cores
    .venv/bin/python scripts/build_stdlib_tasks.py --modules textwrap shlex --out /tmp/t.jsonl

Mutants are validated against each module's own tests (at most --workers runs at a time).
The same Python installation gives a byte-identical file.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envs.stdlib.build import TASKS_PER_MODULE, TRIES_PER_MODULE, build_suite  # noqa: E402
from envs.stdlib.modules import MODULES, shadow_blockers  # noqa: E402
from envs.stdlib.rows import write_rows  # noqa: E402
from envs.stdlib.suite import BUILTIN  # noqa: E402


def _table(title: str, counts: Counter) -> None:
    print(f"{title}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", nargs="*", default=list(MODULES))
    parser.add_argument("--out", type=Path, default=BUILTIN)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--per-module", type=int, default=TASKS_PER_MODULE)
    parser.add_argument("--tries", type=int, default=TRIES_PER_MODULE)
    args = parser.parse_args()
    blockers = shadow_blockers()
    refused = {m: blockers[m] for m in args.modules if m in blockers}
    for module, why in refused.items():
        print(f"{module:14s} not used: {why}")
    modules = [m for m in args.modules if m not in refused]
    print(f"building {len(modules)} modules with {args.workers} workers "
          f"(up to {args.per_module} tasks from {args.tries} mutants each)", flush=True)
    start = time.monotonic()
    results = build_suite(modules, args.workers, args.per_module, args.tries,
                          log=lambda line: print(line, flush=True))
    rows = sorted((r for res in results for r in res.rows), key=lambda r: r.task_id)
    write_rows(rows, args.out)
    print(f"\nwrote {len(rows)} tasks from {sum(1 for r in results if r.rows)} modules to "
          f"{args.out} ({args.out.stat().st_size / 1e3:.0f} kB) in "
          f"{time.monotonic() - start:.0f}s")
    _table("per operator", Counter(r.mutation.op for r in rows))
    _table("per difficulty", Counter(r.difficulty for r in rows))
    _table("per module", Counter(r.module for r in rows))
    _table("mutants rejected", sum((res.rejected for res in results), Counter()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
