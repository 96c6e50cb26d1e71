"""A failed or timed-out end-to-end test must not leave its job running into the next test."""

from __future__ import annotations

import contextlib
import os
import signal

import pytest

from tests.procs import STARTED_BY_JOB, process_table


@pytest.fixture(autouse=True)
def no_leftover_jobs():
    before = set(process_table())
    yield
    for pid, cmd in process_table().items():
        if pid not in before and pid != os.getpid() and (
                "rollout.run" in cmd or any(m in cmd for m in STARTED_BY_JOB)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
