"""The suite's process table under pytest-xdist: a test never takes a process another worker
started for one its own job left behind, and still sees every process it cannot attribute."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from tests.procs import WORKER_ENV, children, process_table


def test_processes_of_another_worker_are_left_out_and_the_rest_kept(monkeypatch):
    monkeypatch.setenv(WORKER_ENV, "gw-mine")
    env = {k: v for k, v in os.environ.items() if k != WORKER_ENV}
    # another worker's job, and a child of it started with a bare environment (as etcd is)
    other = subprocess.Popen(["bash", "-c", "env -i sleep 60 & wait"],
                             env=env | {WORKER_ENV: "gw-other"})
    mine = subprocess.Popen(["sleep", "60"], env=env | {WORKER_ENV: "gw-mine"})
    nobody = subprocess.Popen(["env", "-i", "sleep", "60"], env=env)  # no worker at all
    bare: list[int] = []
    try:
        deadline = time.monotonic() + 10
        while not (bare := children(other.pid)):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        table = process_table()
        assert mine.pid in table and nobody.pid in table
        assert other.pid not in table and bare[0] not in table
        monkeypatch.delenv(WORKER_ENV)  # not under xdist: every process
        assert {other.pid, bare[0], mine.pid, nobody.pid} <= set(process_table())
    finally:
        for pid in bare:
            os.kill(pid, signal.SIGKILL)
        for proc in (other, mine, nobody):
            proc.kill()
            proc.wait()


def test_what_another_worker_started_itself_is_left_out(monkeypatch):
    """A worker sets its name after it started, so a process it starts with a bare
    environment (a Mooncake store) carries no name and has no named ancestor: it is the
    other worker's because its parent is a child of the controller that is not this one."""
    controller = subprocess.Popen(  # stands in for pytest-xdist's controller: worker, its child
        ["bash", "-c", "env -i bash -c 'env -i sleep 60 & wait' & wait"],
        env={k: v for k, v in os.environ.items() if k != WORKER_ENV})
    family: list[int] = []
    try:
        deadline = time.monotonic() + 10
        while len(family) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
            family = children(controller.pid)
            family += [g for c in family for g in children(c)]
        monkeypatch.setenv(WORKER_ENV, "gw-mine")
        monkeypatch.setattr(os, "getppid", lambda: controller.pid)
        assert not set(family) & set(process_table())
        monkeypatch.undo()
        assert set(family) <= set(process_table())
    finally:
        for pid in family:
            os.kill(pid, signal.SIGKILL)
        controller.kill()
        controller.wait()
