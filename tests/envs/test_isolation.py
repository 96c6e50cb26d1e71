"""Sessions open at once do not hurt each other: a fork bomb, a disk filler and CPU spinners in
one session; ordinary commands and a hidden-test run in the others succeed and score exactly as
they do alone. On both sandbox paths (env.sandbox.persistent)."""

import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from envs import EnvConfig, load

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="per-session uids and quotas need root")
LIMITS = {"nprocs": 32, "disk_mb": 32, "cpu_cores": 1.0}

# In the hostile session: two CPU spinners, then forks until the process limit refuses one,
# then writes until the disk refuses; everything lasts until the host removes `running`.
HOSTILE = """
import os, time
def child(busy):
    if os.fork() == 0:
        while os.path.exists("running"):
            sum(range(10000)) if busy else time.sleep(0.05)
        os._exit(0)
open("running", "w").close()
child(True), child(True)
held = written = 0
try:
    while held < 1000:
        child(False)
        held += 1
except OSError as exc:
    print("fork refused after", held, "errno", exc.errno, flush=True)
try:
    with open("fill", "wb") as f:
        while True:
            f.write(bytes(1024 * 1024))
            f.flush()
            written += 1
except OSError as exc:
    print("disk refused after", written, "MB errno", exc.errno, flush=True)
while os.path.exists("running"):
    time.sleep(0.05)
"""
FORKS = "python3 -c \"import subprocess as s; [s.run(['true'], check=True) for _ in range(20)]\""


def _env(cgroup: str, persistent: bool):
    return load(EnvConfig(tool_timeout_s=60, score_timeout_s=120,
                          sandbox={**LIMITS, "cgroup": cgroup, "persistent": persistent}))


def ordinary(env, task_id: str) -> tuple[list[str], tuple]:
    """Commands that fork, list, fix and test, then the hidden tests: outputs and score."""
    with env.episode(task_id) as ep:
        outputs = [ep.call("bash", {"command": f"{FORKS} && echo forked"}).output,
                   ep.call("bash", {"command": "ls | wc -l"}).output]
        for path, text in env.tasks[task_id].repo.reference_fix().items():
            assert ep.call("write_file", {"path": path, "content": text}).ok
        outputs.append(re.sub(r"in \d+\.\d+s", "in -s", ep.call("run_tests", {}).output))
        score = ep.score()
    return outputs, (score.reward, score.tests_total, score.tests_failed, score.infra_error)


def with_hostile_neighbour(env, task_ids: list[str]):
    """Run `ordinary` for each task at once, while the hostile session holds its limits."""
    with env.episode("stack_pop") as hostile:
        ws = hostile.workspace
        result = {}
        thread = threading.Thread(target=lambda: result.update(
            res=ws.run([ws.python(), "-c", HOSTILE], 120, 4000)))
        thread.start()
        try:
            _wait_until_full(ws.path)
            with ThreadPoolExecutor(len(task_ids)) as pool:
                runs = list(pool.map(lambda t: ordinary(env, t), task_ids))
        finally:
            (ws.path / "running").unlink(missing_ok=True)
            thread.join(timeout=60)
        score = hostile.score()
    return runs, result["res"], score


def _wait_until_full(path, timeout_s: float = 60.0) -> None:
    """Until the hostile session has forked to its limit and filled its disk."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = os.statvfs(path)
        if (path / "running").exists() and st.f_bavail * st.f_frsize < 1024 * 1024:
            return
        time.sleep(0.05)
    raise AssertionError("the hostile session never filled its disk")


def _check_hostile(res, score) -> None:
    lines = res.output.splitlines()
    fork = next(line.split() for line in lines if line.startswith("fork refused"))
    disk = next(line.split() for line in lines if line.startswith("disk refused"))
    assert fork[-1] == "11" and int(fork[3]) < LIMITS["nprocs"]  # EAGAIN, in this session
    assert disk[-1] == "28" and int(disk[3]) <= LIMITS["disk_mb"]  # ENOSPC at the quota
    assert score.infra_error is None and score.reward == 0.0  # the agent's failure
    assert "over the session's disk quota" in score.output


def _check_as_alone(runs, alone) -> None:
    for (outputs, score), (alone_outputs, alone_score) in zip(runs, alone, strict=True):
        assert outputs == alone_outputs  # word for word (the tests' timings aside)
        assert outputs[0] == "forked\n\n[exit code 0]" and outputs[1].endswith("[exit code 0]")
        assert score == alone_score and score[0] == 1.0


@pytest.mark.parametrize("persistent", [False, True], ids=["per-command", "persistent"])
@pytest.mark.parametrize("cgroup", ["auto", "none"])
def test_two_sessions(cgroup, persistent):
    env = _env(cgroup, persistent)
    alone = [ordinary(env, "stats_mean")]
    runs, res, score = with_hostile_neighbour(env, ["stats_mean"])
    _check_hostile(res, score)
    _check_as_alone(runs, alone)


@pytest.mark.parametrize("persistent", [False, True], ids=["per-command", "persistent"])
def test_eight_sessions(persistent):
    env = _env("auto", persistent)
    tasks = sorted(env.tasks)
    task_ids = [tasks[i % len(tasks)] for i in range(7)]
    alone = {t: ordinary(env, t) for t in tasks}
    runs, res, score = with_hostile_neighbour(env, task_ids)
    _check_hostile(res, score)
    _check_as_alone(runs, [alone[t] for t in task_ids])
