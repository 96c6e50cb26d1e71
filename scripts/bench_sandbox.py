"""Sandbox costs, each table's variants measured side by side (interleaved) in one run:

1. start + teardown: open a session (folder, uid, disk quota, cgroup, the task's files, their
   git history), run `true` isolated, close it; the full sandbox (per command, and persistent:
   its exec server's start), the sandbox without a cgroup (a uid per session only), an
   unisolated subprocess.
2. a tool call in a running session (`bash -c true`, `bash -c "ls | wc -l"`, a Python process):
   a sandbox per command vs one per session (env.sandbox.persistent): wall time per call, and
   CPU per call end to end (the host's busy CPU over a block of calls, less its idle rate
   measured just before: bwrap, setpriv, the server, the command and this process alike).
3. a sandbox start with other sessions open (`--alive`, a `bash -c true` with a sandbox per
   command): the launcher (envs/launch.c: cgroups, rlimits, the other sessions' mounts set
   apart, then bwrap) vs the chain of programs it replaced (a shell and prlimit; above 200
   mounts also unshare, a second shell, mount and umount), wall and CPU per call as in 2.

`--tables` picks which to run. The same figures go as JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import psutil

from envs import lease
from envs.cgroups import detect
from envs.sandbox import LAUNCH_FAILED, SandboxPolicy, as_user, limits, wrap
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


# A finished sandbox's processes stay charged to its session's pids cgroup for 1-2 s here (the
# kernel frees the charge late): blocks on one session wait that long, or pids.max refuses them.
PIDS_RELEASE_S = 2.0
SHELL_CHAIN_APART_ABOVE = 200  # other sessions' mounts the shell chain left in bwrap's view
CALLS = {"bash true": ["bash", "-c", "true"], "bash ls | wc": ["bash", "-c", "ls | wc -l"],
         "python -c pass": ["python3", "-c", "pass"],
         # the task's visible tests, as `run_tests` runs them (forked on the per-command path)
         "unittest run": [sys.executable, "-S", "-m", "unittest", "discover", "-s", "tests"]}
# each path's policy; "per command exec": its test runs exec'd (env.sandbox.warm_unittest=false)
PATHS = {"per command": SandboxPolicy(persistent=False),
         "per command exec": SandboxPolicy(persistent=False, warm_unittest=False),
         "persistent": SandboxPolicy(persistent=True)}


def busy_s() -> float:
    t = psutil.cpu_times()
    return t.user + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)


def call_block(ws: Workspace, argv: list[str], n: int) -> tuple[list[float], float]:
    """n calls: their wall times, and the host's busy CPU seconds over them."""
    walls = []
    cpu0 = busy_s()
    for _ in range(n):
        t0 = time.perf_counter()
        res = ws.run(argv, 10, 1000)
        walls.append(time.perf_counter() - t0)
        assert res.exit_code in (0, 1) and not res.timed_out, res.output  # 1: a failing test
    return walls, busy_s() - cpu0


def idle_rate(seconds: float = 0.5) -> float:
    """The host's busy cores while this process sleeps (other work on the machine)."""
    cpu0 = busy_s()
    time.sleep(seconds)
    return (busy_s() - cpu0) / seconds


def tool_calls(rounds: int, block: int) -> dict[str, dict[str, dict[str, float]]]:
    spaces = {name: Workspace(lambda dest: shutil.copytree(REPO / "repo", dest,
                                                           dirs_exist_ok=True),
                              policy=policy) for name, policy in PATHS.items()}
    try:
        walls = {(c, p): [] for c in CALLS for p in PATHS}
        cpu = {(c, p): [] for c in CALLS for p in PATHS}
        for ws in spaces.values():
            ws.run(["true"], 10, 100)  # the first command's cgroup move, the server's start
        for _ in range(rounds):
            for call, argv in CALLS.items():
                for name, ws in spaces.items():
                    time.sleep(PIDS_RELEASE_S)
                    idle = idle_rate()
                    t0 = time.perf_counter()
                    w, used = call_block(ws, argv, block)
                    walls[call, name] += w
                    cpu[call, name].append((used - idle * (time.perf_counter() - t0)) / block)
    finally:
        for ws in spaces.values():
            ws.close()
    ms = lambda x: round(x * 1000, 2)  # noqa: E731
    return {call: {name: {"wall_p50_ms": ms(statistics.median(walls[call, name])),
                          "wall_p90_ms": ms(sorted(walls[call, name])[
                              int(0.9 * len(walls[call, name]))]),
                          "cpu_ms_per_call": ms(statistics.median(cpu[call, name]))}
                   for name in PATHS} for call in CALLS}


def shell_chain(session: lease.SessionLease, argv: list[str], policy: SandboxPolicy,
                apart: bool) -> list[str]:
    """`argv` as the session's command was launched before envs/launch.c: the cgroup join by
    a shell, the rlimits by prlimit, and with `apart` (it was, above 200 mounts) the other
    sessions' mounts set apart by unshare, a second shell, mount and umount."""
    join = "".join(f"echo $$ > {shlex.quote(str(g / 'cgroup.procs'))} && "
                   for g in session.groups)
    failed = shlex.quote(f"{LAUNCH_FAILED}could not set the sandbox up")
    script = (f'{{ mount --bind "$1" {lease.STAGE} && umount --lazy "$2"; }} 2>/dev/null || '
             f'{{ echo {failed} >&2; exit 1; }}; shift 2; cd / && exec "$@"')
    inner = wrap(as_user(argv, session.uid), session.repo, policy,
                 lease.STAGE if apart else None)
    if apart:
        inner = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script,
                 "sh", str(session.repo), str(session.mounts), *inner]
    return ["sh", "-c", f'{{ {join}:; }} 2>/dev/null || {{ echo {failed} >&2; exit 1; }}; '
            'exec "$@"', "sh", "prlimit", *(f"--{k}={v}" for k, v in limits(policy).items()),
            "--", *inner]


