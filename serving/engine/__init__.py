"""Code that runs inside vLLM engine processes, never in the driver or the actors: the general
plugin (plugin.py, loaded by vLLM from the `vllm.general_plugins` entry point) and the host KV
tier's connector (kvtier/, named in each engine's --kv-transfer-config)."""
