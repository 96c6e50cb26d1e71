"""The suite's process table under pytest-xdist: a test never takes a process another worker
started for one its own job left behind, and still sees every process it cannot attribute."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from tests.procs import SESSION_ENV, WORKER_ENV, children, process_table


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


def test_processes_of_another_test_run_or_program_are_never_this_sessions(monkeypatch):
    """Another pytest run on the same host (its own session mark, the same worker names) and
    a program of the same user that this session did not start (a daemon whose parent is gone,
    no mark) are left out; what this session started stays, a bare-environment child too."""
    monkeypatch.setenv(SESSION_ENV, str(os.getpid()))
    monkeypatch.setenv(WORKER_ENV, "gw0")
    env = {k: v for k, v in os.environ.items() if k not in (SESSION_ENV, WORKER_ENV)}
    other_run = subprocess.Popen(["sleep", "60"],
                                 env=env | {SESSION_ENV: "1", WORKER_ENV: "gw0"})
    mine = subprocess.Popen(["env", "-i", "sleep", "60"])  # bare, but our child
    # a stranger: started through a shell that exits at once, so init adopts it, unmarked
    subprocess.run(["bash", "-c", "setsid env -i sleep 61 >/dev/null 2>&1 < /dev/null &"],
                   env=env, check=True)
    try:
        deadline = time.monotonic() + 10
        while not (stranger := [p for p, c in _everything().items() if c == "sleep 61"]):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        table = process_table()
        assert mine.pid in table
        assert other_run.pid not in table and stranger[0] not in table
        monkeypatch.delenv(SESSION_ENV)  # outside a test session: every process
        monkeypatch.delenv(WORKER_ENV)
        assert {other_run.pid, stranger[0], mine.pid} <= set(process_table())
    finally:
        for proc in (other_run, mine):
            proc.kill()
            proc.wait()
        for pid in stranger:
            os.kill(pid, signal.SIGKILL)


def _everything() -> dict[int, str]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            out[int(entry)] = cmd.decode(errors="replace").strip()
    return out
