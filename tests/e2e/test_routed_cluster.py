"""One kv_routed cluster with two engines, two frontends and the Mooncake KV tier, started once
for the tests of how it routes: session bindings shared between frontends, and a session's
later turn served by another engine from the tier. Real vLLM workers, Dynamo and Mooncake."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from serving import ModelConfig, ServingConfig
from serving.cluster import Cluster
from tests.e2e.frontend_calls import cached, complete, served_by, tier_hits
from tests.procs import new_job_processes, process_table

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e

ROUTER_VIEW = """
import asyncio, json, sys
from dynamo.llm import KvRouter, KvRouterConfig
from dynamo.runtime import DistributedRuntime

async def main():
    runtime = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp", event_plane="zmq")
    router = KvRouter(runtime.endpoint("dynamo.backend.generate"), int(sys.argv[1]),
                      KvRouterConfig())
    tokens = json.loads(sys.stdin.read())
    for _ in range(40):  # the router replays the workers' events as it starts
        scores = await router.get_overlap_scores(tokens)
        held = [w.get("host_pinned_blocks", 0) for w in scores.get("workers", [])]
        if len(held) == int(sys.argv[2]) and min(held) >= int(sys.argv[3]):
            break
        await asyncio.sleep(0.5)
    print(json.dumps(scores))
    runtime.shutdown()

asyncio.run(main())
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    before = process_table()
    cfg = ServingConfig(mode="kv_routed", engines=2, frontends=2, kv_tier="mooncake",
                        kv_tier_gib=0.5)
    cluster = Cluster(cfg, ModelConfig(max_model_len=4096), tmp_path_factory.mktemp("routed"),
                      ROOT / ".cache")
    with cluster:
        yield cluster
    time.sleep(1)
    assert new_job_processes(before) == []


def _bind(url: str, session: str, prompt: list[int], max_tokens: int) -> str:
    status, body = complete(url, prompt, max_tokens, session=session)
    assert status == 200, (status, body)
    return served_by(body)[1]


def _pinned(url: str, prompt: list[int], worker: str) -> dict:
    status, body = complete(url, prompt, 4, worker=worker)
    assert status == 200, (status, body)
    assert served_by(body)[1] == worker
    return body


def test_session_bindings_are_shared_between_frontends(cluster):
    """Sessions bound through one frontend keep their engine through another, even for a
    prompt that shares nothing with what that engine holds."""
    rng = random.Random(0)
    first, second = (f.base_url for f in cluster.topology.frontends)
    sessions = [f"s{i}" for i in range(8)]
    with ThreadPoolExecutor(8) as pool:  # concurrent, so load spreads them over both engines
        bound = list(pool.map(lambda s: _bind(
            first, s, [rng.randrange(100, 8000) for _ in range(300)], 48), sessions))
    names = cluster.roster.names()
    assert {names[b] for b in bound} == {"agg0", "agg1"}, bound
    later = [_bind(second, s, [rng.randrange(100, 8000) for _ in range(300)], 1)
             for s in sessions]
    assert later == bound


def test_another_engine_serves_a_later_turn_from_the_tier(cluster):
    rng = random.Random(1)
    url = cluster.topology.frontends[0].base_url
    first, second = cluster.topology.workers
    turn1 = [rng.randrange(100, 8000) for _ in range(1000)]
    assert cached(_pinned(url, turn1, first.instance_id)) == 0
    time.sleep(2)  # the background put finishes; its announcement reaches both engines
    hits_before = tier_hits(second.metrics_url)
    turn2 = turn1 + [rng.randrange(100, 8000) for _ in range(300)]
    body = _pinned(url, turn2, second.instance_id)  # the session moves to the other engine
    assert cached(body) >= 7 * 128  # turn 1's 7 full blocks, loaded from the tier
    assert tier_hits(second.metrics_url) - hits_before >= 7 * 128
    # An engine files the tier's announcements with its next step's KV events (vLLM collects
    # connector events only when it steps): the first engine, idle since turn 1, takes one
    # short request, and Dynamo's router then holds the tier's blocks under each worker's
    # host tier.
    _pinned(url, [rng.randrange(100, 8000) for _ in range(8)], first.instance_id)
    view = subprocess.run([sys.executable, "-c", ROUTER_VIEW, "128", "2", "7"],
                          input=json.dumps(turn2), capture_output=True, text=True, timeout=120,
                          env={**os.environ, **cluster.topology.plane.env()})
    assert view.returncode == 0, view.stderr[-2000:]
    scores = json.loads(view.stdout.strip().splitlines()[-1])
    host = {w["worker_id"]: w.get("host_pinned_blocks", 0) for w in scores["workers"]}
    assert len(host) == 2 and all(n >= 7 for n in host.values()), scores
