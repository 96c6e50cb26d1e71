"""`python -m serving.simulate`: a GPU fleet simulated on this machine (cli.py). Self-contained:
nothing else in `serving` imports it."""
