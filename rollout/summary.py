"""The end-of-run summary: a table for people, a dict for wandb and summary.json."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from serving import ToolTurn

# the record fields `summarize` reads: a finished run's dataset is read for these alone (all of
# it, every turn's prompt ids included, cost the driver 1 ms of CPU a record)
SUMMARY_FIELDS = ("task_id", "status", "reward", "num_turns", "num_tool_calls",
                  "num_invalid_tool_calls", "prompt_tokens", "completion_tokens", "cached_tokens",
                  "tool_call_issues")


def summarize(records: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    status = Counter(r["status"] for r in records)
    scored = [r["reward"] for r in records if r.get("reward") is not None]
    completion = sum(r.get("completion_tokens") or 0 for r in records)
    return {
        "tasks": len({r["task_id"] for r in records}),
        "rollouts": len(records),
        "ok": status["ok"],
        "truncated": status["truncated"],
        "infra_error": status["infra_error"],
        "error": status["error"],  # session or environment code raised (a bug; not retried)
        "mean_reward": sum(scored) / len(scored) if scored else 0.0,
        "turns": sum(r.get("num_turns") or 0 for r in records),
        "tool_calls": sum(r.get("num_tool_calls") or 0 for r in records),
        "invalid_tool_calls": sum(r.get("num_invalid_tool_calls") or 0 for r in records),
        "prompt_tokens": sum(r.get("prompt_tokens") or 0 for r in records),
        "completion_tokens": completion,
        "cached_tokens": sum(r.get("cached_tokens") or 0 for r in records),
        "completion_tokens_per_s": completion / wall_s if wall_s > 0 else 0.0,
        "wall_s": wall_s,
        **{f"calls_{kind}": sum((r.get("tool_call_issues") or {}).get(kind, 0) for r in records)
           for kind in ToolTurn.ISSUE_KINDS + ("dropped", "failed")},
    }


@dataclass
class RunningTally:
    """The live progress line's figures as sums, so that a long run holds no records in memory
    (they are on disk as they land) and each update costs the same."""

    failed: int = 0
    completion_tokens: int = 0
    reward_sum: float = 0.0
    scored: int = 0

    def add(self, record: dict[str, Any]) -> None:
        self.failed += record["status"] in ("infra_error", "error")
        self.completion_tokens += record.get("completion_tokens") or 0
        if record.get("reward") is not None:
            self.reward_sum += record["reward"]
            self.scored += 1

    def line(self, running: int, elapsed_s: float) -> str:
        """Sessions running and failed, completion tokens per second, the reward so far."""
        reward = f"{self.reward_sum / self.scored:.3f}" if self.scored else "-"
        rate = self.completion_tokens / max(elapsed_s, 1e-9)
        return f"running {running}  failed {self.failed}  {rate:.0f} tok/s  reward {reward}"


def print_summary(summary: dict[str, Any], console: Console | None = None) -> None:
    table = Table(title="rollout summary", show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        table.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))
    (console or Console()).print(table)
