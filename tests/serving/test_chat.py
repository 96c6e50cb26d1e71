"""Prompts as token ids from the model's own template: only the new messages are rendered."""

import json

import pytest

from rollfleet.paths import ROOT
from serving.chat import ChatRenderer, TemplateError
from serving.tiny_model import ensure_tiny_glm

MODEL_DIR = ensure_tiny_glm(ROOT / ".cache" / "models")
TOOLS = [{"type": "function", "function": {"name": "submit", "parameters": {
    "type": "object", "properties": {}}}}]
CONVO = [{"role": "system", "content": "sys"}, {"role": "user", "content": "fix it"}]
ASSISTANT = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "c", "type": "function", "function": {"name": "submit", "arguments": "{}"}}]}
RESULT = [{"role": "tool", "tool_call_id": "c", "content": "submitted"}]


@pytest.fixture(scope="module")
def renderer():
    return ChatRenderer(MODEL_DIR, enable_thinking=False)


def test_the_first_prompt_is_the_template_rendered_and_tokenized(renderer):
    ids = renderer.prompt_ids(CONVO, TOOLS)
    text = renderer.tokenizer.decode(ids)
    assert text.startswith("[gMASK]<sop><|system|>\n# Tools") and json.dumps(
        TOOLS[0]["function"]) in text
    assert text.endswith("<|user|>\nfix it<|assistant|>\n<think></think>")


def test_a_sampled_turn_end_that_opens_the_next_message_is_not_repeated(renderer):
    observation = renderer.tokenizer.convert_tokens_to_ids("<|observation|>")
    delta = renderer.delta_ids(CONVO + [ASSISTANT], RESULT, TOOLS, last_sampled=observation)
    assert renderer.tokenizer.decode(delta) == (
        "\n<tool_response>submitted</tool_response><|assistant|>\n<think></think>")


def test_a_turn_cut_off_or_ended_otherwise_gets_the_whole_opener(renderer):
    for last in (renderer.encode("x")[0], renderer.tokenizer.convert_tokens_to_ids("<|user|>"),
                 None):
        delta = renderer.delta_ids(CONVO + [ASSISTANT], RESULT, TOOLS, last_sampled=last)
        assert renderer.tokenizer.decode(delta).startswith("<|observation|>\n<tool_response>")


def test_a_template_that_rewrites_history_is_refused(renderer):
    renderer.tokenizer.chat_template = (
        "{% for m in messages %}{{ m.role }}{{ messages | length }}{% endfor %}")
    try:
        with pytest.raises(TemplateError, match="append-only template"):
            renderer.delta_ids(CONVO + [ASSISTANT], RESULT, None, last_sampled=None)
    finally:
        renderer.tokenizer.chat_template = ChatRenderer(MODEL_DIR, False).tokenizer.chat_template
