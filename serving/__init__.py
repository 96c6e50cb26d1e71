"""Serving: engines, the front door, routing, KV tiers and model folders. Knows nothing of tasks."""

from serving.cluster import Cluster, resolve_model_dir
from serving.config import ModelConfig, ServingConfig, ServingError
from serving.endpoint import Endpoint
from serving.metrics import prefix_hits
from serving.token_bytes import TokenBytes
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
    "ISSUE_KINDS", "MARKUP_TOKENS", "CallTooLong", "Cluster", "Endpoint", "ModelConfig",
    "ParsedTurn", "ServingConfig", "ServingError", "TokenBytes", "ToolCallGrammar", "build_grammar",
    "check_call", "parse_glm", "prefix_hits", "resolve_model_dir",
]
