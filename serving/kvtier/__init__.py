"""A host-DRAM KV tier shared by every engine of a run: Mooncake's store, block-major objects.

`serving.kv_tier=mooncake` starts the tier's processes (service.py) before the engines and
stops them after; each engine gets vLLM's `--kv-transfer-config` naming the project's connector
(connector.py), which saves every full KV block to the tier as one object holding all layers
(blocks.py) and loads a request's missing prefix blocks from it, whichever engine stored them.
Nothing here is needed by the rest of the project: the endpoint is the same with or without it.
"""

from serving.kvtier.service import MooncakeTier, kv_transfer_config

__all__ = ["MooncakeTier", "kv_transfer_config"]
