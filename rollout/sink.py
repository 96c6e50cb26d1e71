"""Records to disk: parquet shards written atomically as rollouts finish, one dataset at the end.

A run killed midway keeps every shard already written; a rerun with the same output folder
skips the rollouts those shards hold (their rollout ids are the resume keys).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from datasets import Dataset, concatenate_datasets

from rollout.record import FEATURES


class RecordSink:
    def __init__(self, run_dir: Path, shard_size: int = 64) -> None:
        self.data_dir = run_dir / "data"
        self.dataset_dir = run_dir / "dataset"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.shard_size = shard_size
        self.buffer: list[dict[str, Any]] = []
        self.schema = FEATURES.arrow_schema

    def shards(self) -> list[Path]:
        return sorted(self.data_dir.glob("shard-*.parquet"))

    def done_ids(self) -> set[str]:
        """Rollout ids already on disk with a final status (infra errors are retried)."""
        done: set[str] = set()
        for shard in self.shards():
            table = pq.read_table(shard, columns=["rollout_id", "status"])
            for rid, status in zip(table["rollout_id"].to_pylist(),
                                   table["status"].to_pylist(), strict=True):
                if status != "infra_error":
                    done.add(rid)
        return done

    def write(self, record: dict[str, Any]) -> None:
        self.buffer.append(FEATURES.encode_example({k: record.get(k) for k in FEATURES}))
        if len(self.buffer) >= self.shard_size:
            self.flush()

    def flush(self) -> None:
        if not self.buffer:
            return
        index = len(self.shards())
        path = self.data_dir / f"shard-{index:05d}.parquet"
        tmp = path.with_suffix(".tmp")
        table = pa.Table.from_pylist(self.buffer, schema=self.schema)
        pq.write_table(table, tmp)
        os.replace(tmp, path)
        self.buffer = []

    def finalize(self) -> Dataset:
        """Flush, then save every shard as one Hugging Face dataset (`load_from_disk`)."""
        self.flush()
        parts = [Dataset.from_parquet(str(s), features=FEATURES, keep_in_memory=True)
                 for s in self.shards()]
        ds = concatenate_datasets(parts) if parts else Dataset.from_list([], features=FEATURES)
        ds = _latest_per_rollout(ds)
        tmp = self.dataset_dir.with_name(self.dataset_dir.name + ".tmp")
        ds.save_to_disk(str(tmp))
        if self.dataset_dir.exists():
            shutil.rmtree(self.dataset_dir)
        os.replace(tmp, self.dataset_dir)
        return ds


def _latest_per_rollout(ds: Dataset) -> Dataset:
    """A resumed run may hold an infra_error record and its later retry: keep the last one."""
    last = {rid: i for i, rid in enumerate(ds["rollout_id"])}
    if len(last) == len(ds):
        return ds
    return ds.select(sorted(last.values()))
