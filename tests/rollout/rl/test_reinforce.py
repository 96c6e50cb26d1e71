"""The RL example's trainer: the weights it hands the engines are the served checkpoint's
tensors (names, dtypes, values), its step moves probability toward rewarded samples, weighted
by the truncated importance ratio, and forced tokens carry no gradient."""

import math

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from rollfleet.paths import ROOT
from rollout.rl.behaviour import SessionLogprobs
from rollout.rl.loop import Group
from rollout.rl.reinforce import checkpoint_tensors, policy_loss, served_dtypes
from serving.tiny_model import ensure_tiny_glm


@pytest.fixture(scope="module")
def model_dir():
    return ensure_tiny_glm(ROOT / ".cache" / "models")


def test_untrained_weights_come_back_as_the_checkpoint_exactly(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out = checkpoint_tensors(model.state_dict(), served_dtypes(model_dir))
    want = load_file(str(model_dir / "model.safetensors"))
    assert set(out) == set(want)  # fused experts split back into one tensor per expert
    for name, tensor in want.items():
        assert out[name].dtype == tensor.dtype and torch.equal(out[name], tensor), name


def _record(ids: list[int], reward: float, behaviour: list[float] | None = None,
            grammar: str = "") -> dict:
    """A one-turn session: 4 prompt tokens, the rest sampled with `behaviour` logprobs."""
    sampled = ids[4:]
    return {"status": "ok", "prefix_consistent": True, "stale": False, "reward": reward,
            "token_ids": ids, "loss_mask": [0] * 4 + [1] * len(sampled),
            "policy_versions": [0], "turns": [{
                "prompt_token_ids": ids[:4], "completion_token_ids": sampled,
                "completion_logprobs": behaviour or [0.0] * len(sampled), "grammar": grammar,
                "logit_bias": "{}", "temperature": 1.0, "top_p": 1.0}]}


def _current(model, ids):
    with torch.no_grad():
        logits = model(torch.tensor([ids[:-1]])).logits[0].float()
    return torch.log_softmax(logits, -1)[3:].gather(1, torch.tensor(ids[4:])[:, None])[:, 0]


@pytest.fixture(scope="module")
def replay(model_dir):
    return SessionLogprobs(model_dir)


def test_a_step_raises_the_rewarded_sample_and_lowers_the_other(model_dir, replay):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    good, bad = [5, 6, 7, 8, 100, 200, 300], [5, 6, 7, 8, 400, 500, 600]
    group = Group("g", [_record(good, 1.0, _current(model, good).tolist()),
                        _record(bad, 0.0, _current(model, bad).tolist())])
    before = _current(model, good).sum(), _current(model, bad).sum()
    loss, used, ratios = policy_loss(model, [group], replay, is_clip=2.0)
    assert used == 2
    summary = ratios.summary()  # sampled by these very weights: on-policy
    assert summary["ratio_mean"] == pytest.approx(1.0, abs=1e-4) and summary["clipped"] == 0
    assert summary["kl"] == pytest.approx(0.0, abs=1e-6)
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=1e-2).step()
    assert _current(model, good).sum() > before[0] and _current(model, bad).sum() < before[1]
    # a group whose samples earned the same reward teaches nothing
    same = Group("g", [_record(good, 1.0), _record(bad, 1.0)])
    assert policy_loss(model, [same], replay)[:2] == (None, 0)


def test_the_importance_weight_is_the_ratio_truncated_at_the_clip(model_dir, replay):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    good, bad = [5, 6, 7, 8, 100, 200, 300], [5, 6, 7, 8, 400, 500, 600]

    def loss_with(shift: float, clip: float | None):
        group = Group("g", [_record(good, 1.0, (_current(model, good) - shift).tolist()),
                            _record(bad, 0.0, (_current(model, bad) - shift).tolist())])
        loss, _, ratios = policy_loss(model, [group], replay, clip)
        return loss.item(), ratios.summary()

    on_policy, _ = loss_with(0.0, 2.0)
    far, far_stats = loss_with(5.0, 2.0)  # sampled where these tokens were e^5 less likely
    near, near_stats = loss_with(0.5, 2.0)
    assert far == pytest.approx(2.0 * on_policy, rel=1e-4)  # min(e^5, 2) = 2
    assert near == pytest.approx(math.exp(0.5) * on_policy, rel=1e-4)
    assert far_stats["clipped"] == 1.0 and near_stats["clipped"] == 0.0
    assert far_stats["ratio_max"] == pytest.approx(math.exp(5.0), rel=1e-3)
    assert far_stats["kl"] == pytest.approx(math.exp(5.0) - 1 - 5.0, rel=1e-3)
    uncorrected, _ = loss_with(5.0, None)
    assert uncorrected == pytest.approx(on_policy, rel=1e-4)


def test_a_forced_token_carries_no_gradient(model_dir, replay, tokenizer_ids):
    """A turn under the project's grammar: its forced positions give logprob 0 and contribute
    nothing to the gradient, whatever the model thought of them."""
    from envs.tools import tool_schemas
    from serving.toolcall import build_grammar

    grammar = build_grammar(tool_schemas(max_command_chars=40, max_file_chars=40), "required",
                            False, False, 256, tokenizer_ids[1])
    tok = tokenizer_ids[0]
    call = tok.encode("<tool_call>bash<arg_key>command</arg_key><arg_value>ls</arg_value>"
                      "</tool_call><|observation|>", add_special_tokens=False)
    ids = [5, 6, 7, 8, *call]
    record = _record(ids, 1.0, grammar=grammar.ebnf)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    logits = model(torch.tensor([ids[:-1]])).logits[0].float()
    turns = replay.turns(record)
    forced = torch.from_numpy(turns[0].forced)
    current = replay.logprobs(record, logits, turns)
    assert forced[0] and forced.sum() >= 3  # <tool_call>, and markup the schema fixes
    assert torch.all(current[forced] == 0.0) and torch.all(current[~forced] < 0.0)
    current[forced].sum().backward()
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())


@pytest.fixture(scope="module")
def tokenizer_ids(model_dir):
    from transformers import AutoTokenizer

    from serving.toolcall import SPECIAL_TOKENS

    tok = AutoTokenizer.from_pretrained(model_dir)
    return tok, {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
