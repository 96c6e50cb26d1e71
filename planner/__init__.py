"""The capacity planner, `python -m planner`: a GPU fleet simulated on this machine (cli.py).
A package of its own beside serving: it reads serving's config and face (and, for its live
mode, starts a cluster through `serving.running_cluster`); nothing imports it."""
