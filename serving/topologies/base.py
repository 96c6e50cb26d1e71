"""One way to serve: its workers, how it starts, restarts and stops them, its front door."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from serving.checkpoints import PolicyCheckpoint
from serving.config import ModelConfig, ServingConfig
from serving.endpoint import EngineSlot
from serving.errors import ServingError
from serving.policy import EngineControl, PolicyUpdateError, on_all


@dataclass(frozen=True)
class Placement:
    """What every topology is given: its settings and where its files go."""

    serving: ServingConfig
    model: ModelConfig
    model_dir: Path
    run_dir: Path
    cache_dir: Path
    # the KV tier's connector settings, when the tier runs (with `served_policy`: the file the
    # cluster writes the served policy to, serving/checkpoints.py)
    kv_tier: dict | None = None


@dataclass(frozen=True)
class Started:
    root_url: str  # the front door's root (the OpenAI API is under /v1)
    engines: list[EngineSlot]
    router_metrics: str = ""


def check_routed_experts(cfg: ServingConfig) -> None:
    """vLLM 0.31 captures routed experts only in its Model Runner V2, which needs Triton on a
    GPU: the CPU build refuses to start ('AuxOutput Connector requires Model Runner V2', and
    with VLLM_USE_V2_MODEL_RUNNER=1 'Model Runner V2 requires Triton'; tried 2026-12-06)."""
    if cfg.routed_experts and cfg.device == "cpu":
        raise ServingError("serving.routed_experts needs vLLM's Model Runner V2, which needs a "
                           "GPU (vLLM's CPU build refuses to start with it); set "
                           "serving.device=cuda on a GPU host, or leave it off")


class Topology:
    """Subclasses say how; the cluster (serving/cluster.py) drives them in this order:
    `check()` before anything starts, `start()`, any `restart(name)`, and `stop()` on every
    way out (also after a failed start: it stops what was started)."""

    name: ClassVar[str]
    front_door: ClassVar[str] = "vllm"
    takes_kv_tier: ClassVar[bool] = True  # runs engines that can use the host KV tier
    declares_version: ClassVar[bool] = True  # its engines are told the version they serve

    def __init__(self, where: Placement, on_restart: Callable[[EngineSlot], None],
                 served: PolicyCheckpoint) -> None:
        self.where = where
        self.on_restart = on_restart  # a restarted engine's new slot, for the roster
        # what the engines serve now (the cluster's, after every update): an engine
        # (re)started later starts from it and is told its label
        self.served = served
        # held while the fleet changes: an update, a worker's restart; never both at once
        self.lock = threading.RLock()

    def check(self) -> None:
        """ServingError for settings this topology cannot run, before anything starts."""
        check_routed_experts(self.where.serving)

    def start(self) -> Started:
        raise NotImplementedError

    def restart(self, name: str) -> None:
        raise ServingError(f"serving={self.name} cannot restart its engine {name!r}")

    def declare_version(self) -> None:
        """Every engine is told the version it serves, so that an update can read it back."""
        if self.declares_version:
            on_all(self.controls(), lambda c: c.declare(self.served))

    def after_update(self) -> None:
        """Once every engine serves new weights (a router to tell, say)."""

    def controls(self) -> list[EngineControl]:
        """Each engine's pause / load / resume (serving/policy.py)."""
        raise PolicyUpdateError(f"serving={self.name} cannot take new weights")

    def stop(self) -> None:
        raise NotImplementedError
