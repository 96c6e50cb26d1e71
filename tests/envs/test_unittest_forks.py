"""Test runs forked from the warm interpreter (envs/unittest_forks.py): the same report as an
exec'd run, the same confinement as any sandboxed command, the exec path where a task shadows a
module the server holds, and nothing left behind."""

import errno
import json
import os
import re
import signal
import socket
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from envs.sandbox import SandboxPolicy
from envs.unittest_forks import FORKS, UnittestForks
from envs.workspace import Workspace
from tests.envs.test_sandbox import FORK_UNTIL_REFUSED

POLICY = SandboxPolicy(persistent=False, nprocs=32, file_size_mb=8, memory_mb=1024, cpu_s=10,
                       disk_mb=24, open_files=64)
AS_ROOT = pytest.mark.skipif(os.getuid() != 0, reason="a sandbox's uid and namespaces need root")
UNITTEST = [sys.executable, "-S", "-m", "unittest", "discover", "-s", "tests"]
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0",
       "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": "/repo"}

REPORTING = '''
import os, unittest
class Report(unittest.TestCase):
    def test_passes(self):
        print("printed by a test")
    def test_fails(self):
        self.assertEqual(sorted({3: 1, 1: 2}), [3, 1])
    def test_records_its_parent(self):
        with open("/proc/self/status") as f:
            status = f.read()
        with open("ppid", "w") as f:
            f.write(status.split("PPid:")[1].split()[0])
'''

FACTS = '''
import json, os, socket, sys, unittest
class Facts(unittest.TestCase):
    def test_facts(self):
        status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
        try:
            socket.create_connection(("127.0.0.1", int(os.environ["HOST_PORT"])), 2)
            net = "connected"
        except OSError as exc:
            net = type(exc).__name__
        try:
            os.listdir(os.environ["OTHER"])
            other = "listed"
        except OSError as exc:
            other = type(exc).__name__
        facts = {key: status[key].split() for key in ("Uid", "Gid", "Groups", "CapEff",
                                                      "CapBnd", "NoNewPrivs")}
        holder = dict(line.split(":", 1) for line in open("/proc/2/status").read().splitlines())
        facts["holder"] = {key: holder[key].split() for key in ("Name", "Uid", "CapEff", "CapPrm",
                                                                "NoNewPrivs")}
        facts.update(net=net, other=other, pids=sorted(int(p) for p in os.listdir("/proc")
                                                       if p.isdigit()),
                     fds=sorted(os.listdir("/proc/self/fd")), cwd=os.getcwd(),
                     home=os.environ["HOME"], tmp=os.environ["TMPDIR"],
                     limits=[line for line in open("/proc/self/limits").read().splitlines()
                             if line.startswith(("Max processes", "Max open files"))])
        try:
            bytearray(2048 * 1024 * 1024)
            facts["memory"] = "allocated"
        except MemoryError:
            facts["memory"] = "MemoryError"
        print("FACTS", json.dumps(facts), flush=True)
        import forker  # noqa: F401 - forks until refused, and says after how many
'''


def workspace(tests: dict[str, str], root: Path, warm: bool = True) -> Workspace:
    def populate(dest: Path) -> None:
        (dest / "tests").mkdir()
        for name, text in tests.items():
            (dest / name).write_text(text)
    return Workspace(populate, root=root, policy=replace(POLICY, warm_unittest=warm),
                     history=False)


def test_only_runs_a_fork_reproduces_exactly_are_forked():
    repo = Path("/repo")
    assert UnittestForks.reproduces(UNITTEST, ENV, repo)
    assert not UnittestForks.reproduces(["/usr/bin/python3", *UNITTEST[1:]], ENV, repo)
    assert not UnittestForks.reproduces([sys.executable, "-S", "-c", "x"], ENV, repo)
    assert not UnittestForks.reproduces([sys.executable, "-m", "unittest"], ENV, repo)  # site
    assert not UnittestForks.reproduces(UNITTEST, {**ENV, "LC_ALL": "C"}, repo)  # a locale
    assert not UnittestForks.reproduces(UNITTEST, {**ENV, "PYTHONHASHSEED": "1"}, repo)
    assert not UnittestForks.reproduces(UNITTEST, {**ENV, "PYTHONWARNINGS": "error"}, repo)
    assert not UnittestForks.reproduces(UNITTEST, {**ENV, "PYTHONPATH": "/elsewhere"}, repo)


# unittest.case imports pprint; the server holds shutil and locale because a run's argparse
# would import them
@pytest.mark.parametrize("module", ["pprint.py", "shutil.py", "locale.py"])
def test_a_folder_holding_a_module_named_like_a_warm_one_is_not_forked(tmp_path, module):
    (tmp_path / "calc.py").write_text("")
    env = {**ENV, "PYTHONPATH": str(tmp_path)}
    assert FORKS.serves(UNITTEST, env, tmp_path)
    (tmp_path / module).write_text("")
    assert not FORKS.serves(UNITTEST, env, tmp_path)


