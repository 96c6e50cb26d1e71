"""The Ray actor that runs many sessions at once on one event loop."""

from __future__ import annotations

import logging
from typing import Any

import ray

from envs import EnvConfig, load
from rollout.model_client import ModelClient, SamplingConfig
from rollout.record import Job, Provenance
from rollout.session import Session, SessionLimits
from serving import Endpoint


class RolloutWorker:
    """Holds one environment and one model client; `run(job)` returns the job's record."""

    def __init__(self, env_cfg: EnvConfig, endpoint: Endpoint, sampling: SamplingConfig,
                 limits: SessionLimits, seed: int, provenance: Provenance) -> None:
        logging.basicConfig(level=logging.WARNING)
        self.env = load(env_cfg)
        self.client = ModelClient(endpoint, sampling)
        self.limits, self.seed, self.provenance = limits, seed, provenance

    async def run(self, job: Job) -> dict[str, Any]:
        return await Session(job, self.env, self.client, self.limits, self.seed,
                             self.provenance).run()


def remote_worker(concurrency: int, num_cpus: float):
    """The actor class with this run's concurrency and CPU share."""
    return ray.remote(num_cpus=num_cpus, max_concurrency=concurrency)(RolloutWorker)
