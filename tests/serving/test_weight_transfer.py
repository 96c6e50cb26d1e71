"""Weights from a trainer's ranks to the engines (serving/weight_transfer.py): the plan adds up
or is refused, every row goes from exactly one rank, and real gloo groups in separate processes
carry the bytes, checked against their sha256, or fail with a named tensor."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.weight_transfer import (
    Rendezvous,
    Rows,
    TensorPlan,
    Transfer,
    TransferError,
    TransferPlan,
    WeightSender,
    describe,
    iter_rows,
    join_plan,
)

ROOT = Path(__file__).resolve().parents[2]


def _tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"model.embed.weight": torch.randn(7, 5, generator=g).to(torch.bfloat16),
            "model.norm.weight": torch.randn(3, generator=g),
            "model.tiny": torch.randn(1, 4, generator=g),  # fewer rows than ranks
            "model.scale": torch.tensor(2.5)}  # no dimension


def _plan(tensors, world):
    return join_plan([describe(r, dict(iter_rows(tensors, r, world))) for r in range(world)])


@settings(max_examples=200)
@given(shapes=st.lists(st.lists(st.integers(1, 9), min_size=0, max_size=3), min_size=1,
                       max_size=5),
       world=st.integers(1, 5))
def test_every_row_goes_from_exactly_one_rank_and_the_plan_adds_up(shapes, world):
    tensors = {f"t{i}": torch.arange(int(torch.tensor(s).prod()) if s else 1,
                                     dtype=torch.float32).reshape(s)
               for i, s in enumerate(shapes)}
    seen = {name: torch.zeros(t.shape[0] if t.dim() else 1) for name, t in tensors.items()}
    for rank in range(world):
        for name, (rows, shape, start) in iter_rows(tensors, rank, world):
            count = rows.shape[0] if rows.dim() else 1
            seen[name][start:start + count] += 1
            assert tuple(shape) == tuple(tensors[name].shape)
    assert all(bool((s == 1).all()) for s in seen.values())
    plan = _plan(tensors, world)
    assert [t.name for t in plan.tensors] == sorted(tensors)
    assert TransferPlan.from_dict(plan.as_dict()) == plan
    # the same bytes sent the same way: the same digest, whatever order the parts came in
    parts = [describe(r, dict(iter_rows(tensors, r, world))) for r in range(world)]
    assert join_plan(parts[::-1]).digest != "" and join_plan(parts).digest == plan.digest


def test_the_digest_names_the_bytes():
    one, other = _tensors(0), _tensors(0)
    other["model.norm.weight"][1] += 1e-3
    assert _plan(one, 2).digest == _plan(_tensors(0), 2).digest
    assert _plan(one, 2).digest != _plan(other, 2).digest
    assert _plan(one, 2).nbytes == sum(t.numel() * t.element_size() for t in one.values())


def _part(rank, name, start, count, shape=(4, 2), dtype="F32"):
    return [TensorPlan(name, dtype, shape, (Rows(rank, start, count, "x"),))]


@pytest.mark.parametrize("parts, message", [
    ([_part(0, "w", 0, 2), _part(1, "w", 3, 1)], "rows 2..3 sent by no rank"),
    ([_part(0, "w", 0, 3), _part(1, "w", 2, 2)], "rows 3..2 sent twice"),
    ([_part(0, "w", 0, 2), _part(1, "w", 2, 1)], "rows 3..4 sent by no rank"),
    ([_part(0, "w", 0, 2), _part(1, "w", 2, 2, dtype="BF16")], "disagree on its dtype"),
    ([_part(0, "w", 0, 2), _part(1, "w", 2, 2, shape=(4, 3))], "disagree on its dtype or shape"),
])
def test_a_plan_that_does_not_add_up_is_refused_naming_the_tensor(parts, message):
    with pytest.raises(TransferError, match=f"tensor w: .*{message}"):
        join_plan(parts)


def test_rows_that_do_not_fit_their_tensor_are_refused():
    with pytest.raises(TransferError, match="do not fit its shape"):
        describe(0, {"w": (torch.zeros(3, 2), (2, 2), 0)})
    with pytest.raises(TransferError, match="do not fit its shape"):
        describe(0, {"w": (torch.zeros(1, 2), (2, 3), 1)})


# -- real groups in separate processes ------------------------------------------------------

# Each process a fresh interpreter: a child forked from a pytest worker inherits locks its
# other threads held, and one such child hung a CI run. Answers come back as one JSON line.
_CHILD = """
import json, sys
import torch
from serving.weight_transfer import Rendezvous, TransferError, TransferPlan, receive, send
from serving.weight_transfer import iter_rows
from tests.serving.test_weight_transfer import _tensors
role, index, world, corrupt, rendezvous, plan = json.loads(sys.argv[1])
rendezvous, plan = Rendezvous(**rendezvous), TransferPlan.from_dict(plan)
try:
    if role == "rank":
        held = dict(iter_rows(_tensors(), index, world))
        if corrupt and index == 1:
            name = next(iter(held))
            held[name] = (held[name][0] + 1, *held[name][1:])
        answer = send(rendezvous, plan, index, held)
    else:
        got = receive(rendezvous, plan, index)
        answer = all(torch.equal(got[k], v) for k, v in _tensors().items())
