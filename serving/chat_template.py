"""A model folder's chat template, rendered as transformers' `apply_chat_template` renders it,
without transformers: importing it (and torch with it) cost each rollout actor 3.2 s of its
4.75 s of CPU to load a renderer, while jinja2 and the folder's files take 0.03 s (measured
here). The same conventions, so the text is the same (tests/serving/test_chat_template.py
compares the two on every message shape the project sends):
- the template: `chat_template.jinja`, else tokenizer_config.json's `chat_template` (one
  string, or named ones: `tool_use` when tools are given and there is one, else `default`);
  named templates may also lie in `additional_chat_templates/<name>.jinja`;
- a sandboxed environment (a template is code from the model's folder) with trim_blocks and
  lstrip_blocks, loop controls, `{% generation %}` blocks rendered as their body, a `tojson`
  that writes JSON as json.dumps does (not HTML-escaped, non-ASCII kept), and the globals
  `raise_exception` and `strftime_now`;
- the variables: `messages`, `tools`, `documents`, `add_generation_prompt`, the named special
  tokens (bos_token, eos_token, ...) as tokenizer_config.json and special_tokens_map.json
  give them, and the caller's own (`enable_thinking`).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

TEMPLATE_FILE = "chat_template.jinja"
TEMPLATE_DIR = "additional_chat_templates"
NAMED_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                "mask_token")


class ChatTemplateError(ValueError):
    """The model folder has no usable chat template."""


class _Generation(Extension):
    """`{% generation %}...{% endgeneration %}` (marks what the assistant wrote, for masks
    this project takes from the sampled tokens instead): the body, unchanged."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


class ChatTemplate:
    """`render(messages, tools, add_generation_prompt, **variables)`: the prompt text."""

    def __init__(self, sources: dict[str, str], special_tokens: dict[str, str]) -> None:
        """`sources`: template name -> Jinja source (one template: the name `default`)."""
        env = _environment()
        self.sources = sources
        self.templates = {name: env.from_string(src) for name, src in sources.items()}
        self.special_tokens = special_tokens

    @classmethod
    def of_model(cls, model_dir: Path) -> ChatTemplate:
        config = _json(model_dir / "tokenizer_config.json")
        sources: dict[str, str] = {}
        given = config.get("chat_template")
        if isinstance(given, str):
            sources["default"] = given
        elif isinstance(given, list):
            sources.update({t["name"]: t["template"] for t in given})
        extra = model_dir / TEMPLATE_DIR
        if extra.is_dir():
            sources.update({f.stem: f.read_text() for f in sorted(extra.glob("*.jinja"))})
        if (model_dir / TEMPLATE_FILE).is_file():
            sources["default"] = (model_dir / TEMPLATE_FILE).read_text()
        if not sources:
            raise ChatTemplateError(f"model folder {model_dir} has no chat template (neither "
                                    f"{TEMPLATE_FILE} nor tokenizer_config.json's chat_template)")
        tokens = {**config, **_json(model_dir / "special_tokens_map.json")}
        special = {name: _content(tokens[name]) for name in NAMED_TOKENS
                   if tokens.get(name) is not None}
        return cls(sources, special)

    def render(self, messages: list[dict[str, Any]], tools: list[dict] | None,
               add_generation_prompt: bool, **variables: Any) -> str:
        name = "tool_use" if tools is not None and "tool_use" in self.templates else "default"
        if name not in self.templates:
            raise ChatTemplateError(f"the model has named chat templates {sorted(self.templates)}"
                                    " and none is 'default'")
        return self.templates[name].render(
            messages=messages, tools=tools, documents=None,
            add_generation_prompt=add_generation_prompt, **self.special_tokens, **variables)


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _content(token: str | dict) -> str:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken's dict."""
    return token["content"] if isinstance(token, dict) else token
