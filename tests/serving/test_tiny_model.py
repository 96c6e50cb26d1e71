import hashlib
import json

import pytest
from transformers import AutoTokenizer

from serving.tiny_model import GLM_MARKUP_TOKENS, GLM_SPECIAL_TOKENS, TinyGlmSpec, ensure_tiny_glm

SMALL = TinyGlmSpec(vocab_size=1024, hidden_size=64, num_hidden_layers=2, intermediate_size=64,
                    moe_intermediate_size=32, n_routed_experts=4, tokenizer_corpus_bytes=200_000)


def _digests(path):
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.iterdir())}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return ensure_tiny_glm(tmp_path_factory.mktemp("models"), SMALL)


def test_same_bytes_every_time(model_dir, tmp_path):
    again = ensure_tiny_glm(tmp_path, SMALL)
    assert again.name == model_dir.name
    assert _digests(again) == _digests(model_dir)


def test_config_is_glm4_moe(model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["Glm4MoeForCausalLM"]
    assert config["vocab_size"] == SMALL.vocab_size
    assert config["n_routed_experts"] == SMALL.n_routed_experts


def test_glm_tokens_are_single_ids_and_survive_decoding(model_dir):
    tok = AutoTokenizer.from_pretrained(model_dir)
    assert len(tok) == SMALL.vocab_size
    for token in GLM_SPECIAL_TOKENS + GLM_MARKUP_TOKENS:
        ids = tok.encode(token, add_special_tokens=False)
        assert len(ids) == 1, token
    text = "<tool_call>bash<arg_key>command</arg_key><arg_value>ls</arg_value></tool_call>"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_chat_template_is_prefix_stable(model_dir):
    """Turn k's prompt + what the model wrote must prefix turn k+1's prompt (RL needs it)."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}}}}]
    history = [{"role": "system", "content": "sys"}, {"role": "user", "content": "fix it"}]
    prompt = tok.apply_chat_template(history, tools=tools, tokenize=False,
                                     add_generation_prompt=True, enable_thinking=False)
    call = {"id": "c1", "type": "function",
            "function": {"name": "bash", "arguments": {"command": "ls -la"}}}
    sampled = "<tool_call>bash<arg_key>command</arg_key><arg_value>ls -la</arg_value></tool_call>"
    history += [{"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "a.py"}]
    nxt = tok.apply_chat_template(history, tools=tools, tokenize=False,
                                  add_generation_prompt=True, enable_thinking=False)
    assert nxt.startswith(prompt + sampled + "<|observation|>")
    assert nxt.endswith("<tool_response>a.py</tool_response><|assistant|>\n<think></think>")
