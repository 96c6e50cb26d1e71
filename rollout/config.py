"""Hydra config groups -> the typed settings each component takes, with one-line errors."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf

T = TypeVar("T")


class ConfigError(ValueError):
    """A config value the job cannot use; the message names the key."""


@dataclass(frozen=True)
class RolloutConfig:
    samples_per_task: int = 2
    max_turns: int = 4
    max_tokens_per_turn: int = 256
    max_total_tokens: int = 1024
    temperature: float = 1.0
    top_p: float = 1.0
    tool_choice: str = "required"
    parallel_tool_calls: bool = False
    tool_constraint: str = "project"  # project | stock
    workers: int = 2
    sessions_per_worker: int = 4
    worker_num_cpus: float = 0.25
    max_retries: int = 3
    retry_backoff_s: float = 10.0


@dataclass(frozen=True)
class OutputConfig:
    root: str = "runs"
    dir: str = "runs/rollout"
    shard_size: int = 64


def typed(cls: type[T], node: Any, group: str) -> T:
    """Build `cls` from a config group; unknown keys and wrong types are ConfigErrors."""
    values = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node
    if not isinstance(values, dict):
        raise ConfigError(f"config group {group!r} must be a mapping, got {values!r}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} in config group {group!r}; "
                          f"known keys: {sorted(known)}")
    for name, value in values.items():
        kind = known[name].type
        if kind in ("int", "float") and (not isinstance(value, int | float)
                                         or isinstance(value, bool)):
            raise ConfigError(f"{group}.{name} must be a number, got {value!r}")
        if kind == "int" and isinstance(value, float):
            raise ConfigError(f"{group}.{name} must be an integer, got {value!r}")
        if kind == "dict[str, str]":  # environment variables: `X=16` on the command line is an int
            if not isinstance(value, dict) or any(isinstance(v, dict | list | None)
                                                  for v in value.values()):
                raise ConfigError(f"{group}.{name} must map names to plain values, got {value!r}")
            values[name] = {str(k): str(v) for k, v in value.items()}
    return cls(**values)


def config_hash(cfg: DictConfig) -> str:
    """A stable hash of the resolved config, output paths left out (a resumed run keeps it)."""
    data = OmegaConf.to_container(cfg, resolve=True)
    data.pop("output", None)
    text = OmegaConf.to_yaml(OmegaConf.create(data), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def project_root() -> Path:
    return Path(__file__).resolve().parents[1]
