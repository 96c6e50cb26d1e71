"""`python -m serving.serve`: the cluster behind an OpenAI-compatible front, for outside clients
(cli.py: the command; proxy.py: the front)."""
