"""The RL example's trainer: the weights it hands the engines are the served checkpoint's
tensors (names, dtypes, values), and its step moves probability toward rewarded samples."""

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from rollfleet.paths import ROOT
from rollout.loop import Group
from rollout.reinforce import _served_dtypes, checkpoint_tensors, policy_loss
from serving.tiny_model import ensure_tiny_glm


@pytest.fixture(scope="module")
def model_dir():
    return ensure_tiny_glm(ROOT / ".cache" / "models")


def test_untrained_weights_come_back_as_the_checkpoint_exactly(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out = checkpoint_tensors(model.state_dict(), _served_dtypes(model_dir))
    want = load_file(str(model_dir / "model.safetensors"))
    assert set(out) == set(want)  # fused experts split back into one tensor per expert
    for name, tensor in want.items():
        assert out[name].dtype == tensor.dtype and torch.equal(out[name], tensor), name


def _record(ids: list[int], reward: float) -> dict:
    return {"status": "ok", "prefix_consistent": True, "stale": False, "reward": reward,
            "token_ids": ids, "loss_mask": [0] * 4 + [1] * (len(ids) - 4),
            "policy_versions": [0]}


def test_a_step_raises_the_rewarded_sample_and_lowers_the_other(model_dir):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    good, bad = [5, 6, 7, 8, 100, 200, 300], [5, 6, 7, 8, 400, 500, 600]
    group = Group("g", [_record(good, 1.0), _record(bad, 0.0)])

    def logp(ids: list[int]) -> float:
        with torch.no_grad():
            logits = model(torch.tensor([ids[:-1]])).logits[0].float()
        return torch.log_softmax(logits, -1)[3:].gather(1, torch.tensor(ids[4:])[:, None]).sum()

    before = logp(good), logp(bad)
    loss, used = policy_loss(model, [group])
    assert used == 2
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=1e-2).step()
    assert logp(good) > before[0] and logp(bad) < before[1]
    # a group whose samples earned the same reward teaches nothing
    assert policy_loss(model, [Group("g", [_record(good, 1.0), _record(bad, 1.0)])]) == (None, 0)
