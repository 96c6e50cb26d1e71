"""The rollout side of an RL loop, driven by a trainer in its own code.

    with Rollouts(["+experiment=rl_loop"]) as rollouts:
        for step in range(steps):
            groups = rollouts.next_groups(4)      # finished groups, as they complete
            weights = my_train_step(groups)       # name -> tensor, or a checkpoint folder
            rollouts.update_weights(weights)      # every engine, in place: the next version

The fleet (engines, the KV tier, Ray actors) starts once. Sampling goes on in the background
while the trainer trains: a new group starts only while fewer than `ahead` groups wait for the
trainer, so no group starts more than about `ahead / groups per step` versions ahead of the
trainer, and `rollout.max_policy_lag` bounds how many versions a session may outlive (it is
ended, or kept and marked stale). A group's records carry the version of every turn; `mixed`
says when they are not all one version. Records land in the run folder as in any run.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import ray
from omegaconf import DictConfig, OmegaConf

from envs import load
from rollfleet.cli import compose
from rollfleet.paths import cache_dir
from rollfleet.run_dir import RunDir
from rollout.admission import FixedWindow, KvBudget
from rollout.config import SCHEMAS, config_hash, register_schemas, validate
from rollout.model_client import check_sampling
from rollout.policy_fence import remote_board
from rollout.policy_update import update_policy
from rollout.record import Job, Provenance
from rollout.scheduler import JobSource, Scheduler
from rollout.sink import RecordSink
from rollout.trainer_view import save_trainer_view
from rollout.worker import remote_worker
from serving import running_cluster

log = logging.getLogger(__name__)


@dataclass
class Group:
    """The samples of one task started together (a GRPO group)."""

    group_id: str
    records: list[dict[str, Any]]

    @property
    def versions(self) -> list[int]:
        return sorted({v for r in self.records for v in r["policy_versions"]})

    @property
    def mixed(self) -> bool:
        return len(self.versions) > 1

    @property
    def rewards(self) -> list[float | None]:
        return [r["reward"] for r in self.records]


class GroupSource(JobSource):
    """Groups of `samples` jobs, task after task, round after round; a group starts only
    while fewer than `ahead` started groups wait for the trainer."""

    def __init__(self, tasks: list[str], samples: int, ahead: int) -> None:
        self.tasks, self.samples, self.ahead = tasks, samples, ahead
        self.started = self.taken = 0
        self.jobs: list[Job] = []
        self.stopped = False
        self.lock = threading.Lock()

    def take(self) -> Job | None:
        with self.lock:
            if self.stopped:
                return None
            if not self.jobs:
                if self.started - self.taken >= self.ahead:
                    return None
                group, task = self.started, self.tasks[self.started % len(self.tasks)]
                self.jobs = [Job(task, group * self.samples + i, group=group)
                             for i in reversed(range(self.samples))]
                self.started += 1
            return self.jobs.pop()

    def finished(self) -> bool:
        return self.stopped

    def consumed(self, groups: int) -> None:
        with self.lock:
            self.taken += groups

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            self.jobs = []


class Rollouts:
    """The fleet, the sessions and the run folder of one RL run (see the module docstring).

    `overrides` are the job's Hydra overrides (`+experiment=rl_loop`, `serving=kv_routed`, ...);
    `ahead`: groups that may wait for the trainer (default: the samples of two steps)."""

    def __init__(self, overrides: list[str] | DictConfig, groups_per_step: int = 4,
                 ahead: int | None = None, run_dir: Path | None = None) -> None:
        """`overrides`: Hydra overrides, or a config already composed (rollout.run's);
        `run_dir`: the run folder (default: output.dir)."""
        register_schemas()
        if isinstance(overrides, DictConfig):
            self.cfg, self.groups_cfg = overrides, validate(overrides)
        else:
            self.cfg, self.groups_cfg = compose("config", overrides, SCHEMAS)
        self.groups_per_step = groups_per_step
        self.ahead = ahead or 2 * groups_per_step
        self.run = RunDir((run_dir or Path(self.cfg.output.dir)).absolute())
        self._stack = contextlib.ExitStack()
        self._ready: queue.Queue[Group] = queue.Queue()
        self._partial: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self._failure: BaseException | None = None
        self.cluster: Any = None  # serving's running cluster

    # -- the fleet ------------------------------------------------------------------------------

    def __enter__(self) -> Rollouts:
        try:
            self._start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def _start(self) -> None:
        datasets.disable_progress_bars()
        g, cfg = self.groups_cfg, self.cfg
        rollout = g["rollout"]
        env = load(g["env"])
        self.run.path.mkdir(parents=True, exist_ok=True)
        self.run.config_file.parent.mkdir(parents=True, exist_ok=True)
        self.run.config_file.write_text(OmegaConf.to_yaml(cfg))
        self.cluster = self._stack.enter_context(
            running_cluster(g["serving"], g["model"], self.run.path, cache_dir(cfg.cache_dir)))
        endpoint = self.cluster.endpoint
        check_sampling(endpoint, rollout.sampling())
        ray.init(address="local", num_cpus=max(1, round(rollout.workers
                                                         * rollout.worker_num_cpus + 0.5)),
                 include_dashboard=False, logging_level=logging.WARNING,
                 configure_logging=False)
        self._stack.callback(ray.shutdown)
        self.board = remote_board(self.cluster.roster.policy_version)
        provenance = Provenance(self.run.path.name, g["model"].name, endpoint.model_dir,
                                config_hash(cfg), int(cfg.seed), "{}")
        worker_cls = remote_worker(-(-rollout.max_sessions // rollout.workers),
                                   rollout.worker_num_cpus, g["ray"].spread)
        sampling, limits = rollout.sampling(), rollout.limits()
        roster = self.cluster.roster
        admission = (FixedWindow(rollout.max_sessions) if rollout.admission == "fixed" else
                     KvBudget(roster.kv_states, rollout.samples_per_task, rollout.max_sessions,
                              rollout.kv_fill, rollout.session_tokens_guess))
        self.scheduler = Scheduler(
            lambda: worker_cls.remote(g["env"], endpoint, sampling, limits, int(cfg.seed),
                                      provenance, self.board),
            rollout.workers, admission, rollout.max_retries, provenance,
            rollout.retry_backoff_s, rollout.max_consecutive_infra, roster.names,
            g["output"].commit_s)
        self.sink = RecordSink(self.run.path, g["output"].shard_size)
        self.samples = rollout.samples_per_task
        self.source = GroupSource(sorted(env.tasks), self.samples, self.ahead)
        self._thread = threading.Thread(target=self._sample, name="rollouts", daemon=True)
        self._thread.start()
        self._stack.callback(self._finish)

    def _sample(self) -> None:
        try:
            self.scheduler.run(self.source, self._landed)
        except BaseException as exc:  # noqa: BLE001 - the trainer's next call raises it
            self._failure = exc
            self.source.stop()

    def _landed(self, records: list[dict[str, Any]]) -> None:
        self.sink.write(records)  # on disk before they count
        for record in records:
            group = self._partial[record["group_id"]]
            group.append(record)
            if len(group) == self.samples:
                del self._partial[record["group_id"]]
                self._ready.put(Group(record["group_id"],
                                      sorted(group, key=lambda r: r["sample_index"])))

    def _finish(self) -> None:
        """Stop starting groups, let the sessions in flight end, write the dataset."""
        self.source.stop()
        self._thread.join()
        dataset = self.sink.finalize()
        save_trainer_view(dataset, self.run.trainer)

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()

    # -- what a trainer calls -------------------------------------------------------------------

    def next_groups(self, n: int, timeout_s: float | None = None) -> list[Group]:
        """The next `n` finished groups (blocking until they are); each call lets `n` more
        groups start."""
        out = []
        while len(out) < n:
            if self._failure is not None:
                raise RuntimeError(f"sampling stopped: {self._failure}") from self._failure
            try:
                out.append(self._ready.get(timeout=1.0 if timeout_s is None else timeout_s))
            except queue.Empty:
                if timeout_s is not None:
                    raise TimeoutError(f"{len(out)} of {n} groups in {timeout_s} s") from None
        self.source.consumed(n)
        return out

    def update_weights(self, source: Path | dict[str, Any], version: int | None = None,
                       mode: str | None = None) -> dict[str, float]:
        """Every engine takes the new weights (a checkpoint folder, or name -> tensor) as the
        next policy version; `mode` (default rollout.update_mode): what turns in flight do.
        Returns the seconds each step took (pause_s, weights_s, invalidate_s, resume_s,
        total_s)."""
        assert self.cluster is not None, "use Rollouts as a context manager"
        return update_policy(self.cluster, self.board, source, version,
                             mode or self.groups_cfg["rollout"].update_mode)

    @property
    def policy_version(self) -> int:
        assert self.cluster is not None
        return self.cluster.roster.policy_version

    @property
    def model_dir(self) -> Path:
        assert self.cluster is not None
        return self.cluster.model_dir

