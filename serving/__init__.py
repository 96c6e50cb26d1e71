"""Serving: engines, the front door, routing, KV tiers and model folders. Knows nothing of tasks."""

from serving.cluster import Cluster, resolve_model_dir
from serving.config import ModelConfig, ServingConfig, ServingError, from_mapping
from serving.endpoint import Endpoint

__all__ = ["Cluster", "Endpoint", "ModelConfig", "ServingConfig", "ServingError", "from_mapping",
           "resolve_model_dir"]
