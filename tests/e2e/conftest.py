"""A failed or timed-out end-to-end test must not leave its job running into the next test;
one engine is shared by the tests whose promise is not about the job's own engine."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from serving import Endpoint, ModelConfig, ServingConfig
from serving.cluster import Cluster
from tests.procs import STARTED_BY_JOB, process_table

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="package")
def shared_engine(tmp_path_factory) -> Iterator[Endpoint]:
    """The embedded engine a job would start (same flags), started once for the end-to-end
    tests and stopped after the last of them (an idle engine still takes ~12% of a core)."""
    run_dir = tmp_path_factory.mktemp("shared-engine")
    with Cluster(ServingConfig(), ModelConfig(), run_dir, ROOT / ".cache") as endpoint:
        yield endpoint


@pytest.fixture
def on_shared_engine(shared_engine: Endpoint) -> list[str]:
    """Job overrides that serve from the shared engine (serving=external), starting none."""
    return ["serving=external", f"serving.base_url={shared_engine.base_url}"]


@pytest.fixture(autouse=True)
def no_leftover_jobs():
    before = set(process_table())
    yield
    for pid, cmd in process_table().items():
        if pid not in before and pid != os.getpid() and (
                "rollout.run" in cmd or any(m in cmd for m in STARTED_BY_JOB)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
