"""Rollouts: Ray actors drive agent sessions against an Endpoint and record what was sampled."""

import os

# Ray is local to the job: with this set before ray is imported, its node address is loopback
# and its gRPC servers bind 127.0.0.1 instead of every interface.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
