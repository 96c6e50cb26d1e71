"""Serving: engines, the front door, routing, KV tiers and model folders. Knows nothing of tasks.

This top level is the client face: what a process that samples from a running cluster needs
(the job's Ray actors import only this). Starting, restarting and stopping the cluster is the
driver's (`serving.cluster.Cluster`); code that runs inside engine processes is in
`serving.engine`; `serving.serve` and `serving.simulate` are standalone apps.
"""

from serving.config import ModelConfig, ServingConfig, ServingError
from serving.endpoint import Endpoint, EngineSlot, Roster
from serving.frontdoor import (
    FrontDoor,
    Generation,
    PromptTooLong,
    Sampling,
    ServerUnavailable,
    open_front_door,
)
from serving.metrics import KvState, MetricsError
from serving.tool_turn import SampledCall, ToolCallSampler, ToolTurn
from serving.toolcall import ISSUE_KINDS, CallTooLong

__all__ = [
    "ISSUE_KINDS", "CallTooLong", "Endpoint", "EngineSlot", "FrontDoor", "Generation", "KvState",
    "MetricsError", "ModelConfig", "PromptTooLong", "Roster", "SampledCall", "Sampling",
    "ServerUnavailable", "ServingConfig", "ServingError", "ToolCallSampler", "ToolTurn",
    "open_front_door",
]
