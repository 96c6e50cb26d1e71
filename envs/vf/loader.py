"""Find a verifiers Taskset: `package.module:Class`, or an id as `vf-eval` takes it.

verifiers' own loader imports ids as top-level modules exporting one Taskset via `__all__`
(it cannot import dotted module paths); `module:Class` reaches any importable Taskset class.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import verifiers.v1 as vf
from verifiers.v1.utils.generic import concrete_type

from envs.task import EnvError


def load_taskset(spec: str, overrides: Mapping[str, Any] | None = None) -> vf.Taskset:
    """The taskset `spec` names, configured with `overrides` (TasksetConfig fields)."""
    data = {**(overrides or {}), "id": spec}
    try:
        if ":" not in spec:
            return vf.load_taskset(vf.taskset_config_type(spec).model_validate(data))
        module, _, name = spec.partition(":")
        cls = getattr(importlib.import_module(module), name)
        if not (isinstance(cls, type) and issubclass(cls, vf.Taskset)):
            raise TypeError(f"{spec} is not a verifiers Taskset class")
        config = concrete_type(cls, vf.TasksetConfig, origin=vf.Taskset) or vf.TasksetConfig
        return cls(config.model_validate(data))
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        raise EnvError(f"verifiers taskset {spec!r}: {exc}") from None
