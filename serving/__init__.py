"""Serving: engines, the front door, routing, KV tiers and model folders. Knows nothing of tasks."""

from serving.cluster import Cluster, resolve_model_dir
from serving.config import ModelConfig, ServingConfig, ServingError
from serving.endpoint import Endpoint

__all__ = ["Cluster", "Endpoint", "ModelConfig", "ServingConfig", "ServingError",
           "resolve_model_dir"]
