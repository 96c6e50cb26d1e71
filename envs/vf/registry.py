"""One `SandboxEnvironment` per process and config, shared by the taskset, tool servers and rewards.

Tool servers and rewards only receive configs (verifiers ships them as JSON), so they look the
environment up here instead of loading the suite again for every rollout.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from functools import lru_cache

from envs.environment import EnvConfig, SandboxEnvironment


def environment_for(cfg: EnvConfig) -> SandboxEnvironment:
    return _load(json.dumps(asdict(cfg), sort_keys=True))


@lru_cache(maxsize=8)
def _load(key: str) -> SandboxEnvironment:
    return SandboxEnvironment(EnvConfig(**json.loads(key)))
