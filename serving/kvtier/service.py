"""The tier's own processes: a Mooncake master, the store process that holds the DRAM, an event bus.

- `mooncake_master` on 127.0.0.1 (RPC and metrics ports) keeps the key -> replica map and
  evicts least-recently-used objects past 90% of capacity.
- `mooncake_client` (Mooncake's "real client") mounts `serving.kv_tier_gib` of host DRAM as
  the tier's only segment and serves engines, which connect to it as dummy clients (loopback RPC
  plus shared memory). The tier lives in this process, not in any engine, so it outlives engine
  restarts.
- a ZMQ XSUB/XPUB proxy on 127.0.0.1 (serving/dynamo/broker.py) that carries the engines'
  announcements of stored and vanished blocks (serving/engine/kvtier/connector.py).

Known exposure: Mooncake's transfer engine binds its P2P-handshake and TCP-transport listeners
to every interface (hard-coded in mooncake-transfer-engine 0.3.13's socket handshake plugin and
TCP transport; `MC_TCP_BIND_ADDRESS` only changes the advertised address). Engines open none of
them (dummy clients); the store process has those two, everything else is on 127.0.0.1.

A supervisor thread restarts the master or the store process if either dies while the run is
on (the tier then starts empty; engines reconnect by themselves). Meanwhile engines treat the
tier as down and recompute.
"""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path

from rollfleet.paths import ROOT
from rollfleet.run_dir import RunDir
from serving.config import ServingConfig
from serving.errors import ServingError
from serving.process import ManagedProcess, accepts, free_port, wait_until

log = logging.getLogger(__name__)

CONNECTOR = "MooncakeTierConnector"
CONNECTOR_MODULE = "serving.engine.kvtier.connector"


def _mooncake_bin(name: str) -> str:
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise ServingError(f"serving.kv_tier=mooncake needs {name} (pip install "
                           "mooncake-transfer-engine-non-cuda, as scripts/setup.sh does)")
    return str(path)


