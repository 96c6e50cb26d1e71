"""The mocker topology: simulated engines (`python -m dynamo.mocker`) behind the real Dynamo
frontend, answering turns from a replay trace; loopback only, nothing left running."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from serving import ModelConfig, Sampling, ServingConfig, ServingError, open_front_door
from serving.cluster import Cluster
from serving.dynamo.mocker import trace_line, write_trace
from tests.procs import listening, new_job_processes, process_table

ROOT = Path(__file__).resolve().parents[3]


def _cluster_pids(cluster: Cluster) -> set[int]:
    topology = cluster.topology
    procs = [w.process for w in topology.workers] + [f.process for f in topology.frontends]
    procs += topology.plane.processes if topology.plane else []
    return {p.pid for p in procs if p is not None}


def test_mocker_replays_each_sessions_turns_on_loopback(tmp_path: Path):
    trace = tmp_path / "trace.jsonl"
    write_trace(trace, [trace_line("run:a/0:0", [11, 12, 13]), trace_line("run:a/0:0", [21]),
                        trace_line("run:b/0:0", [31, 32])])
    cfg = ServingConfig(mode="mocker", engines=2, speedup_ratio=100.0, replay_trace=str(trace))
    before = process_table()
    cluster = Cluster(cfg, ModelConfig(), tmp_path, ROOT / ".cache")
    with cluster as endpoint:
        assert endpoint.front_door == "dynamo_replay"
        assert sorted(e.name for e in cluster.roster.engines()) == ["agg0", "agg1"]
        addresses = listening(_cluster_pids(cluster))
        assert addresses and all(a.startswith("127.0.0.1:") for a in addresses), addresses

        async def turns() -> list[list[int]]:
            door = open_front_door(endpoint, cluster.roster.names())
            try:
                got = []
                for session in ("run:a/0:0", "run:a/0:0", "run:b/0:0", "run:a/0:0"):
                    gen = await door.generate([1, 2, 3, 4], Sampling(5), None, session)
                    assert gen.engine_id in ("agg0", "agg1")
                    got.append(gen.token_ids)
                await door.release("run:a/0:0")  # a new attempt starts again at turn 0
                got.append((await door.generate([1, 2], Sampling(5), None, "run:a/0:0")).token_ids)
                return got
            finally:
                await door.aclose()

        got = asyncio.run(turns())
    assert got[:3] == [[11, 12, 13], [21], [31, 32]]
    assert len(got[3]) == 5  # past the trace: the mocker samples max_tokens random ids
    assert got[4] == [11, 12, 13]
    assert new_job_processes(before) == []


def test_every_process_stops_when_the_block_raises(tmp_path: Path):
    before = process_table()
    with pytest.raises(RuntimeError, match="boom"), \
            Cluster(ServingConfig(mode="mocker", engines=1), ModelConfig(), tmp_path,
                    ROOT / ".cache") as endpoint:
        assert endpoint.front_door == "dynamo"  # no trace: nothing to annotate
        raise RuntimeError("boom")
    assert new_job_processes(before) == []


def test_a_missing_trace_is_refused_before_anything_starts(tmp_path: Path):
    before = process_table()
    cfg = ServingConfig(mode="mocker", replay_trace=str(tmp_path / "nope.jsonl"))
    with pytest.raises(ServingError, match="serving.replay_trace"), \
            Cluster(cfg, ModelConfig(), tmp_path, ROOT / ".cache"):
        pass
    assert new_job_processes(before) == []
