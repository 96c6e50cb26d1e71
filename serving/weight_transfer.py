"""New weights from a trainer's ranks straight to the engines, over torch.distributed: no file
in between, each rank sending what it holds.

A trainer rank holds, of each tensor of the served checkpoint, a run of rows along dim 0 (FSDP's
`Shard(0)` layout; a rank that gathered everything holds all the rows, a data-parallel rank
may send only its share). Each rank describes its rows (`describe`), the service joins the
descriptions into one `TransferPlan`, which says which rank sends which rows, and with what
sha256. Per update there is one gloo group per trainer rank, that rank at index 0 and every
engine after it, met through a TCP store the service opens (`Rendezvous`); each rank broadcasts
its rows on its own group, the engines receive every group's rows into one full tensor each,
in the plan's order, and check every run of rows against its sha256 before anything is loaded.

The plan's digest (sha256 over its names, dtypes, shapes and the rows' sha256) is the
version's identity, as a checkpoint folder's file digest is for weights that came as files:
the same bytes sent the same way give the same digest, and a trainer recomputes it from the
weights it kept (`describe` over them, one rank).

Only torch here: the trainer imports it, and so does the engines' side
(serving/engine/weight_transfer.py), which runs it inside vLLM.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from serving.checkpoints import SAFETENSORS_DTYPES, PolicyUpdateError

BACKEND = "rollfleet_ranks"  # the weight-transfer engine's name in vLLM's registry
TIMEOUT_S = 300.0  # a group's meeting and each broadcast, before the update fails

DTYPES = {s: getattr(torch, t) for s, t in SAFETENSORS_DTYPES.items()}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


class TransferError(PolicyUpdateError):
    """A transfer that did not happen as planned (a plan that does not add up, a rank that
    never came, rows whose sha256 is not the plan's); nothing was loaded."""


@dataclass(frozen=True)
class Rows:
    """A run of rows [start, start + count) of one tensor, sent by trainer rank `rank`."""

    rank: int
    start: int
    count: int
    sha256: str


@dataclass(frozen=True)
class TensorPlan:
    name: str
    dtype: str  # safetensors' name: BF16, F32, ...
    shape: tuple[int, ...]
    rows: tuple[Rows, ...]  # in order of start


@dataclass(frozen=True)
class TransferPlan:
    """What every engine receives, and from which rank, in order."""

    tensors: tuple[TensorPlan, ...]
    sources: int  # trainer ranks, each with its own group

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.as_dict()["tensors"]).encode()).hexdigest()

    @property
    def nbytes(self) -> int:
        return sum(_numel(t.shape) * _itemsize(t.dtype) for t in self.tensors)

    def as_dict(self) -> dict:
        return {"tensors": [[t.name, t.dtype, list(t.shape),
                             [[r.rank, r.start, r.count, r.sha256] for r in t.rows]]
                            for t in self.tensors], "sources": self.sources}

    @classmethod
    def from_dict(cls, d: Mapping) -> TransferPlan:
        return cls(tuple(TensorPlan(name, dtype, tuple(shape),
                                    tuple(Rows(*r) for r in rows))
                         for name, dtype, shape, rows in d["tensors"]), int(d["sources"]))

    def schema(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """name -> (dtype, shape), as serving/checkpoints.py checks a checkpoint."""
        return {t.name: (t.dtype, t.shape) for t in self.tensors}


@dataclass(frozen=True)
class Rendezvous:
    """Where one update's groups meet: the service's TCP store, under a key of its own."""

    host: str
    port: int
    key: str  # one per update: a group never meets an earlier update's members
    engines: int  # receiving ranks, each engine's `engine_rank` one of range(engines)
    timeout_s: float = TIMEOUT_S

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Transfer:
    """New weights a trainer's ranks send, as the cluster takes them (`Cluster.update_weights`):
    their plan, and whom to tell where to send once the engines wait for them."""

    plan: TransferPlan
    ready: Callable[[Rendezvous], None]

    @classmethod
    def from_parts(cls, parts: list[list[TensorPlan]],
                   ready: Callable[[Rendezvous], None]) -> Transfer:
        """From every rank's description (`parts[r]`: rank r's, from `WeightSender.describe`)."""
        return cls(join_plan(parts), ready)


class WeightSender:
    """A trainer rank's end: what it sends, described, then sent."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world

    def rows(self, tensors: Mapping[str, torch.Tensor]
             ) -> dict[str, tuple[torch.Tensor, tuple[int, ...], int]]:
        """This rank's even share of whole tensors (`iter_rows`)."""
        return dict(iter_rows(tensors, self.rank, self.world))

    def describe(self, held: Mapping[str, tuple[torch.Tensor, tuple[int, ...], int]]
                 ) -> list[TensorPlan]:
        return describe(self.rank, held)

    def send(self, rendezvous: Mapping, plan: Mapping,
             held: Mapping[str, tuple[torch.Tensor, tuple[int, ...], int]]) -> int:
        """The rows, once the service says where (its `Rendezvous` and `TransferPlan`, as
        dicts); bytes sent."""
        return send(Rendezvous(**rendezvous), TransferPlan.from_dict(plan), self.rank, held)


# -- the trainer's side ---------------------------------------------------------------------------

def describe(rank: int, held: Mapping[str, tuple[torch.Tensor, tuple[int, ...], int]]
             ) -> list[TensorPlan]:
    """What rank `rank` sends: for each name, its rows (a tensor), the full tensor's shape and
    the first row's index in it. A tensor of no dimension is sent whole by one rank."""
    out = []
    for name, (rows, shape, start) in held.items():
        rows = rows.detach()
        if rows.dtype not in DTYPE_NAMES:
            raise TransferError(f"tensor {name}: dtype {rows.dtype} cannot be sent")
        count = rows.shape[0] if rows.dim() else 1
        if tuple(rows.shape[1:]) != tuple(shape[1:]) or start < 0 or \
                (shape and start + count > shape[0]):
            raise TransferError(f"tensor {name}: rows {list(rows.shape)} from {start} do not "
                                f"fit its shape {list(shape)}")
        out.append(TensorPlan(name, DTYPE_NAMES[rows.dtype], tuple(shape),
                              (Rows(rank, start, count, _sha256(rows)),)))
    return out


def join_plan(parts: list[list[TensorPlan]]) -> TransferPlan:
    """The plan from every rank's description (`parts[r]` is rank r's): each tensor's rows
    must cover it exactly once, with one dtype and shape on every rank."""
    tensors: dict[str, list[TensorPlan]] = {}
    for part in parts:
        for t in part:
            tensors.setdefault(t.name, []).append(t)
    out = []
    for name in sorted(tensors):
        pieces = tensors[name]
        if len({(p.dtype, p.shape) for p in pieces}) > 1:
            raise TransferError(f"tensor {name}: ranks disagree on its dtype or shape: "
                                f"{sorted({(p.dtype, p.shape) for p in pieces})}")
        rows = sorted((r for p in pieces for r in p.rows), key=lambda r: r.start)
        total = pieces[0].shape[0] if pieces[0].shape else 1
        at = 0
        for r in rows:
            if r.start != at:
                raise TransferError(f"tensor {name}: rows {at}..{r.start} "
                                    f"{'sent twice' if r.start < at else 'sent by no rank'}")
            at += r.count
        if at != total:
            raise TransferError(f"tensor {name}: rows {at}..{total} sent by no rank")
        out.append(TensorPlan(name, pieces[0].dtype, pieces[0].shape, tuple(rows)))
    return TransferPlan(tuple(out), len(parts))


def send(rendezvous: Rendezvous, plan: TransferPlan, rank: int,
         held: Mapping[str, tuple[torch.Tensor, tuple[int, ...], int]]) -> int:
    """Rank `rank` broadcasts its rows on its group, in the plan's order; bytes sent (once:
    a broadcast reaches every engine)."""
    group = _group(rendezvous, rank, 0)
    sent = 0
    for t in plan.tensors:
        for r in t.rows:
            if r.rank == rank:
                data = held[t.name][0].detach().contiguous()
                _wait(group.broadcast(_bytes(data), 0), rendezvous, t.name)
                sent += data.numel() * data.element_size()
    return sent


# -- the engines' side ----------------------------------------------------------------------------

def receive(rendezvous: Rendezvous, plan: TransferPlan, engine_rank: int
            ) -> dict[str, torch.Tensor]:
    """Every tensor of the plan, whole, each run of rows checked against its sha256."""
    if not 0 <= engine_rank < rendezvous.engines:
        raise TransferError(f"engine rank {engine_rank} is not one of {rendezvous.engines}")
    groups = [_group(rendezvous, source, 1 + engine_rank) for source in range(plan.sources)]
    out = {}
    for t in plan.tensors:
        full = torch.empty(t.shape, dtype=DTYPES[t.dtype])
        for r in t.rows:
            rows = full.narrow(0, r.start, r.count) if t.shape else full
            _wait(groups[r.rank].broadcast(_bytes(rows), 0), rendezvous, t.name)
            if _sha256(rows) != r.sha256:
                raise TransferError(f"tensor {t.name}: rows {r.start}..{r.start + r.count} "
                                    f"from rank {r.rank} arrived with another sha256")
        out[t.name] = full
    return out


def iter_rows(tensors: Mapping[str, torch.Tensor], rank: int, world: int
              ) -> Iterator[tuple[str, tuple[torch.Tensor, tuple[int, ...], int]]]:
    """Rank `rank`'s even share of rows of each tensor (a rank holding everything that sends
    a `world`-th of it); a tensor of fewer rows than ranks goes whole from the last rank that
    gets any, one of no dimension from rank 0."""
    for name, t in tensors.items():
        shape = tuple(t.shape)
        if not shape:
            if rank == 0:
                yield name, (t, shape, 0)
            continue
        per = -(-shape[0] // world)
        start = min(rank * per, shape[0])
        count = min(per, shape[0] - start)
        if count > 0:
            yield name, (t.narrow(0, start, count), shape, start)


# -- one group per trainer rank -------------------------------------------------------------------

def _group(rendezvous: Rendezvous, source: int, index: int) -> dist.ProcessGroupGloo:
    """Trainer rank `source`'s group (it at index 0, engine i at 1 + i); blocks until every
    member came."""
    timeout = datetime.timedelta(seconds=rendezvous.timeout_s)
    try:
        store = dist.TCPStore(rendezvous.host, rendezvous.port, is_master=False,
                              timeout=timeout)
        options = dist.ProcessGroupGloo._Options()
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=rendezvous.host)]
        options._timeout = timeout
        return dist.ProcessGroupGloo(dist.PrefixStore(f"{rendezvous.key}/{source}", store),
                                     index, 1 + rendezvous.engines, options)
    except (RuntimeError, dist.DistStoreError) as exc:
        raise TransferError(f"the group of trainer rank {source} did not meet at "
                            f"{rendezvous.host}:{rendezvous.port} within "
                            f"{rendezvous.timeout_s:.0f} s: {exc}") from None


def _wait(work: dist.Work, rendezvous: Rendezvous, name: str) -> None:
    try:
        work.wait()
    except RuntimeError as exc:
        raise TransferError(f"tensor {name}: the broadcast failed ({exc}); a rank or an "
                            f"engine stopped, or took longer than {rendezvous.timeout_s:.0f} s"
                            ) from None


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """The tensor's storage as flat bytes (a view: received bytes land in place)."""
    return t.reshape(-1).view(torch.uint8) if t.dim() else t.reshape(1).view(torch.uint8)


def _sha256(t: torch.Tensor) -> str:
    return hashlib.sha256(_bytes(t.contiguous()).numpy()).hexdigest()


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _itemsize(dtype: str) -> int:
    return torch.empty((), dtype=DTYPES[dtype]).element_size()
