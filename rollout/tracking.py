"""Run logging: wandb (offline unless configured otherwise), per rollout and at the end."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class LoggerConfig:
    # wandb, or none: no run logging
    backend: str = field(default="wandb", metadata={"choices": ("wandb", "none")})
    # wandb's mode: offline writes RUN_DIR/wandb, online uploads
    mode: str = field(default="offline", metadata={"choices": ("online", "offline", "disabled")})
    project: str = "rollfleet"  # the wandb project
    entity: str | None = None  # the wandb entity (team); null: the account's default
    tags: list[str] | None = None  # the wandb run's tags


class RunLogger:
    def __init__(self, cfg: LoggerConfig, run_dir: Path, run_name: str,
                 config: dict[str, Any]) -> None:
        self.run = None
        if cfg.backend == "none" or cfg.mode == "disabled":
            return
        if cfg.backend != "wandb":
            raise ValueError(f"unknown logger.backend {cfg.backend!r}; expected wandb or none")
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")
        self.run = wandb.init(
            project=cfg.project, entity=cfg.entity, name=run_name, dir=str(run_dir),
            mode=cfg.mode, config=config, tags=cfg.tags,
            settings=wandb.Settings(console="off", x_disable_stats=True),
        )
        self.step = 0

    def log_record(self, record: dict[str, Any]) -> None:
        if self.run is None:
            return
        self.step += 1
        self.run.log({
            "rollout/reward": record.get("reward") or 0.0,
            "rollout/ok": float(record.get("status") == "ok"),
            "rollout/infra_error": float(record.get("status") == "infra_error"),
            "rollout/turns": record.get("num_turns") or 0,
            "rollout/completion_tokens": record.get("completion_tokens") or 0,
            "rollout/invalid_tool_calls": record.get("num_invalid_tool_calls") or 0,
        }, step=self.step)

    def log_step(self, row: dict[str, Any]) -> None:
        """One trainer step's figures (rollout/rl/reinforce.py), numbers and the lag histogram."""
        if self.run is None:
            return
        self.step += 1
        data = {f"train/{k}": v for k, v in row.items()
                if isinstance(v, int | float) and not isinstance(v, bool)}
        data.update({f"train/lag_{lag}": n for lag, n in row.get("lags", {}).items()})
        self.run.log(data, step=self.step)

    def finish(self, summary: dict[str, Any] | None) -> None:
        if self.run is None:
            return
        if summary:
            self.run.summary.update(summary)
        self.run.finish(exit_code=0 if summary else 1)
        self.run = None