@AS_ROOT
def test_a_forked_run_reports_what_an_execd_one_does(tmp_path):
    outputs, parents = {}, {}
    for warm in (False, True):
        ws = workspace({"tests/test_report.py": REPORTING}, tmp_path, warm)
        try:
            res = ws.run(UNITTEST, 30, 100_000)
            assert not res.timed_out
            text = re.sub(r"in \d+\.\d+s", "in Ts", res.output.replace(str(ws.path), "REPO"))
            outputs[warm] = (res.exit_code, text)
            parents[warm] = (ws.path / "ppid").read_text()
        finally:
            ws.close()
    assert outputs[True] == outputs[False]
    assert outputs[True][0] == 1 and "FAILED (failures=1)" in outputs[True][1]
    assert "printed by a test" in outputs[True][1] and "Ran 3 tests" in outputs[True][1]
    # exec'd: the sandbox's init is the parent; forked: the parent is outside the namespace
    assert parents == {False: "1", True: "0"}


@AS_ROOT
def test_a_forked_run_is_confined_like_any_command(tmp_path):
    listener = socket.create_server(("127.0.0.1", 0))
    other = workspace({}, tmp_path)
    ws = workspace({"tests/test_facts.py": FACTS, "forker.py": FORK_UNTIL_REFUSED}, tmp_path)
    try:
        env = {"HOST_PORT": str(listener.getsockname()[1]), "OTHER": str(other.path)}
        res = ws.run(UNITTEST, 60, 100_000, env=env)
        line = next(x for x in res.output.splitlines() if x.startswith("FACTS "))
        facts = json.loads(line[len("FACTS "):])
        uid = str(ws.lease.uid)
        assert facts["Uid"] == [uid] * 4 and facts["Gid"] == [uid] * 4 and facts["Groups"] == []
        assert facts["CapEff"] == facts["CapBnd"] == ["0000000000000000"]
        assert facts["NoNewPrivs"] == ["1"]
        assert facts["net"] == "ConnectionRefusedError"  # its own network namespace
        assert facts["other"] == "FileNotFoundError"  # another session's files are not there
        assert facts["pids"][:3] == [1, 2, 3]  # bwrap's init, the holder, the run: its own PIDs
        # the holder stays root (no setpriv), without a capability it could use or regain
        assert facts["holder"] == {"Name": ["cat"], "Uid": ["0"] * 4,
                                   "CapEff": ["0000000000000000"],
                                   "CapPrm": ["0000000000000000"], "NoNewPrivs": ["1"]}
        assert facts["fds"] == ["0", "1", "2", "3"]  # nothing of the server's (3: the listing)
        assert facts["cwd"] == facts["home"] == facts["tmp"] == str(ws.path)
        assert facts["memory"] == "MemoryError"
        forked = re.search(r"refused after (\d+) (\d+)", res.output)
        assert forked and 0 < int(forked[1]) < POLICY.nprocs
        assert int(forked[2]) == errno.EAGAIN
        assert any(line.split()[2:4] == ["32", "32"] for line in facts["limits"])
        assert any(line.split()[3:5] == ["64", "64"] for line in facts["limits"])
    finally:
        ws.close()
        other.close()
        listener.close()


@AS_ROOT
def test_a_module_of_the_task_named_like_a_warm_one_runs_the_execd_interpreter(tmp_path):
    shadow = "print('the task own pprint')\ndef pformat(o, *a, **k):\n    return repr(o)\n" \
             "class PrettyPrinter:\n    pass\n"
    ws = workspace({"tests/test_report.py": REPORTING, "pprint.py": shadow}, tmp_path)
    try:
        res = ws.run(UNITTEST, 30, 100_000)
        assert "the task own pprint" in res.output and "Ran 3 tests" in res.output
    finally:
        ws.close()


@AS_ROOT
def test_a_hung_run_is_killed_with_all_it_started_and_the_server_serves_on(tmp_path):
    hang = ("import os, time, unittest\nclass Hang(unittest.TestCase):\n"
            "    def test_hang(self):\n        if os.fork() == 0:\n            os.setsid()\n"
            "        time.sleep(1000)\n")
    ws = workspace({"tests/test_hang.py": hang}, tmp_path)
    try:
        start = time.monotonic()
        res = ws.run(UNITTEST, 2, 10_000)
        assert res.timed_out and res.exit_code is None and time.monotonic() - start < 10
        uid = ws.lease.uid
        left = [p for p in os.listdir("/proc") if p.isdigit() and _uid(p) == uid]
        assert left == []
        server = FORKS._proc.pid
        assert Path(f"/proc/{server}/task/{server}/children").read_text().split() == []
    finally:
        ws.close()
    os.kill(FORKS._proc.pid, signal.SIGKILL)  # a dead server is started again
    ws = workspace({"tests/test_report.py": REPORTING}, tmp_path)
    try:
        assert "Ran 3 tests" in ws.run(UNITTEST, 30, 100_000).output
    finally:
        ws.close()


def _uid(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
