"""MoE routing replay: the experts an engine recorded come back through the front doors and the
record whole, tile the session, and a trainer's forward through them routes each token there
while its router keeps its gradient."""

import asyncio
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM

from rollfleet.paths import ROOT
from rollout.record import FEATURES, Job, Outcome, SessionTrace, build_record, experts_fields
from rollout.rl.routing import capture_routing, replay_routing, session_experts
from serving import Endpoint, Sampling, open_front_door
from serving.tiny_model import ensure_tiny_glm
from tests.rollout.test_record import PROV, _turn

MODEL_DIR = ensure_tiny_glm(ROOT / ".cache" / "models")


@pytest.fixture(scope="module")
def model():
    return AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32).eval()


def _experts(rows, seed=0):
    return np.random.default_rng(seed).integers(0, 8, (rows, 3, 2), dtype=np.uint8)


class Answer:
    """A front door's HTTP post, answering with a canned body."""

    def __init__(self, body):
        self.body, self.sent = body, None

    async def __call__(self, path, body, session_id, headers=None):
        self.sent = body
        return self.body


def _generate(front_door, body, start):
    endpoint = Endpoint("http://x/v1", "m", "/m", front_door=front_door, routed_experts=True)
    door = open_front_door(endpoint)
    door._post = Answer(body)
    gen = asyncio.run(door.generate([1, 2, 3], Sampling(4, routed_experts_from=start), None,
                                    "s"))
    return gen, door._post.sent


# Dynamo's worker module loads vLLM and NIXL: its serializer runs in a process of its own
_DYNAMO_PAYLOAD = """
import json, sys
import numpy as np
from dynamo.vllm.handlers import _serialize_routed_experts
experts = np.array(json.loads(sys.argv[1]), dtype=np.uint8)
print(json.dumps(_serialize_routed_experts(experts, start=1)))
"""


def test_vllm_and_dynamo_routing_payloads_come_back_as_the_engine_computed_them():
    from vllm.utils.serial_utils import numpy2base64

    experts = _experts(5)
    out = subprocess.run([sys.executable, "-c", _DYNAMO_PAYLOAD, json.dumps(experts.tolist())],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    dynamo_payload = json.loads(out.strip().splitlines()[-1])
    gen, sent = _generate("vllm", {"choices": [{
        "token_ids": [7], "prompt_token_ids": [1, 2, 3], "finish_reason": "stop",
        "routed_experts": numpy2base64(experts)}]}, start=2)
    assert sent["routed_experts_prompt_start"] == 2
    assert np.array_equal(gen.routed_experts, experts) and gen.routed_experts_start == 2
    gen, _ = _generate("dynamo", {"choices": [{"finish_reason": "stop"}], "nvext": {
        "completion_token_ids": [7], "prompt_token_ids": [1, 2, 3],
        "routed_experts": dynamo_payload}}, start=2)
    assert np.array_equal(gen.routed_experts, experts) and gen.routed_experts_start == 1


def test_the_record_keeps_each_turns_experts_and_they_tile_the_session():
    first, second = _experts(6, 1), _experts(4, 2)  # positions 0-5, then 6-9
    turns = [_turn(0, [1, 2, 3, 4], [5, 6, 7]), _turn(1, [1, 2, 3, 4, 5, 6, 7, 9], [8, 10])]
    for turn, experts, start in ((turns[0], first, 0), (turns[1], second, 6)):
        for key, value in experts_fields(experts, start).items():
            setattr(turn, key, value)
    record = build_record(Job("t", 0), PROV, Outcome("ok", "submitted", reward=1.0),
                          SessionTrace(turns=turns))
    row = Dataset.from_list([record], features=FEATURES)[0]  # as a trainer reads it back
    joined = session_experts(row)
    assert joined.shape == (10, 3, 2) and len(row["token_ids"]) == 10
    assert np.array_equal(joined[:6], first) and np.array_equal(joined[6:], second)
    turns[1].routed_experts_start = 7  # a gap: position 6 was never routed
    assert session_experts(build_record(Job("t", 0), PROV, Outcome("ok", "submitted"),
                                        SessionTrace(turns=turns))) is None


def test_a_forward_through_recorded_experts_routes_there_and_trains_the_router(model):
    ids = torch.tensor([[5, 6, 7, 8, 100, 200, 300, 400]])
    with torch.no_grad(), capture_routing(model) as seen:
        own = model(ids).logits
    [experts] = seen
    assert experts.shape == (8, 3, 2)
    with torch.no_grad(), replay_routing(model, experts):
        assert torch.allclose(model(ids).logits, own, atol=1e-5)  # its own choice: the same
    other = (experts + 1) % 8
    with torch.no_grad(), replay_routing(model, other), capture_routing(model) as replayed:
        moved = model(ids).logits
    assert np.array_equal(replayed[0], other)  # routed where it was told
    assert not torch.allclose(moved, own, atol=1e-3)
    with replay_routing(model, other):
        model(ids).logits.sum().backward()
    routers = [m for m in model.modules() if type(m).__name__.endswith("TopkRouter")]
    assert all(r.weight.grad is not None and r.weight.grad.abs().sum() > 0 for r in routers)
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, own, atol=1e-5)  # undone after the block
