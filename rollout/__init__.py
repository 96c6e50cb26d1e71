"""Rollouts: Ray actors drive agent sessions against an Endpoint and record what was sampled."""

import os
from pathlib import Path

# Ray is local to the job: with this set before ray is imported, its node address is loopback
# and its gRPC servers bind 127.0.0.1 instead of every interface.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# A Ray that ray.init starts checks this host's token (Ray's default); a process attaching by
# explicit address (a trainer to the rollout service, rollout/rl/service.py) sends it only in
# token mode, read when ray is imported.
if (Path.home() / ".ray" / "auth_token").is_file():
    os.environ.setdefault("RAY_AUTH_MODE", "token")
