"""Hydra config groups -> the typed settings each component takes, with one-line errors.

Each group's schema is the dataclass of the component that uses it (registered with Hydra's
ConfigStore as `<group>/schema`): its defaults live there and only there, the YAML files in
`conf/` set what differs, and Hydra rejects unknown keys and wrong types as it composes. Values
with a fixed set of choices (`field(metadata={"choices": ...})`) are checked by `typed`, which
the job runs on every group before anything starts.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf

from envs import EnvConfig
from rollout.corpus import CorpusConfig
from rollout.model_client import CONSTRAINTS
from rollout.tracking import LoggerConfig
from serving import ModelConfig, ServingConfig
from serving.config import store_schema

T = TypeVar("T")


class ConfigError(ValueError):
    """A config value the job cannot use; the message names the key."""


@dataclass(frozen=True)
class RolloutConfig:
    samples_per_task: int = 2
    max_turns: int = 4
    max_tokens_per_turn: int = 6144  # must hold the worst-case tool call (never cut in half)
    max_total_tokens: int = 16384  # completion tokens over a whole session
    temperature: float = 1.0
    top_p: float = 1.0
    tool_choice: str = "required"  # auto | required | none | <tool name>
    parallel_tool_calls: bool = False
    # project: rollfleet's GLM grammar + parser, token-in; stock: the server's, message-in
    tool_constraint: str = field(default="project", metadata={"choices": CONSTRAINTS})
    workers: int = 2  # RolloutWorker actors
    worker_num_cpus: float = 0.25
    # how many sessions run at once (rollout/admission.py): kv_budget: as many as the engines'
    # KV cache holds (at least one group, at most max_sessions); fixed: max_sessions
    admission: str = field(default="kv_budget", metadata={"choices": ("kv_budget", "fixed")})
    max_sessions: int = 8
    kv_fill: float = 0.9  # share of the engines' KV cache that sessions may fill
    session_tokens_guess: int = 4096  # a session's KV at its end, until sessions have finished
    max_retries: int = 3  # attempts after an infra error
    retry_backoff_s: float = 10.0  # attempt n waits retry_backoff_s * 2^(n-1) (10, 20, 40 s)
    max_consecutive_infra: int = 20  # infrastructure errors in a row that stop the run


@dataclass(frozen=True)
class RayConfig:
    """Where the actors run: null address starts a Ray of the job's own on this host;
    `ray.address=HOST:PORT` joins an existing cluster (the driver then only aggregates)."""

    address: str | None = None
    spread: bool = True  # place actors on as many nodes as the cluster has


@dataclass(frozen=True)
class OutputConfig:
    root: str = "runs"
    dir: str = "runs/rollout"  # conf/output/default.yaml: <root>/<run_name>/<time>
    shard_size: int = 64  # records per compacted parquet shard


SCHEMAS: dict[str, type] = {"model": ModelConfig, "serving": ServingConfig, "env": EnvConfig,
                            "rollout": RolloutConfig, "ray": RayConfig,
                            "corpus": CorpusConfig, "output": OutputConfig,
                            "logger": LoggerConfig}


def register_schemas() -> None:
    """Every config group's schema, as `<group>/schema` for the YAML files' defaults lists."""
    for group, cls in SCHEMAS.items():
        store_schema(group, cls)


def validate(cfg: DictConfig) -> dict[str, Any]:
    """Every group as its typed settings: a bad value is a ConfigError before anything runs."""
    return {group: typed(cls, cfg[group], group) for group, cls in SCHEMAS.items()}


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
        choices = known[name].metadata.get("choices")
        if choices is not None and value not in choices:
            raise ConfigError(f"{group}.{name} must be one of {list(choices)}, got {value!r}")
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