except TransferError as exc:
    answer = str(exc)
print(json.dumps([role, index, answer]), flush=True)
"""


def _run(ranks, engines, corrupt=False, timeout_s=60.0):
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout_s))
    plan = _plan(_tensors(), 2)
    rendezvous = Rendezvous("127.0.0.1", store.port, "t", engines=2, timeout_s=timeout_s)
    roles = [("rank", r) for r in ranks] + [("engine", i) for i in engines]
    procs = {}
    try:
        for role, index in roles:
            args = json.dumps([role, index, 2, corrupt, rendezvous.as_dict(), plan.as_dict()])
            procs[role, index] = subprocess.Popen(
                [sys.executable, "-c", _CHILD, args], cwd=ROOT, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True)
        results = []
        for who, proc in procs.items():
            try:
                out, err = proc.communicate(timeout=timeout_s + 60)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{who} gave no answer within {timeout_s + 60:.0f} s") \
                    from None
            assert proc.returncode == 0 and out, f"{who} exited {proc.returncode}: {err[-2000:]}"
            results.append(tuple(json.loads(out.splitlines()[-1])))
        return sorted(results)
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()


def test_two_ranks_send_their_rows_once_and_every_engine_receives_the_whole_weights():
    results = _run(ranks=[0, 1], engines=[0, 1])
    assert [r[:2] for r in results] == [("engine", 0), ("engine", 1), ("rank", 0), ("rank", 1)]
    assert results[0][2] is True and results[1][2] is True
    total = sum(t.numel() * t.element_size() for t in _tensors().values())
    assert results[2][2] + results[3][2] == total  # each byte sent once, by one rank


def test_rows_that_arrive_with_another_sha256_fail_the_engine_naming_the_tensor():
    results = _run(ranks=[0, 1], engines=[0, 1], corrupt=True)
    engines = [r[2] for r in results if r[0] == "engine"]
    assert all(isinstance(e, str) and "arrived with another sha256" in e and "from rank 1" in e
               for e in engines), engines


def test_a_rank_that_never_comes_fails_the_engines_within_the_timeout():
    results = _run(ranks=[0], engines=[0, 1], timeout_s=5.0)
    engines = [r[2] for r in results if r[0] == "engine"]
    assert all(isinstance(e, str) and "trainer rank 1 did not meet" in e for e in engines), \
        engines


def test_the_sender_and_the_transfer_are_the_functions_a_rank_and_the_service_use():
    tensors = _tensors()
    senders = [WeightSender(r, 2) for r in range(2)]
    parts = [s.describe(s.rows(tensors)) for s in senders]
    told = []
    transfer = Transfer.from_parts(parts, told.append)
    assert transfer.plan == _plan(tensors, 2)
    transfer.ready("here")
    assert told == ["here"]
