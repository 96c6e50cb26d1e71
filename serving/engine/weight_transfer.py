"""The engines' end of serving/weight_transfer.py: a vLLM weight-transfer engine, registered in
vLLM's registry by the plugin (`serving.weight_transfer.BACKEND`) and chosen with
`--weight-transfer-config '{"backend": "rollfleet_ranks"}'` (serving/vllm_engine.py).

vLLM's own engines need CUDA (PyNccl, CUDA IPC); this one moves bytes over gloo, on CPU. An
update is two steps, each one `update_weights` call (between vLLM's start and finish calls):
`receive` takes every rank's rows into one staged copy of the weights and checks them; `apply`
loads the staged copy into the model, as a reload from a folder does (vLLM's layerwise reload:
each layer's weight processing runs again). Nothing is loaded until every engine of the fleet
has received and checked its copy (serving/policy.py), so a rank that never sends, or bytes
that arrive wrong, leave every engine on the weights it served. The staged copy (one more copy
of the weights, in checkpoint form) stays until `drop`, so a load undone and done again (a
request's KV that had to land on the old weights first) needs no second transfer.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.model_executor.model_loader.reload import (
    finalize_layerwise_reload,
    initialize_layerwise_reload,
)

from serving.weight_transfer import Rendezvous, TransferError, TransferPlan, receive

log = logging.getLogger("vllm.rollfleet.weight_transfer")  # under vLLM's handler, in its log


@dataclass
class RankRowsInit(WeightTransferInitInfo):
    """Nothing: each update carries where its groups meet."""


@dataclass
class RankRowsUpdate(WeightTransferUpdateInfo):
    """`receive` (with plan, rendezvous, engine_rank), `apply` or `drop` (with digest)."""

    action: str
    digest: str = ""
    plan: dict[str, Any] = field(default_factory=dict)
    rendezvous: dict[str, Any] = field(default_factory=dict)
    engine_rank: int = 0


class RankRowsEngine(WeightTransferEngine[RankRowsInit, RankRowsUpdate]):
    init_info_cls = RankRowsInit
    update_info_cls = RankRowsUpdate
    supports_draft_weight_update = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.parallel_config.world_size > 1:
            raise ValueError("the rollfleet_ranks weight transfer receives on one worker per "
                             "engine; with tensor or pipeline parallelism use vLLM's nccl "
                             "engine")
        self.staged: dict[str, torch.Tensor] | None = None
        self.staged_digest = ""

    def init_transfer_engine(self, init_info: RankRowsInit) -> None:
        pass

    def start_weight_update(self) -> None:
        pass

    def finish_weight_update(self) -> None:
        pass

    def receive_weights(self, update_info: RankRowsUpdate) -> None:
        action, t0 = update_info.action, time.perf_counter()
        if action == "receive":
            self.staged, self.staged_digest = None, ""
            plan = TransferPlan.from_dict(update_info.plan)
            self.staged = receive(Rendezvous(**update_info.rendezvous), plan,
                                  update_info.engine_rank)
            self.staged_digest = plan.digest
            log.info("received %d tensors (%.1f MB, %s) in %.2f s", len(self.staged),
                     plan.nbytes / 1e6, plan.digest[:16], time.perf_counter() - t0)
        elif action == "apply":
            if self.staged is None or self.staged_digest != update_info.digest:
                raise TransferError(f"the weights {update_info.digest[:16]} are not staged "
                                    f"here (staged: {self.staged_digest[:16] or 'none'})")
            initialize_layerwise_reload(self.model)
            self.model.load_weights(iter(sorted(self.staged.items(), key=_layer_order)))
            finalize_layerwise_reload(self.model, self.model_config)
            log.info("loaded %s in %.2f s", self.staged_digest[:16], time.perf_counter() - t0)
        elif action == "drop":
            self.staged, self.staged_digest = None, ""
        else:
            raise ValueError(f"unknown action {action!r}: receive, apply or drop")

    def shutdown(self) -> None:
        self.staged = None


def _layer_order(item: tuple[str, torch.Tensor]) -> tuple:
    """Layer by layer (layers.2 before layers.10), as a checkpoint's files hold them."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in item[0].split("."))
