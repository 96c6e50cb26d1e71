"""`serving=kv_routed`: `serving.engines` aggregated vLLM workers behind Dynamo's KV router."""

from __future__ import annotations

from serving.errors import ServingError
from serving.topologies.dynamo import DynamoTopology


class Aggregated(DynamoTopology):
    name = "kv_routed"

    def roles(self) -> list[tuple[str, str]]:
        n = self.where.serving.engines
        if n < 1:
            raise ServingError(f"serving.engines must be >= 1, got {n}")
        return [(f"agg{i}", "agg") for i in range(n)]
