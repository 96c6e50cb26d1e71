"""The serving cluster as one context manager: start everything, hand out an Endpoint, stop all.

Only the driver uses it (the job through `running_cluster`, `serving.serve`): it checks the
model folder, starts the host KV tier if asked, runs the configured topology
(serving/topologies), and keeps the live roster of its engines, which a restart updates.

A sweep's members may keep one cluster (`running_cluster(..., keep=True)`): Hydra's basic
launcher runs a multirun's members one after another in one process, and members with equal
serving and model settings need the same engines, so the first member starts them and the later
ones reuse them (a temperature sweep over a large model pays for its engines' start once). The
kept cluster is stopped when a member needs other settings, when a member fails (the next one
starts afresh), and when the process exits.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import logging
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from serving.checkpoints import (
    CheckpointStore,
    PolicyCheckpoint,
    PolicyUpdateError,
    Retention,
    digest_of,
    write_served,
)
from serving.config import ModelConfig, ServingConfig
from serving.endpoint import Endpoint, EngineSlot, Roster
from serving.errors import ServingError
from serving.kvtier import MooncakeTier
from serving.model_dir import engine_stop_ids, resolve_model_dir, tokenizer_markup_ids
from serving.policy import FleetBroken, Incoming, UpdateTimes, update_fleet
from serving.process import sweep_socket_folders
from serving.topologies import TOPOLOGIES, topology_class
from serving.topologies.base import Placement, Topology
from serving.weight_transfer import TIMEOUT_S as TRANSFER_TIMEOUT_S
from serving.weight_transfer import Rendezvous, Transfer

log = logging.getLogger(__name__)


class Cluster:
    """`with Cluster(...) as endpoint:` runs the configured servers for the block's duration;
    `cluster.roster` is who serves now."""

    def __init__(self, serving: ServingConfig, model: ModelConfig, run_dir: Path,
                 cache_dir: Path) -> None:
        if serving.mode not in TOPOLOGIES:
            raise ServingError(f"unknown serving.mode {serving.mode!r}; expected one of "
                               f"{tuple(TOPOLOGIES)}")
        self.serving = serving
        self.model = model
        # absolute, so that every process started (cwd or HOME elsewhere) finds the same files
        self.run_dir = run_dir.absolute()
        self.cache_dir = cache_dir.absolute()
        self.topology_cls: type[Topology] = topology_class(serving.mode)
        self.topology: Topology | None = None
        self.kv_tier: MooncakeTier | None = None
        self.roster = Roster()
        self.endpoint: Endpoint | None = None
        self.model_dir = Path()
        self._lock = threading.Lock()
        # the one owner of the served policy version: every engine, the tier's connectors and
        # every restarted worker are handed it from here
        self.served: PolicyCheckpoint | None = None
        self.checkpoints: CheckpointStore | None = None
        self.broken = ""  # why the fleet may not take new weights again (FleetBroken)

    def __enter__(self) -> Endpoint:
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    def _start(self) -> Endpoint:
        sweep_socket_folders()
        model_dir = self.model_dir = resolve_model_dir(self.model, self.cache_dir)
        markup = tokenizer_markup_ids(model_dir)
        self.served = PolicyCheckpoint(0, str(model_dir), _identity(model_dir, self.cache_dir))
        served_file = write_served(self.run_dir, self.served)
        tier = self._start_kv_tier()
        where = Placement(self.serving, self.model, model_dir, self.run_dir, self.cache_dir,
                          {**tier.extra_config(), "served_policy": str(served_file)}
                          if tier else None)
        self.topology = self.topology_cls(where, self.roster.replace, self.served)
        self.topology.check()
        started = self.topology.start()
        self.topology.declare_version()
        self.roster.fill(started.engines, started.router_metrics)
        self.endpoint = Endpoint(
            base_url=f"{started.root_url}/v1", model=self.model.name, model_dir=str(model_dir),
            front_door=self.topology.front_door, api_key=self.serving.api_key,
            enable_thinking=self.model.enable_thinking, max_model_len=self.model.max_model_len,
            request_timeout_s=self.serving.request_timeout_s, logprobs_mode=self.serving.logprobs,
            markup_token_ids=markup, stop_token_ids=engine_stop_ids(model_dir),
            routed_experts=self.serving.routed_experts)
        return self.endpoint

    def _start_kv_tier(self) -> MooncakeTier | None:
        """The host-DRAM KV tier (serving.kv_tier), up before any engine connects to it."""
        if self.serving.kv_tier == "none":
            return None
        if not self.topology_cls.takes_kv_tier:
            raise ServingError(f"serving.kv_tier={self.serving.kv_tier} needs engines this job "
                               f"starts; serving={self.serving.mode} has none")
        self.kv_tier = MooncakeTier(self.serving, self.run_dir)
        self.kv_tier.start()
        return self.kv_tier

    def restart_worker(self, name: str) -> EngineSlot:
        """Replace engine `name` by a fresh one (dead or alive); its new slot."""
        if self.topology is None:
            raise ServingError("the cluster is not running")
        self.topology.restart(name)
        return next(e for e in self.roster.engines() if e.name == name)

    def update_weights(self, source: Path | dict[str, Any] | Transfer,
                       version: int | None = None, mode: str = "wait") -> UpdateTimes:
        """New policy weights on every engine, in place (serving/policy.py): `source` is a
        checkpoint folder (safetensors), the tensors themselves (name -> tensor), or a
        `Transfer` from a trainer's ranks, checked against the served model before anything
        is written or loaded; tensors and folders are then kept in the run folder as
        serving.keep_checkpoints and serving.keep_every say (serving/checkpoints.py).
        `version` (default: the next) must be newer than the one served. No worker restarts
        while it runs."""
        topology = self.topology
        if topology is None or self.served is None:
            raise ServingError("the cluster is not running")
        with topology.lock:
            if self.broken:
                raise FleetBroken(f"the fleet takes no new weights after a failed update: "
                                  f"{self.broken}")
            current = self.served
            version = current.version + 1 if version is None else version
            if version <= current.version:
                raise PolicyUpdateError(f"version {version} is not newer than the served "
                                        f"version {current.version}")
            if self.checkpoints is None:
                self.checkpoints = CheckpointStore(self.run_dir, current, Retention(
                    self.serving.keep_checkpoints, self.serving.keep_every))
            store, controls = self.checkpoints, topology.controls()
            with contextlib.ExitStack() as stack:
                incoming = None
                if isinstance(source, Transfer):
                    checkpoint = store.from_transfer(source.plan.schema(), source.plan.digest,
                                                     version)
                    incoming = stack.enter_context(self._incoming(source, version,
                                                                  len(controls)))
                elif isinstance(source, dict):
                    checkpoint = store.from_tensors(source, version)
                else:
                    checkpoint = store.from_folder(Path(source), version)
                try:
                    times = update_fleet(controls, checkpoint, current, mode,
                                         lambda c: write_served(self.run_dir, c), incoming)
                except FleetBroken as exc:
                    self.broken = str(exc)
                    raise
                except PolicyUpdateError:
                    store.discard(checkpoint, current)
                    raise
            self.served = topology.served = checkpoint
            self.roster.policy_version = version
            store.retain(checkpoint)
            topology.after_update()
            log.info("policy version %s served (%s): %.2f s", checkpoint.label,
                     checkpoint.path, times.total_s)
            return times

    @contextlib.contextmanager
    def _incoming(self, transfer: Transfer, version: int, engines: int) -> Iterator[Incoming]:
        """Where this update's groups meet: a TCP store of the cluster's on serving.host, open
        while the update runs; the trainer's ranks are told through `transfer.ready`."""
        import torch.distributed as dist

        store = dist.TCPStore(self.serving.host, 0, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=TRANSFER_TIMEOUT_S))
        rendezvous = Rendezvous(self.serving.host, store.port,
                                f"v{version}-{uuid.uuid4().hex[:8]}", engines)
        try:
            yield Incoming(transfer.plan, rendezvous, lambda: transfer.ready(rendezvous))
        finally:
            del store

    def stop(self) -> None:
        with self._lock:
            topology, self.topology = self.topology, None
            tier, self.kv_tier = self.kv_tier, None
        if topology is not None:
            topology.stop()
        if tier is not None:  # after the engines, its clients
            log.info("stopping the KV tier")
            tier.stop()


