"""The chat template rendered without transformers gives what transformers' apply_chat_template
gives: the same text and the same ids, on the project's model and on templates that use the
conventions a model folder may rely on."""

import json
import shutil

import pytest
from transformers import AutoTokenizer

from rollfleet.paths import ROOT
from serving.chat import ChatRenderer
from serving.chat_template import ChatTemplate, ChatTemplateError
from serving.tiny_model import ensure_tiny_glm
from tests.serving.test_chat import CONVO, TOOLS, _long_session

MODEL_DIR = ensure_tiny_glm(ROOT / ".cache" / "models")
TOOLS_WIDE = [*TOOLS, {"type": "function", "function": {
    "name": "bash", "description": "run a command — «non-ASCII» <kept>", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}},
        "required": ["command"]}}}]


@pytest.fixture(scope="module")
def reference():
    return AutoTokenizer.from_pretrained(str(MODEL_DIR), local_files_only=True)


def _conversations() -> list[list[dict]]:
    """Every prefix of a long session (calls, parallel calls, reasoning, turns without a
    call and their nudges, non-ASCII), with its new messages."""
    out = []
    for history, new in _long_session(12):
        out += [history, history + new]
    out.append([CONVO[0], {"role": "user", "content": "naïve café — 修复它 \"quoted\" <tag>"}])
    return out


@pytest.mark.parametrize("thinking", [False, True])
def test_the_projects_model_renders_as_transformers_renders_it(reference, thinking):
    renderer = ChatRenderer(MODEL_DIR, enable_thinking=thinking)
    for messages in _conversations():
        for tools in (None, TOOLS, TOOLS_WIDE):
            for generation_prompt in (False, True):
                text = renderer._text(messages, tools, generation_prompt)
                assert text == reference.apply_chat_template(
                    messages, tools=tools, tokenize=False, enable_thinking=thinking,
                    add_generation_prompt=generation_prompt)
                assert renderer.encode(text) == reference.encode(text, add_special_tokens=False)
    first = renderer.prompt_ids(CONVO, TOOLS)
    assert first == reference.apply_chat_template(CONVO, tools=TOOLS, tokenize=True,
                                                  add_generation_prompt=True,
                                                  enable_thinking=thinking, return_dict=False)


CONVENTIONS = (
    "{{ bos_token }}{% for m in messages %}{% generation %}<{{ m.role }}>{% endgeneration %}"
    "{{ m.content | tojson }}{% if loop.index > 2 %}{% break %}{% endif %}{% endfor %}"
    "{% if tools %}{{ tools | tojson(indent=2) }}{% endif %}{{ eos_token }}"
    "{% if add_generation_prompt %}<assistant>{% endif %}\n"
    "  {% if messages %}\n    indented, its block tags' lines dropped\n  {% endif %}\n")


def _folder_with(tmp_path, **config):
    """The project's model folder with another tokenizer_config.json (and no template file)."""
    folder = tmp_path / "model"
    shutil.copytree(MODEL_DIR, folder)
    (folder / "chat_template.jinja").unlink()
    base = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**base, **config}))
    return folder


def test_a_folders_conventions_render_as_transformers_renders_them(tmp_path):
    """Special tokens as variables (an AddedToken's dict included), generation blocks, loop
    controls, tojson with its options, block tags' whitespace trimmed, named templates chosen
    by whether tools are given."""
    folder = _folder_with(tmp_path, bos_token={"content": "[gMASK]", "__type": "AddedToken"},
                          chat_template=[{"name": "default", "template": CONVENTIONS},
                                         {"name": "tool_use", "template": "T" + CONVENTIONS}])
    ours = ChatTemplate.of_model(folder)
    theirs = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    messages = [*CONVO, {"role": "assistant", "content": "«ok»"}, {"role": "user", "content": "x"}]
    for tools in (None, TOOLS_WIDE):
        for generation_prompt in (False, True):
            text = ours.render(messages, tools, generation_prompt)
            assert text == theirs.apply_chat_template(messages, tools=tools, tokenize=False,
                                                      add_generation_prompt=generation_prompt)
            assert text.startswith("T[gMASK]" if tools else "[gMASK]")


def test_a_template_file_comes_before_the_configs_and_a_folder_without_one_is_refused(tmp_path):
    folder = _folder_with(tmp_path, chat_template="from the config")
    assert ChatTemplate.of_model(folder).render([], None, False) == "from the config"
    (folder / "chat_template.jinja").write_text("from the file")
    assert ChatTemplate.of_model(folder).render([], None, False) == "from the file"
    bare = _folder_with(tmp_path / "bare", chat_template=None)
    with pytest.raises(ChatTemplateError, match="has no chat template"):
        ChatTemplate.of_model(bare)


def test_raise_exception_in_a_template_is_a_template_error():
    import jinja2

    template = ChatTemplate({"default": "{{ raise_exception('no system role') }}"}, {})
    with pytest.raises(jinja2.TemplateError, match="no system role"):
        template.render(CONVO, None, True)
