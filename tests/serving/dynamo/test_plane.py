from pathlib import Path

import httpx
import pytest

from serving.config import ServingConfig
from serving.dynamo.plane import ControlPlane
from serving.errors import ServingError
from tests.procs import listening, new_job_processes, process_table


def test_file_plane_runs_only_a_loopback_broker(tmp_path: Path):
    before = process_table()
    plane = ControlPlane(ServingConfig(mode="kv_routed"), tmp_path)
    try:
        plane.start()
        env = plane.env()
        assert env["DYN_DISCOVERY_BACKEND"] == "file" and env["DYN_EVENT_PLANE"] == "zmq"
        assert env["DYN_ZMQ_BROKER_URL"].count("tcp://127.0.0.1:") == 2
        addresses = listening({p.pid for p in plane.processes})
        assert len(addresses) == 2 and all(a.startswith("127.0.0.1:") for a in addresses)
    finally:
        plane.stop()
    assert new_job_processes(before) == []


def test_etcd_plane_starts_etcd_and_nats_on_loopback(tmp_path: Path):
    before = process_table()
    plane = ControlPlane(ServingConfig(mode="kv_routed", discovery="etcd"), tmp_path)
    try:
        plane.start()
        env = plane.env()
        assert env["DYN_DISCOVERY_BACKEND"] == "etcd" and env["DYN_EVENT_PLANE"] == "nats"
        assert httpx.get(f"{env['ETCD_ENDPOINTS']}/health").json()["health"] == "true"
        assert env["NATS_SERVER"].startswith("nats://127.0.0.1:")
        addresses = listening({p.pid for p in plane.processes})
        assert addresses and all(a.startswith("127.0.0.1:") for a in addresses), addresses
    finally:
        plane.stop()
    assert new_job_processes(before) == []


def test_unknown_discovery_is_refused(tmp_path: Path):
    with pytest.raises(ServingError, match="serving.discovery"):
        ControlPlane(ServingConfig(discovery="consul"), tmp_path)
