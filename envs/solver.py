"""The reference solver: a task's stored fix, applied through the tools a model would call."""

from __future__ import annotations

from typing import Any

from envs.environment import Episode


def _edit(old: str, new: str) -> tuple[str, str]:
    """The smallest line-aligned (old_text, new_text) that occurs once in `old`."""
    a, b = old.split("\n"), new.split("\n")
    lo = 0
    while lo < min(len(a), len(b)) and a[lo] == b[lo]:
        lo += 1
    keep = 0
    while keep < min(len(a), len(b)) - lo and a[-1 - keep] == b[-1 - keep]:
        keep += 1
    while True:
        snippet = "\n".join(a[lo:len(a) - keep])
        if (snippet and old.count(snippet) == 1) or (lo == 0 and keep == 0):
            return snippet, "\n".join(b[lo:len(b) - keep])
        lo, keep = max(lo - 1, 0), max(keep - 1, 0)


def reference_calls(episode: Episode) -> list[tuple[str, dict[str, Any]]]:
    """Tool calls (name, arguments) that turn the episode's repository into the reference."""
    calls: list[tuple[str, dict[str, Any]]] = []
    for path, text in episode.task.repo.reference_fix().items():
        target = episode.workspace.resolve(path)
        if not target.exists():
            calls.append(("write_file", {"path": path, "content": text}))
            continue
        old_text, new_text = _edit(target.read_text(), text)
        calls.append(("str_replace", {"path": path, "old_text": old_text, "new_text": new_text}))
    return calls + [("submit", {})]