def sessions_alive(counts: list[int], rounds: int, block: int) -> dict[str, dict]:
    """Table 3: per count of other open sessions, each launcher's wall and CPU per start."""
    ws = Workspace(lambda dest: shutil.copytree(REPO / "repo", dest, dirs_exist_ok=True),
                   policy=SandboxPolicy(persistent=False))
    session = ws.lease
    own = session.command
    others: list[Workspace] = []
    out = {}
    try:
        for n in counts:
            others += [Workspace(lambda dest: None) for _ in range(n - len(others))]
            modes = {"launcher": own, "shell chain": lambda argv, policy, n=n: shell_chain(
                session, argv, policy, apart=n > SHELL_CHAIN_APART_ABOVE)}
            walls = {m: [] for m in modes}
            cpu = {m: [] for m in modes}
            for _ in range(rounds):
                for mode, command in modes.items():
                    session.command = command
                    time.sleep(PIDS_RELEASE_S)
                    idle = idle_rate()
                    t0 = time.perf_counter()
                    w, used = call_block(ws, CALLS["bash true"], block)
                    walls[mode] += w
                    cpu[mode].append((used - idle * (time.perf_counter() - t0)) / block)
            out[str(n)] = {m: {"wall_p50_ms": round(statistics.median(walls[m]) * 1000, 2),
                               "cpu_ms_per_call": round(statistics.median(cpu[m]) * 1000, 2)}
                           for m in modes}
    finally:
        for w in [ws, *others]:
            w.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=200, help="start/teardown cycles per variant")
    parser.add_argument("--rounds", type=int, default=10, help="blocks per call and path")
    parser.add_argument("--block", type=int, default=50, help="calls per block")
    parser.add_argument("--alive", default="0,1000",
                        help="table 3: other sessions open, comma-separated ('': skip)")
    parser.add_argument("--tables", default="1,2,3", help="which tables to run")
    parser.add_argument("--out", type=Path, default=Path("bench_sandbox.json"))
    args = parser.parse_args()
    tables = set(args.tables.split(","))
    layout = detect()
    variants = {"sandbox, cgroup": SandboxPolicy(persistent=False),
                "persistent, cgroup": SandboxPolicy(persistent=True),
                "sandbox, no cgroup": SandboxPolicy(cgroup="none", persistent=False),
                "plain subprocess": SandboxPolicy(isolate=False)}
    cycles: dict[str, list] = {name: [] for name in variants}
    load_before = os.getloadavg()[0]
    print(f"cgroups: {layout.describe() if layout else 'none writable'}")
    results, calls, alive = {}, {}, {}
    if "1" in tables:
        for _ in range(args.n):  # interleaved: load from other jobs falls on every variant alike
            for name, policy in variants.items():
                cycles[name].append(cycle(policy))
        results = {name: summary(c) for name, c in cycles.items()}
        print(f"{'variant':<24}{'create ms':>10}{'run ms':>10}{'total p50':>11}{'total p90':>11}")
        for name, r in results.items():
            print(f"{name:<24}{r['create_ms']:>10}{r['run_true_ms']:>10}"
                  f"{r['total_median_ms']:>11}{r['total_p90_ms']:>11}")
    if "2" in tables:
        calls = tool_calls(args.rounds, args.block)
        print(f"\n{'a tool call':<16}{'path':<18}{'wall p50 ms':>12}{'wall p90 ms':>12}"
              f"{'CPU ms/call':>12}")
        for call, by_path in calls.items():
            for name, r in by_path.items():
                print(f"{call:<16}{name:<18}{r['wall_p50_ms']:>12}{r['wall_p90_ms']:>12}"
                      f"{r['cpu_ms_per_call']:>12}")
    if "3" in tables:
        alive = sessions_alive([int(n) for n in args.alive.split(",") if n], args.rounds,
                               args.block)
        print(f"\n{'sessions open':<15}{'launched by':<13}{'wall p50 ms':>12}{'CPU ms/call':>12}")
        for n, by_mode in alive.items():
            for mode, r in by_mode.items():
                print(f"{n:<15}{mode:<13}{r['wall_p50_ms']:>12}{r['cpu_ms_per_call']:>12}")
    bwrap = subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip()
    args.out.write_text(json.dumps({
        "date": datetime.now(UTC).isoformat(), "machine": platform.platform(),
        "cpus": os.cpu_count(), "versions": {"bwrap": bwrap,
                                                          "python": platform.python_version()},
        "cgroup": layout.describe() if layout else None,
        "load_avg_1m": {"before": load_before, "after": os.getloadavg()[0]},
        "parameters": {"n": args.n, "rounds": args.rounds, "block": args.block,
                       "alive": args.alive, "tables": args.tables,
                       "repo": str(REPO / "repo")},
        "results": results, "tool_calls": calls, "sessions_alive": alive}, indent=2))


if __name__ == "__main__":
    main()
