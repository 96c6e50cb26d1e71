"""A run folder's layout, in one place: every writer and reader of a run goes through RunDir.

    <run>/data/          records as they land (part-*.parquet), compacted (shard-*.parquet)
    <run>/dataset/       the whole run as one Hugging Face dataset
    <run>/trainer/       the trainer's view (one row per session)
    <run>/corpus/        exported corpora (sft/, tokens/)
    <run>/summary.json   the summary's figures
    <run>/logs/          the engines' and servers' logs (`log(name)`: logs/<name>.log)
    <run>/dynamo/        Dynamo's control plane: file discovery, etcd's data, its processes' HOME
    <run>/kvtier/        the Mooncake KV tier's master and store (their logs, the store's files)
    <run>/policy/        RL: served.json (the served policy version), checkpoints/ (v<N>/ and
                         index.json: the versions kept, serving/checkpoints.py)
    <run>/.hydra/        the resolved config and the overrides (Hydra writes them)
    <run>/wandb/         the wandb run
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def data(self) -> Path:
        return self.path / "data"

    @property
    def dataset(self) -> Path:
        return self.path / "dataset"

    @property
    def trainer(self) -> Path:
        return self.path / "trainer"

    @property
    def corpus(self) -> Path:
        return self.path / "corpus"

    @property
    def summary_file(self) -> Path:
        return self.path / "summary.json"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    def log(self, name: str) -> Path:
        """The log file of one process the run started (`engine-0`, `worker-agg1`, ...)."""
        return self.logs / f"{name}.log"

    @property
    def dynamo(self) -> Path:
        return self.path / "dynamo"

    @property
    def discovery(self) -> Path:
        """Dynamo's file discovery (one host): every worker registers here."""
        return self.dynamo / "discovery"

    @property
    def kvtier(self) -> Path:
        return self.path / "kvtier"

    @property
    def policy(self) -> Path:
        return self.path / "policy"

    @property
    def checkpoints(self) -> Path:
        return self.policy / "checkpoints"

    @property
    def served_policy(self) -> Path:
        return self.policy / "served.json"

    @property
    def config_file(self) -> Path:
        return self.path / ".hydra" / "config.yaml"

    @property
    def overrides_file(self) -> Path:
        return self.path / ".hydra" / "overrides.yaml"

    def summary(self) -> dict[str, Any]:
        """The summary's figures ({} before the run has ended once)."""
        return json.loads(self.summary_file.read_text()) if self.summary_file.is_file() else {}

    def write_summary(self, figures: dict[str, Any]) -> None:
        self.summary_file.write_text(json.dumps(figures, indent=2) + "\n")

    def require_dataset(self) -> Path:
        """The dataset folder; FileNotFoundError saying what the folder is not."""
        if not self.dataset.is_dir():
            raise FileNotFoundError(f"{self.path} is not a finished run folder (no dataset/)")
        return self.dataset
