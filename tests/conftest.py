"""Loaded before any test module: the Triton kernels are imported here, interpreted on CPU.

Triton picks its CPU interpreter when a function is decorated (its own library included), so
on a machine without CUDA the variable TRITON_INTERPRET must be set before anything imports
triton, and test modules elsewhere do (transformers and vLLM import it). It is set only while
the kernel modules are imported; the kernel tests set it again (tests/kernels/conftest.py), and
the rest of the session, engines started by tests included, never sees it.
"""

import collections
import contextlib
import importlib.util
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from hypothesis import settings

from tests.procs import SESSION_ENV, process_table

if importlib.util.find_spec("triton") and not torch.cuda.is_available():
    _saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    import kernels.cache_write  # noqa: F401
    import kernels.fp8_staging  # noqa: F401
    import kernels.sparse_decode  # noqa: F401

    if _saved is None:
        del os.environ["TRITON_INTERPRET"]
    else:
        os.environ["TRITON_INTERPRET"] = _saved


# Property tests draw the same examples on every run (no example database, no deadline that a
# loaded 2-core machine would miss): a failure is reproducible, never a fluke of the draw.
settings.register_profile("rollfleet", derandomize=True, database=None, deadline=None,
                          print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "rollfleet"))

# -- what the whole suite promises about itself ------------------------------------------------
# Only tests that need CUDA may skip here, and every skip is counted by its reason at the end;
# nothing the suite started may outlive it (engines, Ray, Dynamo, Mooncake, sandboxes).
CUDA_ONLY = ("CUDA", "sm_90")
LEFTOVER_GRACE_S = 90.0  # Ray's agents notice a SIGKILLed raylet up to ~60 s late
_skips: collections.Counter = collections.Counter()
_before: dict[int, str] = {}




def pytest_sessionstart(session: pytest.Session) -> None:
    _before.update(process_table())
    os.environ.setdefault(SESSION_ENV, str(os.getpid()))  # pytest-xdist workers inherit it


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """With `-n N`: every end-to-end test on one worker, one after another (each takes most of
    the machine: two side by side were no faster, and less reliable), each other module
    whole on whichever worker is free, beside them."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class EndToEndTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "e2e" if nodeid.startswith("tests/e2e/") else nodeid.split("::")[0]

    return EndToEndTogether(config, log)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(
            report.longrepr)
        _skips[reason.removeprefix("Skipped: ")] += 1


def _xdist_worker(config: pytest.Config) -> bool:
    """A pytest-xdist worker: the controller counts skips and leftovers once all are done."""
    return hasattr(config, "workerinput")


def pytest_terminal_summary(terminalreporter, exitstatus: int) -> None:
    if _xdist_worker(terminalreporter.config):
        return
    if _skips:
        terminalreporter.section("skipped, by reason")
        for reason, n in _skips.most_common():
            terminalreporter.write_line(f"{n:5d}  {reason}")
    others = {r: n for r, n in _skips.items() if not any(c in r for c in CUDA_ONLY)}
    if others:
        terminalreporter.write_line(f"error: tests skipped for a reason other than CUDA: "
                                    f"{others}", red=True)
    left = _leftovers()
    if left:
        terminalreporter.write_line(f"error: {len(left)} processes the suite started are "
                                    f"still running (killed now): {left[:5]}", red=True)


@pytest.hookimpl(trylast=True)  # after pytest-xdist has stopped its workers
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _xdist_worker(session.config):
        return
    others = [r for r in _skips if not any(c in r for c in CUDA_ONLY)]
    if (others or _leftovers()) and session.exitstatus == 0:
        session.exitstatus = 1


_left: list[str] | None = None


def _ours() -> list[str]:
    """Processes this session started that still run: they carry its SESSION_ENV (etcd and
    nats-server, started with a bare environment, by name)."""
    mark = f"{SESSION_ENV}={os.environ[SESSION_ENV]}".encode()
    out = []
    for pid, cmd in process_table().items():
        if pid in _before or pid == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") or any(
                    name in cmd for name in ("/etcd ", "nats-server")):
                out.append(f"{pid}: {cmd[:120]}")
    return out


def _leftovers() -> list[str]:
    """Processes this session started that outlived it (after a grace period); they are
    killed (the next run starts clean) and named."""
    global _left
    if _left is None:
        deadline = time.monotonic() + LEFTOVER_GRACE_S
        while (_left := _ours()) and time.monotonic() < deadline:
            time.sleep(2)
        for line in _left:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(line.split(":")[0]), signal.SIGKILL)
    return _left
