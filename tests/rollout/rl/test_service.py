"""One push of new weights from a trainer's ranks, as the rollout service runs it
(`rollout.rl.service.WeightPush`, one thread per rank as the actor runs them): the update starts
once, with every rank's rows; every rank learns where to send, or why it never will, and how
the update went."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from rollout.rl.service import WeightPush
from serving import WeightSender
from serving.checkpoints import PolicyUpdateError
from serving.weight_transfer import Rendezvous, TransferError

TENSORS = {"a": torch.arange(12, dtype=torch.float32).reshape(4, 3), "b": torch.ones(5)}


def _rows(rank: int, world: int = 2) -> list:
    sender = WeightSender(rank, world)
    return sender.describe(sender.rows(TENSORS))


class Fleet:
    """What the push hands a transfer to: tells the ranks where to send, then answers (or
    fails before or after that)."""

    def __init__(self, fail_before: Exception | None = None,
                 fail_after: Exception | None = None) -> None:
        self.calls, self.fail_before, self.fail_after = [], fail_before, fail_after
        self.sent = threading.Event()

    def update(self, transfer, version, mode):
        self.calls.append((transfer.plan, version, mode))
        if self.fail_before:
            raise self.fail_before
        transfer.ready(Rendezvous("127.0.0.1", 1234, "k", 2))
        if self.fail_after:
            raise self.fail_after
        return {"transfer_s": 0.5, "total_s": 1.0}


def _offer_all(push: WeightPush, ranks=(0, 1), world=2):
    with ThreadPoolExecutor(len(ranks)) as pool:
        futures = [pool.submit(push.offer, r, world, _rows(r, world)) for r in ranks]
        return [f.exception() or f.result() for f in futures]


def test_the_last_rank_starts_one_update_with_every_ranks_rows_and_all_learn_where_to_send():
    fleet = Fleet()
    push = WeightPush(0, 2, 7, "abort", fleet.update)
    answers = _offer_all(push)
    assert len(fleet.calls) == 1
    plan, version, mode = fleet.calls[0]
    assert (version, mode) == (7, "abort")
    assert {r.rank for t in plan.tensors for r in t.rows} == {0, 1}  # both ranks' rows
    assert answers[0] == answers[1] and answers[0][0]["port"] == 1234
    assert answers[0][1] == plan.as_dict()
    times = push.answer()
    assert times["total_s"] == 1.0 and "service_peak_above_mib" in times


def test_an_update_refused_before_the_engines_receive_is_every_ranks_error():
    fleet = Fleet(fail_before=PolicyUpdateError("version 3 is not newer than 5"))
    push = WeightPush(0, 2, 3, None, fleet.update)
    answers = _offer_all(push)
    assert all(isinstance(a, PolicyUpdateError) and "not newer" in str(a) for a in answers)
    with pytest.raises(PolicyUpdateError, match="not newer"):
        push.answer()


def test_an_update_that_fails_after_the_ranks_sent_is_told_by_the_answer():
    fleet = Fleet(fail_after=PolicyUpdateError("engine agg1: receive failed"))
    push = WeightPush(0, 2, None, None, fleet.update)
    assert all(isinstance(a, tuple) for a in _offer_all(push))  # they were told to send
    with pytest.raises(PolicyUpdateError, match="agg1: receive failed"):
        push.answer()


def test_rows_that_do_not_add_up_start_no_update_and_fail_every_rank():
    fleet = Fleet()
    push = WeightPush(0, 2, None, None, fleet.update)
    with ThreadPoolExecutor(2) as pool:  # both ranks claim the first half
        futures = [pool.submit(push.offer, r, 2, _rows(0)) for r in (0, 1)]
        errors = [f.exception() for f in futures]
    assert fleet.calls == []
    assert all(isinstance(e, TransferError) and "sent twice" in str(e) for e in errors)


def test_a_rank_of_another_world_or_twice_is_refused_at_once():
    push = WeightPush(0, 2, None, None, Fleet().update)
    with pytest.raises(ValueError, match="rank 0 of 3: the push under way is of 2 ranks"):
        push.offer(0, 3, _rows(0, 3))
    with pytest.raises(ValueError, match="rank 2 of 2"):
        push.offer(2, 2, _rows(0))