class MooncakeTier:
    """`start()` brings the tier up and returns once an engine could connect; `stop()` ends it."""

    def __init__(self, cfg: ServingConfig, run_dir: Path) -> None:
        if cfg.kv_tier_gib <= 0:
            raise ServingError(f"serving.kv_tier_gib must be > 0, got {cfg.kv_tier_gib}")
        self.cfg = cfg
        self.host = cfg.host
        self.dir = RunDir(run_dir).kvtier
        self.master_port = free_port(self.host)
        self.metrics_port = free_port(self.host)
        self.store_port = free_port(self.host)
        self.bus_ports = (free_port(self.host), free_port(self.host))
        self.master: ManagedProcess | None = None
        self.store: ManagedProcess | None = None
        self.bus: ManagedProcess | None = None
        self.restarts: list[str] = []
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None

    @property
    def store_addr(self) -> str:
        return f"{self.host}:{self.store_port}"

    def extra_config(self) -> dict:
        """`kv_connector_extra_config` for the engines' tier connector."""
        xsub, xpub = self.bus_ports
        return {"store": self.store_addr, "bus_xsub": f"tcp://{self.host}:{xsub}",
                "bus_xpub": f"tcp://{self.host}:{xpub}"}

    def master_argv(self) -> list[str]:
        return [_mooncake_bin("mooncake_master"), f"--rpc_address={self.host}",
                f"--rpc_port={self.master_port}", f"--metrics_host={self.host}",
                f"--metrics_port={self.metrics_port}", "--rpc_thread_num=2",
                "--enable_metric_reporting=false"]

    def store_argv(self) -> list[str]:
        mib = int(self.cfg.kv_tier_gib * 1024)
        return [_mooncake_bin("mooncake_client"), f"--host={self.host}",
                f"--port={self.store_port}",
                f"--master_server_address={self.host}:{self.master_port}",
                "--metadata_server=P2PHANDSHAKE", f"--global_segment_size={mib}MB",
                "--protocol=tcp", "--threads=2"]

    def _env(self) -> dict[str, str]:
        return {"PATH": "/usr/bin:/bin", "MC_TCP_BIND_ADDRESS": self.host}

    def _start_master(self) -> None:
        self.master = ManagedProcess("mooncake-master", self.master_argv(), self._env(),
                                     self.dir / "master.log")
        if not wait_until(lambda: accepts(self.host, self.master_port), 15, 0.1):
            raise ServingError(f"mooncake_master did not listen on {self.host}:"
                               f"{self.master_port}; see {self.dir}/master.log")

    def _start_store(self) -> None:
        self.store = ManagedProcess("mooncake-store", self.store_argv(), self._env(),
                                    self.dir / "store.log")
        if not wait_until(lambda: accepts(self.host, self.store_port), 30, 0.1):
            raise ServingError(f"the Mooncake store process did not serve {self.store_addr} "
                               f"within 30 s; see {self.dir}/store.log")

    def start(self) -> None:
        xsub, xpub = self.bus_ports
        self.bus = ManagedProcess("kvtier-bus", [sys.executable, "-m", "serving.dynamo.broker",
                                                 str(xsub), str(xpub), self.host],
                                  {"PATH": "/usr/bin:/bin", "PYTHONPATH": _root()},
                                  self.dir / "bus.log")
        self._start_master()
        self._start_store()
        if not wait_until(lambda: accepts(self.host, xpub), 10, 0.1):
            raise ServingError(f"the KV tier's event bus did not start; see {self.dir}/bus.log")
        log.info("KV tier: Mooncake master on %s:%d, store process on %s holding %.1f GiB",
                 self.host, self.master_port, self.store_addr, self.cfg.kv_tier_gib)
        self._supervisor = threading.Thread(target=self._supervise, name="kvtier-supervisor",
                                            daemon=True)
        self._supervisor.start()

    def _supervise(self) -> None:
        while not self._stopping.wait(1.0):
            for name, proc, start in (("master", self.master, self._start_master),
                                      ("store", self.store, self._start_store)):
                if proc is None or proc.alive() or self._stopping.is_set():
                    continue
                log.warning("KV tier: the Mooncake %s exited (code %s); restarting it (the "
                            "tier starts empty)", name, proc.proc.returncode)
                proc.stop(grace_s=1)
                self.restarts.append(name)
                try:
                    start()
                except ServingError as exc:
                    log.error("KV tier: %s", exc)

    def alive(self) -> bool:
        return all(p is not None and p.alive() for p in (self.master, self.store, self.bus))

    def stop(self) -> None:
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.join(timeout=10)
            self._supervisor = None
        for attr in ("store", "master", "bus"):
            proc = getattr(self, attr)
            if proc is not None:
                proc.stop(grace_s=5)
                setattr(self, attr, None)


def _root() -> str:
    return str(ROOT)


def kv_transfer_config(cfg: ServingConfig, role: str = "agg",
                       tier: dict | None = None) -> dict | None:
    """vLLM's `--kv-transfer-config` for one engine: NIXL for a disaggregated role, the tier
    connector when `tier` (its `extra_config()`) is given, both through vLLM's MultiConnector
    when both apply (NIXL first, so a decode worker takes its prefill's KV from NIXL and any
    other prefix from the tier; prefill workers load from the tier and both sides save to it).
    """
    nixl = None
    if role != "agg":
        nixl = {"kv_connector": "NixlConnector",
                "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
                "kv_buffer_device": "cpu" if cfg.device == "cpu" else "cuda"}
    if tier is None:
        return nixl
    own = {"kv_connector": CONNECTOR, "kv_connector_module_path": CONNECTOR_MODULE,
           "kv_role": "kv_both", "kv_connector_extra_config": dict(tier)}
    if nixl is None:
        return {**own, "kv_load_failure_policy": "recompute"}
    return {"kv_connector": "MultiConnector", "kv_role": nixl["kv_role"],
            "kv_buffer_device": nixl["kv_buffer_device"], "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"connectors": [nixl, own]}}