def _identity(model_dir: Path, cache_dir: Path) -> str:
    """The served folder's digest ("" when it has no weights here, as an external server's
    tokenizer folder may not)."""
    try:
        return digest_of(model_dir, cache_dir)
    except PolicyUpdateError:
        return ""


class _KeptCluster:
    """At most one running cluster, handed to every block whose settings match it."""

    def __init__(self) -> None:
        self._key: tuple[ServingConfig, ModelConfig, Path] | None = None
        self._cluster: Cluster | None = None

    @contextlib.contextmanager
    def use(self, serving: ServingConfig, model: ModelConfig, run_dir: Path,
            cache_dir: Path) -> Iterator[Cluster]:
        key = (serving, model, cache_dir)
        if self._cluster is not None and key != self._key:
            log.info("other serving or model settings than the kept cluster's: stopping it")
            self.stop()
        if self._cluster is None:
            cluster = Cluster(serving, model, run_dir, cache_dir)
            cluster.__enter__()  # stops what it started if it fails
            self._cluster, self._key = cluster, key
        else:
            log.info("reusing the running serving cluster (its logs are in %s)",
                     self._cluster.run_dir)
        try:
            yield self._cluster
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        cluster, self._cluster, self._key = self._cluster, None, None
        if cluster is not None:
            cluster.stop()


KEPT = _KeptCluster()
atexit.register(KEPT.stop)


@contextlib.contextmanager
def running_cluster(serving: ServingConfig, model: ModelConfig, run_dir: Path, cache_dir: Path,
                    keep: bool = False) -> Iterator[Cluster]:
    """A cluster running for the block, stopped at its end on every exit path; with `keep`, left
    running for the next block with equal settings (see the module docstring)."""
    if keep:
        with KEPT.use(serving, model, run_dir, cache_dir) as cluster:
            yield cluster
        return
    cluster = Cluster(serving, model, run_dir, cache_dir)
    with cluster:
        yield cluster
