"""Tool servers run as `python -m <module>` from their own folder: let them import `tests`."""

import os
from pathlib import Path

import pytest

from tests.procs import process_table

ROOT = Path(__file__).resolve().parents[3]
SPAWNED = ("envs.vf.toolset", "tests.envs.vf.counter", ".vf-program-")


@pytest.fixture(scope="session", autouse=True)
def importable_tests():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT),
                                                              os.environ.get("PYTHONPATH")])))
        yield


def tool_servers() -> list[str]:
    """Tool server and chat program processes now running."""
    return [cmd for cmd in process_table().values() if any(s in cmd for s in SPAWNED)]
