"""`serving=disagg`: prefill-only and decode-only vLLM workers behind Dynamo's router, KV moved
between them by NIXL."""

from __future__ import annotations

from serving.errors import ServingError
from serving.topologies.dynamo import DynamoTopology


class Disaggregated(DynamoTopology):
    name = "disagg"

    def roles(self) -> list[tuple[str, str]]:
        cfg = self.where.serving
        if cfg.prefill_engines < 1 or cfg.decode_engines < 1:
            raise ServingError("serving=disagg needs prefill_engines >= 1 and decode_engines >= 1,"
                               f" got {cfg.prefill_engines} and {cfg.decode_engines}")
        return ([(f"prefill{i}", "prefill") for i in range(cfg.prefill_engines)]
                + [(f"decode{i}", "decode") for i in range(cfg.decode_engines)])
