"""The engine's process tree: its core is forked from the API server, not spawned afresh
(serving/engine/plugin.py, part 5: half the start time of a CPU engine); its sockets live in a
folder of its own."""

from __future__ import annotations

import tempfile
from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests.procs import children, process_table, unix_socket_paths

pytestmark = pytest.mark.e2e


def _server(endpoint) -> int:
    port = urlparse(endpoint.base_url).port
    servers = [pid for pid, cmd in process_table().items()
               if "vllm.entrypoints.openai.api_server" in cmd and f"--port {port} " in f"{cmd} "]
    assert len(servers) == 1, servers
    return servers[0]


def test_the_engine_core_is_forked_from_the_server(shared_engine):
    server = _server(shared_engine)
    table = process_table()
    cores = [pid for pid in children(server) if table.get(pid) == "VLLM::EngineCore"]
    assert len(cores) == 1, {pid: table.get(pid) for pid in children(server)}
    # A forked core still shares the server's written pages (its imports) copy-on-write; a
    # spawned one imported everything itself and shares none (measured: 263 MB vs 0 kB).
    rollup = Path(f"/proc/{cores[0]}/smaps_rollup").read_text().splitlines()
    shared_dirty_kb = next(int(x.split()[1]) for x in rollup if x.startswith("Shared_Dirty:"))
    assert shared_dirty_kb > 50_000, rollup


def test_the_engine_s_zmq_sockets_are_in_its_own_folder(shared_engine):
    """Not in the system temp folder, where vLLM's default left 3 socket files per engine
    start for good (the folder goes when the engine stops: tests/e2e/test_swe_rl.py)."""
    server = _server(shared_engine)
    paths = unix_socket_paths([server, *children(server)])
    assert paths, "the engine holds no unix socket: vLLM no longer talks to its core over ZMQ?"
    folders = {str(Path(p).parent) for p in paths}
    assert len(folders) == 1, paths
    [folder] = folders
    assert Path(folder).parent == Path(tempfile.gettempdir()), folder
    assert Path(folder).name.startswith("rollfleet-vllm-"), folder
