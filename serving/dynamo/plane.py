"""Where Dynamo's processes find each other and exchange events.

`file`: discovery in a folder, requests over TCP, events over ZMQ through a loopback broker;
nothing else runs, for one host. `etcd`: discovery in etcd and events over NATS, as a deployment
over several hosts uses; both are started on loopback unless their URLs are given.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import httpx

from rollfleet.run_dir import RunDir
from serving.config import ServingConfig
from serving.errors import ServingError
from serving.process import ManagedProcess, accepts, free_port, socket_folder, wait_until

DISCOVERY = ("file", "etcd")
# The plane's unix sockets (KV events) and its workers' temp files (vLLM's ZMQ sockets, ...):
# serving.process's socket_folder, short whatever the run folder's depth.
SOCKETS_ENV = "ROLLFLEET_SOCKETS"


def _etcd_healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


class ControlPlane:
    """Starts what the chosen discovery needs; `env()` points every Dynamo process at it."""

    def __init__(self, cfg: ServingConfig, run_dir: Path) -> None:
        if cfg.discovery not in DISCOVERY:
            raise ServingError(f"unknown serving.discovery {cfg.discovery!r}; "
                               f"expected one of {DISCOVERY}")
        self.cfg = cfg
        self.dir, self.discovery = RunDir(run_dir).dynamo, RunDir(run_dir).discovery
        self.processes: list[ManagedProcess] = []
        self._env: dict[str, str] = {}
        self.sockets: Path | None = None

    def start(self) -> None:
        host = self.cfg.host
        self.sockets = socket_folder("plane")
        common = {
            SOCKETS_ENV: str(self.sockets),
            "DYN_REQUEST_PLANE": "tcp",
            "DYN_TCP_RPC_HOST": host,
            "DYN_TCP_RESPONSE_STREAM_HOST": host,
            "DYN_EVENT_PLANE_HOST": host,
            "DYN_SYSTEM_HOST": host,
            "HOME": str(self.dir / "home"),  # Dynamo caches under ~/.cache
            # else every Dynamo process writes SGLang's logging config to a temp file it never
            # removes (dynamo.runtime.logging, 1.6.1); no SGLang runs here
            "DYN_SKIP_SGLANG_LOG_FORMATTING": "1",
        }
        if self.cfg.discovery == "file":
            xsub, xpub = free_port(host), free_port(host)
            self._spawn("event-broker", ["-m", "serving.dynamo.broker", str(xsub), str(xpub), host])
            if not wait_until(lambda: accepts(host, xpub), 10):
                raise ServingError(f"event broker did not start; see {self.dir}/event-broker.log")
            self._env = {**common, "DYN_DISCOVERY_BACKEND": "file",
                         "DYN_FILE_KV": str(self.discovery), "DYN_EVENT_PLANE": "zmq",
                         "DYN_ZMQ_BROKER_URL": f"xsub=tcp://{host}:{xsub} , xpub=tcp://{host}:{xpub}"}
            return
        etcd = self.cfg.etcd_url or self._start_etcd(host)
        nats = self.cfg.nats_url or self._start_nats(host)
        self._env = {**common, "DYN_DISCOVERY_BACKEND": "etcd", "ETCD_ENDPOINTS": etcd,
                     "NATS_SERVER": nats, "DYN_EVENT_PLANE": "nats"}

    def _spawn(self, name: str, args: list[str], exe: str | None = None) -> None:
        argv = [exe, *args] if exe else [sys.executable, *args]
        self.processes.append(ManagedProcess(name, argv, {"PATH": "/usr/bin:/bin"} if exe else
                                             _python_env(), self.dir / f"{name}.log"))

    def _start_etcd(self, host: str) -> str:
        exe = shutil.which("etcd") or "/usr/bin/etcd"
        if not Path(exe).exists():
            raise ServingError("serving.discovery=etcd needs etcd (apt-get install etcd-server, "
                               "which scripts/setup.sh does) or serving.etcd_url")
        client, peer = free_port(host), free_port(host)
        url = f"http://{host}:{client}"
        self._spawn("etcd", ["--name", "rollfleet", "--data-dir", str(self.dir / "etcd"),
                             "--listen-client-urls", url, "--advertise-client-urls", url,
                             "--listen-peer-urls", f"http://{host}:{peer}",
                             "--initial-advertise-peer-urls", f"http://{host}:{peer}",
                             "--initial-cluster", f"rollfleet=http://{host}:{peer}"], exe)
        if not wait_until(lambda: _etcd_healthy(url), 30):
            raise ServingError(f"etcd did not become healthy at {url}; see {self.dir}/etcd.log")
        return url

    def _start_nats(self, host: str) -> str:
        exe = shutil.which("nats-server") or "/usr/bin/nats-server"
        if not Path(exe).exists():
            raise ServingError("serving.discovery=etcd needs nats-server (apt-get install "
                               "nats-server, which scripts/setup.sh does) or serving.nats_url")
        port = free_port(host)
        self._spawn("nats", ["-a", host, "-p", str(port), "-js", "-sd", str(self.dir / "nats")],
                    exe)
        if not wait_until(lambda: accepts(host, port), 30):
            raise ServingError(f"nats-server did not start on {host}:{port}; "
                               f"see {self.dir}/nats.log")
        return f"nats://{host}:{port}"

    def env(self) -> dict[str, str]:
        return dict(self._env)

    def stop(self) -> None:
        while self.processes:
            self.processes.pop().stop(grace_s=5)
        if self.sockets is not None:
            shutil.rmtree(self.sockets, ignore_errors=True)
            self.sockets = None


def _python_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("DYN_")}
