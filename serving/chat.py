"""A conversation as token ids, rendered with the model's own chat template and tokenizer.

Sessions are token-in/token-out: the next prompt is the previous prompt + the completion as
sampled + the ids of what was added since (tool results, a user message, the next generation
prompt). Only that delta is ever rendered, so a prompt always extends what the model saw; the
sampled turn is never re-rendered (re-rendering it re-tokenizes differently from what was
sampled, and the markup the model ended its turn with would be doubled or lost).

Nothing per turn grows with the session: a delta is rendered after the sampled turn alone, not
after the whole history (twice per turn, O(turns) each: 11% of an actor's Python time at 1,024
short sessions, py-spy --gil), once the first SHORT_CHECKS deltas rendered both ways agreed (a
template whose new messages look further back than the last one keeps the whole render). A
session's first prompt is rendered once per distinct conversation and tool set: the samples of
one task share it.
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from serving.chat_template import ChatTemplate
from serving.token_bytes import TokenBytes

log = logging.getLogger(__name__)
SHORT_CHECKS = 16  # deltas rendered both ways before the short render is trusted
FIRST_PROMPTS = 1024  # first prompts kept, by conversation and tools


class TemplateError(ValueError):
    """The chat template cannot extend this conversation by appending (it rewrites history)."""


class ChatRenderer:
    """Renders prompts and prompt deltas as token ids; maps sampled ids back to their bytes."""

    def __init__(self, model_dir: Path, enable_thinking: bool) -> None:
        self.model_dir = Path(model_dir)
        self.enable_thinking = enable_thinking
        self.template = ChatTemplate.of_model(self.model_dir)
        self.tokenizer = Tokenizer.from_file(str(self.model_dir / "tokenizer.json"))
        self.tokenizer.no_truncation()  # what transformers' encode does when not asked to cut
        self.tokenizer.no_padding()
        self.bytes = TokenBytes(self.tokenizer)
        self.added = {t.content: i for i, t in self.tokenizer.get_added_tokens_decoder().items()}
        self.short_checks = 0  # deltas whose short and whole renders agreed so far
        self.short_ok: bool | None = None  # None: not known yet
        self._first = functools.lru_cache(maxsize=FIRST_PROMPTS)(self._first_ids)

    def _text(self, messages: list[dict[str, Any]], tools: list[dict] | None,
              generation_prompt: bool) -> str:
        return self.template.render(messages, tools or None, generation_prompt,
                                    enable_thinking=self.enable_thinking)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict] | None) -> list[int]:
        """The first prompt: the whole conversation so far, then the generation prompt."""
        return list(self._first(json.dumps([messages, tools])))

    def _first_ids(self, key: str) -> tuple[int, ...]:
        messages, tools = json.loads(key)
        return tuple(self.encode(self._text(messages, tools, True)))

    def delta_ids(self, history: list[dict[str, Any]], new: list[dict[str, Any]],
                  tools: list[dict] | None, last_sampled: int | None) -> list[int]:
        """The ids that follow a sampled turn: `new` messages, then the generation prompt.

        `history` ends with the assistant turn whose completion ended with `last_sampled`. If
        that token is the markup the template opens the next message with (GLM ends a call
        turn with `<|observation|>`, which also opens the tool results), it is not repeated.
        """
        delta = self._delta_text(history, new, tools)
        opener = self.tokenizer.id_to_token(last_sampled) if last_sampled else None
        if opener in self.added and delta.startswith(opener):
            delta = delta[len(opener):]
        return self.encode(delta)

    def _delta_text(self, history: list[dict[str, Any]], new: list[dict[str, Any]],
                    tools: list[dict] | None) -> str:
        # the short render leaves the tools out too (their schemas' `tojson`, every render);
        # the checks compare it with the whole render, tools included
        if self.short_ok:
            return self._appended(history[-1:], new, None)
        whole = self._appended(history, new, tools)
        if self.short_ok is None:
            if self._appended(history[-1:], new, None) != whole:
                self.short_ok = False
                log.warning("the chat template renders new messages from more than the last "
                            "one: every turn renders the whole history")
            else:
                self.short_checks += 1
                self.short_ok = True if self.short_checks >= SHORT_CHECKS else None
        return whole

    def _appended(self, history: list[dict[str, Any]], new: list[dict[str, Any]],
                  tools: list[dict] | None) -> str:
        """What rendering `new` and the generation prompt adds to the text of `history`."""
        base = self._text(history, tools, False)
        full = self._text(history + new, tools, True)
        if not full.startswith(base):
            cut = next(i for i, (a, b) in enumerate(zip(base, full, strict=False)) if a != b)
            raise TemplateError(f"the chat template rewrites earlier turns when messages are "
                                f"added (first difference at character {cut}): token-in "
                                "sessions need an append-only template")
        return full[len(base):]

    def token_bytes(self, ids: list[int]) -> list[bytes]:
        return [self.bytes[i] for i in ids]


@functools.lru_cache(maxsize=4)
def chat_renderer(model_dir: str, enable_thinking: bool) -> ChatRenderer:
    """One renderer per model folder and process."""
    return ChatRenderer(Path(model_dir), enable_thinking)
