"""Serving: engines, the front door, routing, KV tiers and model folders. Knows nothing of tasks."""

from serving.chat import ChatRenderer, TemplateError, chat_renderer
from serving.cluster import Cluster
from serving.config import LOGPROBS_MODES, ModelConfig, ServingConfig, ServingError
from serving.endpoint import Endpoint
from serving.frontdoor import (
    FRONT_DOORS,
    FrontDoor,
    Generation,
    PromptTooLong,
    Sampling,
    ServerUnavailable,
    open_front_door,
)
from serving.metrics import KvState, MetricsError, engine_urls, kv_state, prefix_hits
from serving.model_dir import resolve_model_dir
from serving.tool_turn import SampledCall, ToolCallSampler, ToolTurn, tool_choice
from serving.toolcall import (
    ISSUE_KINDS,
    MARKUP_TOKENS,
    CallTooLong,
    ParsedTurn,
    ToolCallGrammar,
    build_grammar,
    check_call,
    parse_glm,
)

__all__ = [
    "FRONT_DOORS", "ISSUE_KINDS", "LOGPROBS_MODES", "MARKUP_TOKENS", "CallTooLong",
    "ChatRenderer", "Cluster", "Endpoint", "FrontDoor", "Generation", "KvState", "MetricsError",
    "ModelConfig", "ParsedTurn", "engine_urls", "kv_state",
    "PromptTooLong", "Sampling", "ServerUnavailable", "ServingConfig", "ServingError",
    "TemplateError", "ToolCallGrammar", "build_grammar", "chat_renderer", "check_call",
    "open_front_door", "parse_glm", "prefix_hits", "resolve_model_dir",
    "SampledCall", "ToolCallSampler", "ToolTurn", "tool_choice",
]
