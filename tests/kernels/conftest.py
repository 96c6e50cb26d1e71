"""Kernel tests run compiled on a CUDA device, else in Triton's CPU interpreter.

Triton reads TRITON_INTERPRET when it decorates a function (its own library included) and
again while it runs: on CPU, triton and the kernel modules are imported interpreted by
tests/conftest.py before any other test module, and each test of this folder sets the variable
again; the rest of the session never sees it.
"""

import importlib.util
import zlib
from pathlib import Path

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
INTERPRET = bool(importlib.util.find_spec("triton")) and not HAS_CUDA
if INTERPRET:
    from triton.runtime.interpreter import InterpretedFunction

    import kernels.sparse_decode

    # imported before tests/conftest.py could set the variable (a run of this folder alone
    # under another rootdir): the Triton tests cannot run, and say why
    TRITON_LATE = not isinstance(kernels.sparse_decode._split_kernel, InterpretedFunction)
else:
    TRITON_LATE = False


TRITON_TESTS = {"test_cache_write.py", "test_sparse_decode.py", "test_fp8_staging.py"}


@pytest.fixture(autouse=True)
def _interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    if INTERPRET and not TRITON_LATE:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if HAS_CUDA else "cpu")


@pytest.fixture
def gen(device: torch.device, request: pytest.FixtureRequest) -> torch.Generator:
    """A generator seeded per test, on the test's device."""
    g = torch.Generator(device=device)
    g.manual_seed(zlib.crc32(request.node.name.encode()))
    return g


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip this folder's `gpu` tests without a CUDA device (other folders are left alone), and
    its Triton tests when triton was imported, uninterpreted, before this file ran."""
    here = Path(__file__).parent
    late = pytest.mark.skip(
        reason="triton was imported before TRITON_INTERPRET=1 could be set; "
        "set it in the environment to run Triton kernels on CPU"
    )
    for item in items:
        if here not in item.path.parents:
            continue
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
        elif TRITON_LATE and not HAS_CUDA and item.path.name in TRITON_TESTS:
            item.add_marker(late)
