"""NVIDIA Dynamo as the front door: its control plane, OpenAI frontend and vLLM workers."""
