"""The rollout side of an RL loop, driven by a trainer in its own code.

    with Rollouts(["+experiment=rl_loop"]) as rollouts:
        for step in range(steps):
            groups = rollouts.next_groups(4)      # finished groups, as they complete
            weights = my_train_step(groups)       # name -> tensor, or a checkpoint folder
            rollouts.update_weights(weights)      # every engine, in place: the next version

The fleet (engines, the KV tier, Ray actors) starts once. Sampling goes on in the background
while the trainer trains: a new group starts only while fewer than `ahead` groups wait for the
trainer, and `rollout.max_policy_lag` bounds how many versions a session may outlive (it is
ended, or kept and marked stale). `max_off_policy_steps=k` bounds how old a group may be when the
trainer takes it: a group whose oldest token is more than k versions behind the served one is
never handed over; it is dropped, or dropped and its task sampled again (`stale_groups`), and
counted (`group_stats`). A group's records carry the version and the behaviour logprob of every
token; `mixed` says when they are not all one version. Records land in the run folder as in any
run.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
from omegaconf import DictConfig, OmegaConf

from envs import load
from rollfleet.cli import ConfigError, compose
from rollfleet.run_dir import RunDir
from rollout.config import SCHEMAS, STALE_GROUPS, register_schemas, validate
from rollout.fleet import Fleet, ServingCluster
from rollout.record import Job
from rollout.rl.policy_update import update_policy
from rollout.rl.trainer_view import save_trainer_view
from rollout.scheduler import JobSource

log = logging.getLogger(__name__)


@dataclass
class Group:
    """The samples of one task started together (a GRPO group)."""

    group_id: str
    records: list[dict[str, Any]]
    lag: int = 0  # versions between its oldest token and the served policy when handed over

    @property
    def task_id(self) -> str:
        return self.records[0]["task_id"]

    @property
    def versions(self) -> list[int]:
        return sorted({v for r in self.records for v in r["policy_versions"]})

    @property
    def oldest_version(self) -> int | None:
        """The version of its oldest token (None: no record sampled a token)."""
        versions = self.versions
        return versions[0] if versions else None

    @property
    def mixed(self) -> bool:
        return len(self.versions) > 1

    @property
    def rewards(self) -> list[float | None]:
        return [r["reward"] for r in self.records]


@dataclass
class GroupStats:
    """What became of the finished groups: handed to the trainer (by lag), or too old; and the
    long tail: the groups still sampling when a step's were handed over, which go on into the
    next steps (with rollout.update_mode=continue, a turn cut by the update keeps its tokens)."""

    handed: int = 0
    dropped: int = 0  # older than max_off_policy_steps when the trainer asked
    resampled: int = 0  # of those, tasks started again
    lags: Counter = field(default_factory=Counter)  # lag -> groups handed over with it
    carried: list[int] = field(default_factory=list)  # per next_groups: groups still sampling

    def as_dict(self) -> dict[str, Any]:
        return {"handed": self.handed, "dropped": self.dropped, "resampled": self.resampled,
                "lags": {str(k): v for k, v in sorted(self.lags.items())},
                "carried": list(self.carried)}


class GroupSource(JobSource):
    """Groups of `samples` jobs, task after task, round after round (a task sampled again goes
    first); a group starts only while fewer than `ahead` started groups wait for the
    trainer."""

    def __init__(self, tasks: list[str], samples: int, ahead: int) -> None:
        self.tasks, self.samples, self.ahead = tasks, samples, ahead
        self.started = self.taken = self.fresh = 0
        self.jobs: list[Job] = []
        self.again: list[str] = []
        self.stopped = False
        self.lock = threading.Lock()

    def take(self) -> Job | None:
        with self.lock:
            if self.stopped:
                return None
            if not self.jobs:
                if self.started - self.taken >= self.ahead:
                    return None
                if self.again:
                    task = self.again.pop(0)
                else:
                    task, self.fresh = self.tasks[self.fresh % len(self.tasks)], self.fresh + 1
                group = self.started
                self.jobs = [Job(task, group * self.samples + i, group=group)
                             for i in reversed(range(self.samples))]
                self.started += 1
            return self.jobs.pop()

    def resample(self, task: str) -> None:
        """Start a group of `task` again, before any new task."""
        with self.lock:
            self.again.append(task)

    def finished(self) -> bool:
        return self.stopped

    def in_flight(self, finished: int) -> int:
        """Groups started and still sampling, `finished` of the untaken ones being done."""
        with self.lock:
            return self.started - self.taken - finished

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
    `ahead`: groups that may wait for the trainer (default: the samples of two steps);
    `max_off_policy_steps`, `stale_groups`: the lag bound at hand-over and what becomes of an
    older group (default: rollout.max_off_policy_steps, rollout.stale_groups)."""

    def __init__(self, overrides: list[str] | DictConfig, groups_per_step: int = 4,
                 ahead: int | None = None, run_dir: Path | None = None,
                 max_off_policy_steps: int | None = None,
                 stale_groups: str | None = None) -> None:
        """`overrides`: Hydra overrides, or a config already composed (rollout.run's);
        `run_dir`: the run folder (default: output.dir)."""
        register_schemas()
        if isinstance(overrides, DictConfig):
            self.cfg, self.groups_cfg = overrides, validate(overrides)
        else:
            self.cfg, self.groups_cfg = compose("config", overrides, SCHEMAS)
        rollout = self.groups_cfg["rollout"]
        self.max_off_policy_steps = (rollout.max_off_policy_steps if max_off_policy_steps is None
                                     else max_off_policy_steps)
        self.stale_groups = stale_groups or rollout.stale_groups
        if self.max_off_policy_steps is not None and self.max_off_policy_steps < 0:
            raise ConfigError(f"max_off_policy_steps must be >= 0 or null, got "
                              f"{self.max_off_policy_steps}")
        if self.stale_groups not in STALE_GROUPS:
            raise ConfigError(f"stale_groups must be one of {STALE_GROUPS}, got "
                              f"{self.stale_groups!r}")
        self.group_stats = GroupStats()
        self.groups_per_step = groups_per_step
        self.ahead = ahead or 2 * groups_per_step
        self.run = RunDir((run_dir or Path(self.cfg.output.dir)).absolute())
        self._stack = contextlib.ExitStack()
        self._ready: queue.Queue[Group] = queue.Queue()
        self._partial: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self._failure: BaseException | None = None
        self.cluster: ServingCluster | None = None

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
        env = load(g["env"])
        self.run.path.mkdir(parents=True, exist_ok=True)
        self.run.config_file.parent.mkdir(parents=True, exist_ok=True)
        self.run.config_file.write_text(OmegaConf.to_yaml(cfg))
        fleet = self._stack.enter_context(Fleet(cfg, self.run.path, policy_board=True))
        self.cluster, self.board = fleet.cluster, fleet.board
        self.scheduler, self.sink = fleet.scheduler, fleet.sink
        self.samples = g["rollout"].samples_per_task
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
        """Stop starting groups, let the sessions in flight end, write the dataset. After an
        update that broke the fleet, no session can end: what landed is written, the rest is
        stopped with Ray and the engines."""
        self.source.stop()
        if self.cluster.broken:
            log.error("the fleet broke in an update (%s); sessions in flight are stopped",
                      self.cluster.broken)
        else:
            self._thread.join()
        dataset = self.sink.finalize()
        save_trainer_view(dataset, self.run.trainer)

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()

    # -- what a trainer calls -------------------------------------------------------------------

    def next_groups(self, n: int, timeout_s: float | None = None) -> list[Group]:
        """The next `n` finished groups no older than `max_off_policy_steps` (blocking until
        they are), the first to finish: up to `ahead` groups sample at once, so a step never
        waits for the slowest, which goes on into the next step (`group_stats.carried`); each
        group taken, or dropped as too old, lets one more start."""
        out = []
        while len(out) < n:
            if self._failure is not None:
                raise RuntimeError(f"sampling stopped: {self._failure}") from self._failure
            try:
                group = self._ready.get(timeout=1.0 if timeout_s is None else timeout_s)
            except queue.Empty:
                if timeout_s is not None:
                    raise TimeoutError(f"{len(out)} of {n} groups in {timeout_s} s") from None
                continue
            if self._hand_over(group):
                out.append(group)
            self.source.consumed(1)
        self.group_stats.carried.append(self.source.in_flight(self._ready.qsize()))
        return out

    def _hand_over(self, group: Group) -> bool:
        """Whether `group` may go to the trainer now; an older one is counted and dropped, or
        its task sampled again."""
        oldest = group.oldest_version
        group.lag = 0 if oldest is None else self.policy_version - oldest
        k, stats = self.max_off_policy_steps, self.group_stats
        if k is not None and group.lag > k:
            stats.dropped += 1
            if self.stale_groups == "resample":
                self.source.resample(group.task_id)
                stats.resampled += 1
            log.info("group %s is %d versions old (max_off_policy_steps=%d): %s", group.group_id,
                     group.lag, k, "sampled again" if self.stale_groups == "resample"
                     else "dropped")
            return False
        stats.handed += 1
        stats.lags[group.lag] += 1
        return True

    def update_weights(self, source: Path | dict[str, Any] | Any, version: int | None = None,
                       mode: str | None = None) -> dict[str, float]:
        """Every engine takes the new weights (a checkpoint folder, name -> tensor, or
        serving's `Transfer` from a trainer's ranks: rollout/rl/service.py) as the next policy
        version; `mode` (default rollout.update_mode): what turns in flight do. Returns the
        seconds each step took (pause_s, transfer_s, weights_s, invalidate_s, resume_s,
        total_s)."""
        assert self.cluster is not None, "use Rollouts as a context manager"
        configured = self.groups_cfg["rollout"].update_mode
        if mode == "continue" and configured != "continue":
            raise ConfigError("mode=continue needs sessions that go on after a cut: start "
                              "Rollouts with rollout.update_mode=continue")
        return update_policy(self.cluster, self.board, source, version, mode or configured)

    @property
    def policy_version(self) -> int:
        assert self.cluster is not None
        return self.cluster.roster.policy_version

    @property
    def model_dir(self) -> Path:
        assert self.cluster is not None
        return self.cluster.model_dir

