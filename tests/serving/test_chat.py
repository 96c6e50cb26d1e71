"""Prompts as token ids from the model's own template: only the new messages are rendered."""

import json

import pytest

from rollfleet.paths import ROOT
from serving.chat import SHORT_CHECKS, ChatRenderer, TemplateError
from serving.chat_template import ChatTemplate
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
    text = renderer.tokenizer.decode(ids, skip_special_tokens=False)
    assert text.startswith("[gMASK]<sop><|system|>\n# Tools") and json.dumps(
        TOOLS[0]["function"]) in text
    assert text.endswith("<|user|>\nfix it<|assistant|>\n<think></think>")


def test_a_sampled_turn_end_that_opens_the_next_message_is_not_repeated(renderer):
    observation = renderer.tokenizer.token_to_id("<|observation|>")
    delta = renderer.delta_ids(CONVO + [ASSISTANT], RESULT, TOOLS, last_sampled=observation)
    assert renderer.tokenizer.decode(delta, skip_special_tokens=False) == (
        "\n<tool_response>submitted</tool_response><|assistant|>\n<think></think>")


def test_a_turn_cut_off_or_ended_otherwise_gets_the_whole_opener(renderer):
    for last in (renderer.encode("x")[0], renderer.tokenizer.token_to_id("<|user|>"),
                 None):
        delta = renderer.delta_ids(CONVO + [ASSISTANT], RESULT, TOOLS, last_sampled=last)
        text = renderer.tokenizer.decode(delta, skip_special_tokens=False)
        assert text.startswith("<|observation|>\n<tool_response>")


def test_a_template_that_rewrites_history_is_refused(renderer):
    rewrites = ChatRenderer(MODEL_DIR, enable_thinking=False)
    rewrites.template = ChatTemplate(
        {"default": "{% for m in messages %}{{ m.role }}{{ messages | length }}{% endfor %}"}, {})
    with pytest.raises(TemplateError, match="append-only template"):
        rewrites.delta_ids(CONVO + [ASSISTANT], RESULT, None, last_sampled=None)


def _long_session(turns: int) -> list[tuple[list[dict], list[dict]]]:
    """(history, new) for each turn of a session: calls, parallel calls, reasoning, a turn
    without a call and its nudge."""
    history: list[dict] = list(CONVO)
    steps = []
    for n in range(turns):
        calls = [{"id": f"c{n}{k}", "type": "function", "function": {
            "name": "submit", "arguments": json.dumps({"n": n, "k": k})}} for k in range(n % 3)]
        sampled = {"role": "assistant", "content": f"step {n}", "tool_calls": calls}
        if n % 4 == 1:
            sampled["reasoning_content"] = f"thinking {n}"
        new = ([{"role": "tool", "tool_call_id": c["id"], "content": f"out {n}"} for c in calls]
               or [{"role": "user", "content": "Reply with exactly one tool call."}])
        history = [*history, sampled]
        steps.append((history, new))
        history = history + new
    return steps


def test_a_delta_rendered_after_the_last_turn_alone_is_the_whole_render(renderer):
    """The short render is trusted once SHORT_CHECKS deltas agreed, and from then on gives
    what rendering the whole history gives, at every turn of a long session."""
    fresh = ChatRenderer(MODEL_DIR, enable_thinking=False)
    whole = ChatRenderer(MODEL_DIR, enable_thinking=False)
    whole.short_ok = False  # always the whole history
    steps = _long_session(40)
    for history, new in steps:
        assert fresh.delta_ids(history, new, TOOLS, None) == whole.delta_ids(
            history, new, TOOLS, None)
    assert fresh.short_ok is True and fresh.short_checks == SHORT_CHECKS


def test_a_template_that_looks_further_back_keeps_the_whole_render(renderer):
    """Tool results numbered by their place in the conversation: rendered after the last turn
    alone they would be numbered wrong, so every delta renders the whole history."""
    looks_back = ChatRenderer(MODEL_DIR, enable_thinking=False)
    looks_back.template = ChatTemplate({"default": (
        "{% for m in messages %}<{{ m.role }} {{ loop.index }}>{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}")}, {})
    history, new = _long_session(6)[-1]
    delta = looks_back.tokenizer.decode(looks_back.delta_ids(history, new, TOOLS, None),
                                        skip_special_tokens=False)
    assert delta == "".join(f"<{m['role']} {len(history) + 1 + i}>{m['content']}"
                            for i, m in enumerate(new)) + "<assistant>"
    assert looks_back.short_ok is False


def test_the_first_prompt_is_rendered_per_conversation(renderer):
    """Samples of one task share their first prompt; another conversation or tool set gets
    its own."""
    other = [CONVO[0], {"role": "user", "content": "fix the other thing"}]
    render = lambda m, t: renderer.encode(renderer._text(m, t, True))  # noqa: E731
    assert renderer.prompt_ids(CONVO, TOOLS) == renderer.prompt_ids(CONVO, TOOLS) == render(
        CONVO, TOOLS)
    assert renderer.prompt_ids(other, TOOLS) == render(other, TOOLS) != render(CONVO, TOOLS)
    assert renderer.prompt_ids(CONVO, None) == render(CONVO, None) != render(CONVO, TOOLS)
