"""An engine's handle on the Mooncake tier: lookups, loads and saves that never fail a request.

The engine is a Mooncake *dummy client* of the tier's store process (`mooncake_client`): calls go
to it over loopback RPC and the bytes through shared memory, so the engine opens no listening
socket of its own and holds no part of the tier (the tier outlives engine restarts). Staging
rows for block objects come from that shared-memory pool.

Mooncake's traps, measured here (mooncake-transfer-engine-non-cuda 0.3.13.post1), and what this
client does about them:
- `get` of a missing key returns empty bytes: only `batch_get_into` is used, and a block counts
  as loaded only when the call returns exactly the object's size (-704 is "no such key").
- `put` of an existing key returns 0 and keeps the old value: keys are content hashes (the
  block-hash chain) under a geometry namespace, so the old value is the same bytes.
- a read holds a 10 s lease that blocks removal (-706): the tier never removes; the master's
  LRU eviction makes room.
- a dead master: lookups fail at once (-1), loads with -900, the first put after the death can
  take ~4 s. A failed call marks the tier down for `retry_s`: lookups answer "miss", saves are
  dropped, loads are reported failed so vLLM recomputes those blocks. Puts run on a background
  thread, so no call can stall a forward pass.

Every stored and every vanished block is announced on the tier's event bus (ZMQ through a
loopback XSUB/XPUB proxy): each engine's connector turns the announcements into KV events for
NVIDIA Dynamo's router (serving/engine/kvtier/connector.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from serving.engine.kvtier.blocks import BlockLayout

log = logging.getLogger("vllm.rollfleet.kvtier")  # vLLM configures its own loggers only

NOT_FOUND = -704
RPC_FAIL = -900
NO_SPACE = -200
TOPIC = b"kvtier"
_NOBLOCK = 1  # zmq.NOBLOCK


@dataclass
class TierStats:
    lookups: int = 0
    lookup_hit_blocks: int = 0
    loaded_blocks: int = 0
    load_failed_blocks: int = 0
    saved_blocks: int = 0
    save_failed_blocks: int = 0
    dropped_saves: int = 0
    down_events: int = 0

    def line(self) -> str:
        return " ".join(f"{k}={v}" for k, v in vars(self).items())


@dataclass
class Saved:
    """One block to store: its engine block id, key, and what the router needs to know it."""

    block_id: int
    key: str
    block_hash: bytes
    parent_hash: bytes | None
    token_ids: list[int] = field(default_factory=list)


class Bus:
    """Announcements of tier contents between engines (publish side and listening side)."""

    def __init__(self, xsub: str | None, xpub: str | None, listen: bool) -> None:
        self._lock = threading.Lock()
        self._pub = self._sub = None
        if not xsub:
            return
        import zmq

        ctx = zmq.Context.instance()
        self._pub = ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.connect(xsub)
        if listen and xpub:
            self._sub = ctx.socket(zmq.SUB)
            self._sub.setsockopt(zmq.LINGER, 0)
            self._sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
            self._sub.connect(xpub)

    def publish(self, op: str, ns: str, blocks: list[dict[str, Any]]) -> None:
        if self._pub is None or not blocks:
            return
        body = json.dumps({"op": op, "ns": ns, "blocks": blocks}).encode()
        with self._lock:
            try:
                self._pub.send_multipart([TOPIC, body], flags=_NOBLOCK)  # never stall the engine
            except Exception as exc:  # noqa: BLE001 - announcements are best effort
                log.debug("tier bus publish failed: %s", exc)

    def drain(self, limit: int = 10000) -> list[dict[str, Any]]:
        """Announcements received since the last call (never blocks)."""
        out: list[dict[str, Any]] = []
        if self._sub is None:
            return out
        import zmq

        while len(out) < limit:
            try:
                _, body = self._sub.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                out.append(json.loads(body))
            except ValueError:
                continue
        return out


class TierClient:
    """One per engine process (scheduler and worker sides share it)."""

    _shared: dict[str, TierClient] = {}
    _shared_lock = threading.Lock()

    @classmethod
    def shared(cls, store: str, bus_xsub: str | None, bus_xpub: str | None,
               staging_bytes: int, retry_s: float) -> TierClient:
        with cls._shared_lock:
            client = cls._shared.get(store)
            if client is None:
                client = cls._shared[store] = cls(store, bus_xsub, bus_xpub, staging_bytes,
                                                  retry_s)
            return client

    def __init__(self, store: str, bus_xsub: str | None, bus_xpub: str | None,
                 staging_bytes: int, retry_s: float) -> None:
        self.store_addr = store
        self.staging_bytes = staging_bytes
        self.retry_s = retry_s
        self.stats = TierStats()
        self.bus = Bus(bus_xsub, bus_xpub, listen=True)
        self._store = None
        self._lock = threading.Lock()
        self._down_until = 0.0
        self._connect_after = 0.0
        self._layout: BlockLayout | None = None
        self._load_rows: torch.Tensor | None = None
        self._free_slabs: queue.Queue[tuple[int, torch.Tensor]] = queue.Queue()
        self._puts: queue.Queue[tuple[int, torch.Tensor, str, list[Saved]] | None] = \
            queue.Queue()
        self._put_thread: threading.Thread | None = None
        self._last_stats = time.monotonic()

    # -- connection and health ---------------------------------------------------------------

    def _connected(self):
        """The Mooncake store handle, connecting on first use (and retrying after failures)."""
        if self._store is not None:
            return self._store
        with self._lock:
            if self._store is not None or time.monotonic() < self._connect_after:
                return self._store
            try:
                from mooncake.store import MooncakeDistributedStore

                store = MooncakeDistributedStore()
                rc = store.setup_dummy(self.staging_bytes + (16 << 20), 0, self.store_addr)
            except Exception as exc:  # noqa: BLE001 - no tier is a miss, not an error
                rc, store = f"{type(exc).__name__}: {exc}", None
            if rc != 0:
                log.error("KV tier: cannot reach the Mooncake store at %s (%s); running "
                          "without it for %.0f s", self.store_addr, rc, self.retry_s)
                self._connect_after = time.monotonic() + self.retry_s
                return None
            self._store = store
            log.info("KV tier: connected to the Mooncake store at %s", self.store_addr)
            return store

    def usable(self) -> bool:
        return time.monotonic() >= self._down_until and self._connected() is not None

    def _down(self, what: str, code: Any) -> None:
        if time.monotonic() >= self._down_until:
            self.stats.down_events += 1
            log.warning("KV tier: %s failed (%s); treating the tier as down for %.0f s "
                        "(lookups miss, saves are dropped, requests recompute)",
                        what, code, self.retry_s)
        self._down_until = time.monotonic() + self.retry_s

    def _maybe_log_stats(self) -> None:
        now = time.monotonic()
        if now - self._last_stats >= 30:
            self._last_stats = now
            log.info("KV tier stats: %s", self.stats.line())

    # -- scheduler side ----------------------------------------------------------------------

    def hits(self, keys: list[str]) -> int:
        """How many of `keys`, from the first, the tier holds (0 when it is down)."""
        if not keys or not self.usable():
            return 0
        self.stats.lookups += 1
        try:
            found = self._store.batch_is_exist(keys)
        except Exception as exc:  # noqa: BLE001
            self._down("lookup", exc)
            return 0
        n = 0
        for flag in found:
            if flag < 0:
                self._down("lookup", flag)
                return 0
            if flag != 1:
                break
            n += 1
        self.stats.lookup_hit_blocks += n
        self._maybe_log_stats()
        return n

    # -- worker side -------------------------------------------------------------------------

    def attach(self, layout: BlockLayout) -> bool:
        """Staging rows for this engine's block objects, from the shared-memory pool: one
        area for loads and four for saves in flight. False when the tier is unreachable."""
        store = self._connected()
        if store is None:
            return False
        size = layout.object_bytes
        rows = max(1, self.staging_bytes // (5 * size))
        areas = []
        for _ in range(5):
            ptr = store.alloc_from_mem_pool(rows * size)
            if not ptr or store.register_buffer(ptr, rows * size) != 0:
                log.error("KV tier: no shared-memory staging for %d blocks of %d bytes; "
                          "running without the tier", rows, size)
                return False
            buf = (ctypes.c_uint8 * (rows * size)).from_address(ptr)
            areas.append((ptr, torch.frombuffer(buf, dtype=torch.uint8).view(rows, size)))
        self._layout = layout
        self._load_ptr, self._load_rows = areas[0]
        for area in areas[1:]:
            self._free_slabs.put(area)
        self._put_thread = threading.Thread(target=self._put_loop, name="kvtier-put",
                                            daemon=True)
        self._put_thread.start()
        log.info("KV tier: block objects of %d bytes (%d planes), staging %d blocks x 5",
                 size, len(layout.planes), rows)
        return True

    def load(self, keys: list[str], block_ids: list[int]) -> int:
        """Load `keys` into engine blocks `block_ids`, in order; returns how many loaded (the
        rest must be recomputed). Never raises."""
        layout, rows = self._layout, self._load_rows
        if layout is None or rows is None or not self.usable():
            self.stats.load_failed_blocks += len(keys)
            return 0
        size, cap, done = layout.object_bytes, rows.shape[0], 0
        while done < len(keys):
            part = keys[done:done + cap]
            try:
                got = self._store.batch_get_into(
                    part, [self._load_ptr + i * size for i in range(len(part))],
                    [size] * len(part))
            except Exception as exc:  # noqa: BLE001
                got = [RPC_FAIL] * len(part)
                log.warning("KV tier: load raised %s", exc)
            good = 0
            for code in got:
                if code != size:
                    break
                good += 1
            if good:
                layout.scatter(rows, block_ids[done:done + good])
            done += good
            if good < len(part):
                code = got[good]
                if code == NOT_FOUND:
                    self.vanished([part[good]])
                elif code < 0:
                    self._down("load", code)
                break
        self.stats.loaded_blocks += done
        self.stats.load_failed_blocks += len(keys) - done
        return done

    def save(self, ns: str, blocks: list[Saved]) -> None:
        """Copy the blocks into staging now (the engine may reuse them after this step) and
        store them in the background; dropped when the tier is down or behind."""
        layout = self._layout
        if layout is None or not blocks:
            return
        if not self.usable():
            self.stats.dropped_saves += len(blocks)
            return
        while blocks:
            try:
                ptr, rows = self._free_slabs.get_nowait()
            except queue.Empty:
                self.stats.dropped_saves += len(blocks)
                return
            part, blocks = blocks[:rows.shape[0]], blocks[rows.shape[0]:]
            layout.gather([b.block_id for b in part], rows)
            self._puts.put((ptr, rows, ns, part))

    def _put_loop(self) -> None:
        while True:
            job = self._puts.get()
            if job is None:
                return
            ptr, rows, ns, part = job
            try:
                self._put(ptr, ns, part)
            finally:
                self._free_slabs.put((ptr, rows))

    def _put(self, ptr: int, ns: str, part: list[Saved]) -> None:
        size = self._layout.object_bytes
        if not self.usable():
            self.stats.dropped_saves += len(part)
            return
        try:
            codes = self._store.batch_put_from([b.key for b in part],
                                               [ptr + i * size for i in range(len(part))],
                                               [size] * len(part))
        except Exception as exc:  # noqa: BLE001
            codes = [RPC_FAIL] * len(part)
            log.warning("KV tier: put raised %s", exc)
        stored = [b for b, code in zip(part, codes, strict=True) if code == 0]
        failed = [code for code in codes if code != 0]
        self.stats.saved_blocks += len(stored)
        self.stats.save_failed_blocks += len(failed)
        if any(code < 0 and code != NO_SPACE for code in failed):
            self._down("put", failed[0])
        self.bus.publish("stored", ns, [
            {"h": b.block_hash.hex(), "p": b.parent_hash.hex() if b.parent_hash else None,
             "t": b.token_ids} for b in stored])

    def vanished(self, keys: list[str]) -> None:
        """Announce that the tier no longer holds these keys (evicted, or lost with a master)."""
        by_ns: dict[str, list[dict[str, Any]]] = {}
        for key in keys:
            ns, _, digest = key.rpartition("/")
            by_ns.setdefault(ns, []).append({"h": digest})
        for ns, blocks in by_ns.items():
            self.bus.publish("removed", ns, blocks)

    def close(self) -> None:
        if self._put_thread is not None:
            self._puts.put(None)
            self._put_thread.join(timeout=10)
            self._put_thread = None
        if self._store is not None:
            log.info("KV tier stats: %s", self.stats.line())
            with contextlib.suppress(Exception):  # the engine is going away anyway
                self._store.close()
            self._store = None
