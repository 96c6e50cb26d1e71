"""Loaded only by the engine processes `scripts/probe_nixl_descriptors.py` starts (it puts this
folder first on their PYTHONPATH): logs what vLLM's NIXL connector hands NIXL per transfer.

Where ROLLFLEET_NIXL_PROBE names a JSONL file, NIXL's agent class is wrapped once `nixl._api`
is imported: every descriptor list a worker prepares (their addresses and lengths), every
transfer it makes from two such lists (the descriptor indices it hands NIXL), and the telemetry
vLLM reads when a transfer is done (the descriptors NIXL posted after merging). vLLM's connector
worker is wrapped to log its registered regions. Any other process is untouched.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys

LOG = os.environ.get("ROLLFLEET_NIXL_PROBE")
WORKER = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker"


def _write(record: dict) -> None:
    with open(LOG, "a") as f:  # noqa: PTH123 - one short append per record
        f.write(json.dumps({"pid": os.getpid(), **record}) + "\n")


def _wrap_agent(api) -> None:
    cls = api.nixl_agent
    if getattr(cls, "_rollfleet_probe", False):
        return
    cls._rollfleet_probe = True
    built: dict[int, tuple] = {}  # descriptor list id -> (the list, kept alive; its entries)
    dlists: dict[int, list[tuple[int, int]]] = {}  # prepared list id -> (address, length)
    handed: dict[int, dict] = {}  # transfer id -> what it was made of
    descs, prep = cls.get_xfer_descs, cls.prep_xfer_dlist
    make, telemetry = cls.make_prepped_xfer, cls.get_xfer_telemetry

    def entries(xfer_list) -> list[tuple[int, int]]:
        if id(xfer_list) in built:
            return built[id(xfer_list)][1]
        return [(int(a), int(n)) for a, n, *_ in xfer_list]

    def get_xfer_descs(self, xfer_list, *args, **kwargs):
        got = descs(self, xfer_list, *args, **kwargs)
        if got is not xfer_list:
            built[id(got)] = (got, entries(xfer_list))
        return got

    def prep_xfer_dlist(self, agent_name, xfer_list, *args, **kwargs):
        handle = prep(self, agent_name, xfer_list, *args, **kwargs)
        dlists[id(handle)] = entries(xfer_list)
        _write({"event": "dlist", "dlist": id(handle), "agent": str(agent_name),
                "entries": len(dlists[id(handle)])})
        return handle

    def make_prepped_xfer(self, operation, local, local_ids, remote, remote_ids, *args,
                          **kwargs):
        handle = make(self, operation, local, local_ids, remote, remote_ids, *args, **kwargs)
        handed[id(handle)] = {
            "operation": operation, "local_dlist": id(local), "remote_dlist": id(remote),
            "local_ids": [int(i) for i in local_ids], "remote_ids": [int(i) for i in remote_ids],
            "local": [dlists[id(local)][int(i)] for i in local_ids],
            "remote": [dlists[id(remote)][int(i)] for i in remote_ids]}
        return handle

    def get_xfer_telemetry(self, handle):
        got = telemetry(self, handle)
        made = handed.pop(id(handle), None)
        if made is not None:
            _write({"event": "transfer", **made, "posted": int(got.descCount),
                    "bytes": int(got.totalBytes), "post_us": int(got.postDuration),
                    "xfer_us": int(got.xferDuration)})
        return got

    cls.get_xfer_descs, cls.prep_xfer_dlist = get_xfer_descs, prep_xfer_dlist
    cls.make_prepped_xfer = make_prepped_xfer
    cls.get_xfer_telemetry = get_xfer_telemetry


def _wrap_worker(module) -> None:
    cls = module.NixlBaseConnectorWorker
    register = cls.register_kv_caches

    def register_kv_caches(self, kv_caches):
        register(self, kv_caches)
        _write({"event": "regions", "engine_id": str(self.engine_id),
                "regions": int(self.num_regions), "layers": len(kv_caches),
                "region_num_blocks": [int(n) for n in self.region_num_blocks],
                "block_len": [int(n) for n in self.block_len_per_layer],
                "block_stride": [int(n) for n in self.block_stride_per_layer],
                "block_size": int(self.block_size), "layout": str(self.kv_cache_layout)})

    cls.register_kv_caches = register_kv_caches


PATCHES = {"nixl_cu12._api": _wrap_agent, WORKER: _wrap_worker}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a patch right after one of PATCHES' modules is first executed."""

    def find_spec(self, name, path=None, target=None):
        if name not in PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module, execute=execute, patch=PATCHES[name]):
            execute(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


if LOG:
    sys.meta_path.insert(0, _AfterImport())
