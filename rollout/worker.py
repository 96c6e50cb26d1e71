"""The Ray actor that runs many sessions at once on one event loop."""

from __future__ import annotations

import gc
import logging
from typing import Any

import ray

from envs import EnvConfig, load
from rollout.model_client import ModelClient, SamplingConfig
from rollout.record import Job, Provenance
from rollout.rl.policy_fence import TurnFence
from rollout.session import Session, SessionLimits
from serving import Endpoint


class RolloutWorker:
    """Holds one environment and one model client; `run(job)` returns the job's record."""

    def __init__(self, env_cfg: EnvConfig, endpoint: Endpoint, sampling: SamplingConfig,
                 limits: SessionLimits, seed: int, provenance: Provenance,
                 board: Any | None = None) -> None:
        """`board`: the RL loop's PolicyBoard actor (rollout/rl/policy_fence.py), if any."""
        logging.basicConfig(level=logging.WARNING)
        self.env = load(env_cfg)
        self.client = ModelClient(endpoint, sampling)
        self.limits, self.seed, self.provenance = limits, seed, provenance
        self.fence = TurnFence(board, provenance.checkpoint)
        self.node_id = ray.get_runtime_context().get_node_id()
        # What is loaded by now (Ray, the tokenizer, the tasks) lives as long as the actor: the
        # collector's full passes skip it (the collector took 6% of an actor's CPU at 1,024
        # sessions, perf).
        gc.freeze()

    async def run(self, job: Job, engine_names: dict[str, str]) -> dict[str, Any]:
        """`engine_names`: the serving engines as they are now (a restarted engine has a new
        instance id), so that the record names the engine that served each turn."""
        self.client.door.engine_names = engine_names
        return await Session(job, self.env, self.client, self.limits, self.seed,
                             self.provenance, self.node_id, self.fence).run()


def remote_worker(concurrency: int, num_cpus: float, spread: bool):
    """The actor class with this run's concurrency and CPU share; `spread` places actors on
    as many Ray nodes as there are (a multi-node cluster), each materializing its own tasks."""
    options: dict[str, Any] = {"num_cpus": num_cpus, "max_concurrency": concurrency}
    if spread:
        options["scheduling_strategy"] = "SPREAD"
    return ray.remote(**options)(RolloutWorker)
