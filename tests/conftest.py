"""Loaded before any test module: the Triton kernels are imported here, interpreted on CPU.

Triton picks its CPU interpreter when a function is decorated (its own library included), so
on a machine without CUDA the variable TRITON_INTERPRET must be set before anything imports
triton, and test modules elsewhere do (transformers and vLLM import it). It is set only while
the kernel modules are imported; the kernel tests set it again (tests/kernels/conftest.py), and
the rest of the session, engines started by tests included, never sees it.
"""

import importlib.util
import os

import torch

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
