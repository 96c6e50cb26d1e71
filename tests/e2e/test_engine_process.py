"""The engine's process tree: its core is forked from the API server, not spawned afresh
(serving/engine/plugin.py, part 5: half the start time of a CPU engine)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests.procs import children, process_table

pytestmark = pytest.mark.e2e


def test_the_engine_core_is_forked_from_the_server(shared_engine):
    port = urlparse(shared_engine.base_url).port
    table = process_table()
    servers = [pid for pid, cmd in table.items()
               if "vllm.entrypoints.openai.api_server" in cmd and f"--port {port} " in f"{cmd} "]
    assert len(servers) == 1, servers
    server = servers[0]
    cores = [pid for pid in children(server) if table.get(pid) == "VLLM::EngineCore"]
    assert len(cores) == 1, {pid: table.get(pid) for pid in children(server)}
    # A forked core still shares the server's written pages (its imports) copy-on-write; a
    # spawned one imported everything itself and shares none (measured: 263 MB vs 0 kB).
    rollup = Path(f"/proc/{cores[0]}/smaps_rollup").read_text().splitlines()
    shared_dirty_kb = next(int(x.split()[1]) for x in rollup if x.startswith("Shared_Dirty:"))
    assert shared_dirty_kb > 50_000, rollup
