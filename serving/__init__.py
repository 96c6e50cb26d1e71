"""Serving: engines, the front door, routing, KV tiers and model folders. Knows nothing of tasks.

This top level is the client face: what a process that samples from a running cluster needs
(the job's Ray actors import only this, and importing it loads no engine, router or KV tier).
The driver starts, reuses and stops clusters through `running_cluster` (serving/cluster.py),
loaded on first use, as are a trainer's replay of the grammar masks (`GrammarReplay`,
serving/toolcall/replay.py) and the two ends of weights sent from a trainer's ranks
(`WeightSender`, `Transfer`: serving/weight_transfer.py) and its saving of a version as a model
folder (`save_model_folder`, serving/checkpoints.py); code that runs inside engine
processes is in `serving.engine`; `serving.serve` and `planner` are standalone apps.
"""

from typing import Any

from serving.config import PAUSE_MODES, ModelConfig, ServingConfig
from serving.endpoint import Endpoint, EngineSlot, Roster
from serving.errors import ServerUnavailable, ServingError
from serving.frontdoor import FrontDoor, Generation, PromptTooLong, Sampling, open_front_door
from serving.metrics import KvState, MetricsError
from serving.tool_turn import SampledCall, ToolCallSampler, ToolTurn
from serving.toolcall import ISSUE_KINDS, CallTooLong, TurnTooLong

__all__ = [
    "ISSUE_KINDS", "PAUSE_MODES", "CallTooLong", "Endpoint", "EngineSlot", "FrontDoor",
    "Generation", "GrammarReplay", "KvState", "MetricsError", "ModelConfig", "PromptTooLong",
    "Roster", "SampledCall", "Sampling", "ServerUnavailable", "ServingConfig", "ServingError",
    "ToolCallSampler", "ToolTurn", "Transfer", "TurnTooLong", "WeightSender",
    "open_front_door", "running_cluster", "save_model_folder",
]

_LAZY = {"running_cluster": ("serving.cluster", "running_cluster"),
         "GrammarReplay": ("serving.toolcall.replay", "GrammarReplay"),
         "Transfer": ("serving.weight_transfer", "Transfer"),
         "WeightSender": ("serving.weight_transfer", "WeightSender"),
         "save_model_folder": ("serving.checkpoints", "save_model_folder")}


def __getattr__(name: str) -> Any:
    """The driver's and the trainer's names, imported when first asked for, never by an
    actor."""
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'serving' has no attribute {name!r}")
