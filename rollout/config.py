"""Hydra config groups -> the typed settings each component takes, with one-line errors.

Each group's schema is the dataclass of the component that uses it (registered with Hydra's
ConfigStore as `<group>/schema`): its defaults live there and only there, the YAML files in
`conf/` set what differs, and Hydra rejects unknown keys and wrong types as it composes. Values
with a fixed set of choices (`field(metadata={"choices": ...})`) are checked by `typed`, which
the job runs on every group before anything starts.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf

from envs import EnvConfig
from rollfleet.cli import store_schema, typed
from rollout.model_client import CONSTRAINTS, SamplingConfig
from rollout.reports.corpus import CorpusConfig
from rollout.session import SessionLimits
from rollout.tracking import LoggerConfig
from serving import PAUSE_MODES, ModelConfig, ServingConfig

T = TypeVar("T")
STALE_GROUPS = ("drop", "resample")
# what turns in flight do in a weight update (rollout/rl/policy_update.py): the engines' pause
# modes, and `continue` (cut by the pause, the turn goes on under the new weights)
UPDATE_MODES = (*PAUSE_MODES, "continue")


@dataclass(frozen=True)
class RolloutConfig:
    samples_per_task: int = 2  # sessions per task: one group
    max_turns: int = 4  # model turns per session
    max_tokens_per_turn: int = 6144  # must hold the worst-case tool call (never cut in half)
    max_total_tokens: int = 16384  # completion tokens over a whole session
    # sampling: defaults from the client's SamplingConfig (rollout/model_client.py)
    temperature: float = SamplingConfig.temperature  # sampling temperature
    top_p: float = SamplingConfig.top_p  # nucleus sampling's p
    tool_choice: str = SamplingConfig.tool_choice  # auto | required | none | <tool name>
    parallel_tool_calls: bool = SamplingConfig.parallel_tool_calls  # more than one call per turn
    # project: rollfleet's GLM grammar + parser, token-in; stock: the server's, message-in
    tool_constraint: str = field(default=SamplingConfig.constraint,
                                 metadata={"choices": CONSTRAINTS})
    workers: int = 2  # RolloutWorker actors
    worker_num_cpus: float = 0.25  # Ray CPUs each actor reserves
    # how many sessions run at once (rollout/admission.py): kv_budget: as many as the engines'
    # KV cache holds (at least one group, at most max_sessions); fixed: max_sessions
    admission: str = field(default="kv_budget", metadata={"choices": ("kv_budget", "fixed")})
    max_sessions: int = 8  # admission's ceiling (kv_budget), or the fixed window
    kv_fill: float = 0.9  # share of the engines' KV cache that sessions may fill
    session_tokens_guess: int = 4096  # a session's KV at its end, until sessions have finished
    max_retries: int = 3  # attempts after an infra error
    retry_backoff_s: float = 10.0  # attempt n waits retry_backoff_s * 2^(n-1) (10, 20, 40 s)
    max_consecutive_infra: int = 20  # infrastructure errors in a row that stop the run
    # RL (rollout/rl/policy_fence.py): how turns in flight meet a weight update, and how many
    # policy versions a session may outlive (null: any); a stale one is ended, or kept and
    # marked (left out of the trainer's view)
    update_mode: str = field(default="wait", metadata={"choices": UPDATE_MODES})
    max_policy_lag: int | None = None  # versions a session may outlive (null: any)
    # a session past max_policy_lag: ended, or kept and marked
    stale_sessions: str = field(default="end", metadata={"choices": ("end", "keep")})
    # how old a group may be when the trainer takes it (the served version minus its oldest
    # token's; null: any); an older one is dropped, or dropped and its task sampled again
    # (rollout/rl/loop.py)
    max_off_policy_steps: int | None = None
    # a group past max_off_policy_steps: dropped, or its task sampled again
    stale_groups: str = field(default="drop", metadata={"choices": STALE_GROUPS})

    def limits(self) -> SessionLimits:
        return SessionLimits(self.max_turns, self.max_tokens_per_turn, self.max_total_tokens,
                             self.max_policy_lag, self.stale_sessions,
                             continue_turns=self.update_mode == "continue")

    def sampling(self) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.top_p, self.tool_choice,
                              self.parallel_tool_calls, self.tool_constraint)


@dataclass(frozen=True)
class RayConfig:
    """Where the actors run: null address starts a Ray of the job's own on this host;
    `ray.address=HOST:PORT` joins an existing cluster (the driver then only aggregates)."""

    address: str | None = None  # null: a Ray of the job's own; HOST:PORT: an existing cluster
    spread: bool = True  # place actors on as many nodes as the cluster has


@dataclass(frozen=True)
class OutputConfig:
    root: str = "runs"  # where run folders go
    dir: str = "runs/rollout"  # conf/output/default.yaml: <root>/<run_name>/<time>
    shard_size: int = 64  # records per compacted parquet shard
    # records that land within this many seconds of the first go to disk as one file (each
    # counts as done once it is there): one file and fsync per record cost the driver 2.8 ms
    commit_s: float = 1.0


@dataclass(frozen=True)
class TrainerConfig:
    """The RL example's trainer (rollout/rl/reinforce.py): off unless an experiment turns it on
    (conf/experiment/rl_loop.yaml)."""

    enabled: bool = False  # run the example trainer (rollout/rl/reinforce.py)
    steps: int = 20  # trainer steps, one weight update each
    groups_per_step: int = 4  # groups the trainer takes a step
    lr: float = 1e-3  # the trainer's learning rate
    ahead: int | None = None  # groups that may wait for the trainer (default: two steps')
    # truncated importance sampling: each token's weight is min(pi / mu, is_clip), pi the
    # current policy's probability, mu the behaviour one recorded; null: no correction
    is_clip: float | None = 2.0


SCHEMAS: dict[str, type] = {"model": ModelConfig, "serving": ServingConfig, "env": EnvConfig,
                            "rollout": RolloutConfig, "ray": RayConfig,
                            "corpus": CorpusConfig, "output": OutputConfig,
                            "logger": LoggerConfig, "trainer": TrainerConfig}


def register_schemas() -> None:
    """Every config group's schema, as `<group>/schema` for the YAML files' defaults lists."""
    for group, cls in SCHEMAS.items():
        store_schema(group, cls)


def validate(cfg: DictConfig) -> dict[str, Any]:
    """Every group as its typed settings: a bad value is a ConfigError before anything runs."""
    return {group: typed(cls, cfg[group], group) for group, cls in SCHEMAS.items()}


def config_hash(cfg: DictConfig) -> str:
    """A stable hash of the resolved config, output paths left out (a resumed run keeps it)."""
    data = OmegaConf.to_container(cfg, resolve=True)
    data.pop("output", None)
    text = OmegaConf.to_yaml(OmegaConf.create(data), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]

