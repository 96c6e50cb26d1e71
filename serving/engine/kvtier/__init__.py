"""The host KV tier as an engine sees it: vLLM's connector (connector.py), its client of the
Mooncake store (client.py), and the block-major object layout (blocks.py). The tier's processes
are started by the driver (serving/kvtier)."""
