"""scripts/bench_rollout.py's process accounting, on a real process tree."""

import contextlib
import os
import signal
import subprocess
import sys
import time

from tests.scripts import load_script

bench = load_script("bench_rollout")

# A Ray worker's life as the monitor reads it: titled `ray::IDLE` while it burns a second of
# CPU (then it writes when, and how much), then the same process titled as an actor.
WORKER = """
import os, sys, time
def burn(s):
    end = time.process_time() + s
    while time.process_time() < end:
        pass
if sys.argv[1] == "idle":
    burn(1.0)
    with open(sys.argv[3], "w") as f:
        f.write(f"{time.time()} {time.process_time()}")
    burn(0.1)
    os.execv(sys.argv[2], ["ray::RolloutWorker", "-c", sys.argv[4], "actor"])
burn(0.4)
"""
# the job: an actor idle from the start beside that worker
PARENT = """
import subprocess, sys
actor = subprocess.Popen(["ray::RolloutWorker", "-c", "import time; time.sleep(60)"],
                         executable=sys.argv[1])
subprocess.run(sys.argv[2:], executable=sys.argv[1])
actor.kill()
actor.wait()
"""


def test_a_worker_that_becomes_an_actor_counts_as_one_in_every_window(tmp_path):
    mark = tmp_path / "mark"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, sys.executable, "ray::IDLE", "-c",
                               WORKER, "idle", sys.executable, str(mark), WORKER],
                              start_new_session=True)
    mon = bench.Monitor(parent.pid, interval_s=0.05)
    mon.start()
    try:
        assert parent.wait(timeout=60) == 0
    finally:
        mon.stop()
        with contextlib.suppress(ProcessLookupError):  # nothing of the tree outlives the test
            os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
    at, cpu_at = map(float, mark.read_text().split())
    assert cpu_at >= 1.0
    children = {pid: v for pid, v in mon.cpu.items() if pid != parent.pid}
    assert sorted(r for r, _ in children.values()) == ["actor", "actor"]
    worker = max(children, key=lambda pid: children[pid][1])
    total = children[worker][1]
    assert total >= 1.3
    # the monitor did read the worker as Ray's before it became an actor
    assert any(s["t"] < at for s in mon.series if worker in s["pid_cpu"])

    end = time.time()
    cores = mon.cores_in(at, end)
    inside = [s for s in mon.series if s["t"] >= at]
    dt = inside[-1]["t"] - inside[0]["t"]
    # the actors' CPU in the window is what the worker burned after `at` (the other one
    # sleeps), not its whole life's: it had burned a second as Ray's by then
    assert abs(cores["actor"] * dt - (total - inside[0]["pid_cpu"][worker])) < 0.03
    assert cores["actor"] * dt < total - 0.9
    assert cores.get("ray", 0.0) == 0.0
    # and an actor's rate counts from the first sample that read it as one: one busy thread,
    # at most a core
    assert 0.2 < mon.actor_threads(at, end)["per_actor_cores_max"] <= 1.1
