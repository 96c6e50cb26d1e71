"""Records to disk as they land: durable before they count, compacted at the end, resumable.

The rollouts that finished together (the scheduler's commit window) are written as one small
parquet file (to a temporary name, fsynced, renamed, the folder fsynced) before `write`
returns, so a run killed at any moment, even by SIGKILL, keeps every rollout it reported done.
(A file per record cost the driver 2.8 ms of CPU per record, one per ten records 0.6 ms per
record, measured here.) `finalize` compacts those files into shards and saves the whole run as
one Hugging Face dataset. A rerun with the same output folder skips the
rollouts already on disk (their rollout ids are the resume keys).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from datasets import Dataset, DatasetInfo

from rollfleet.run_dir import RunDir
from rollout.record import FEATURES

# A part file lives until `compact` folds it into a shard: no column statistics or dictionaries
# for readers to skip by (5.8 ms of CPU for a part of 15 records with them, 3.5 without).
PART_OPTIONS = {"write_statistics": False, "use_dictionary": False}


class SchemaError(ValueError):
    """A record whose keys are not exactly the schema's: written, it would lose data silently."""


class RecordSink:
    def __init__(self, run_dir: Path, shard_size: int = 64) -> None:
        self.data_dir = RunDir(run_dir).data
        self.dataset_dir = RunDir(run_dir).dataset
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.shard_size = shard_size
        self.schema = FEATURES.arrow_schema
        self.next_part = 1 + max((_index(p) for p in self.parts()), default=-1)

    def shards(self) -> list[Path]:
        return sorted(self.data_dir.glob("shard-*.parquet"))

    def parts(self) -> list[Path]:
        return sorted(self.data_dir.glob("part-*.parquet"))

    def files(self) -> list[Path]:
        """Everything on disk, oldest first (compacted shards, then single records)."""
        return self.shards() + self.parts()

    def done_ids(self) -> set[str]:
        """Rollout ids already on disk with a final status (infra errors are retried)."""
        done: set[str] = set()
        for path in self.files():
            table = pq.read_table(path, columns=["rollout_id", "status"])
            for rid, status in zip(table["rollout_id"].to_pylist(),
                                   table["status"].to_pylist(), strict=True):
                if status != "infra_error":
                    done.add(rid)
        return done

    def write(self, records: list[dict[str, Any]]) -> None:
        """Durably on disk, as one file, when this returns; none of them if one does not fit
        the schema."""
        for record in records:
            extra, missing = set(record) - set(FEATURES), set(FEATURES) - set(record)
            if extra or missing:
                raise SchemaError(
                    f"record {record.get('rollout_id')!r} does not match the schema: "
                    f"unknown keys {sorted(extra)}, missing keys {sorted(missing)}")
        # Plain values only (FEATURES has no image, audio or class label to encode): pyarrow
        # takes the records as they are, where datasets' encode_example walked every token id
        # in Python (0.34 ms of the driver's CPU a record).
        path = self.data_dir / f"part-{self.next_part:08d}.parquet"
        self.next_part += 1
        _write_durably(pa.Table.from_pylist(records, schema=self.schema), path, PART_OPTIONS)

    def compact(self) -> None:
        """Part files -> shards of `shard_size` rows (a part is never split); each part is
        removed only once the shard holding it is on disk."""
        index = 1 + max((_index(p) for p in self.shards()), default=-1)
        group: list[Path] = []
        tables: list[pa.Table] = []
        for part in [*self.parts(), None]:
            if part is not None:
                group.append(part)
                tables.append(pq.read_table(part, schema=self.schema))
            if tables and (part is None or sum(t.num_rows for t in tables) >= self.shard_size):
                _write_durably(pa.concat_tables(tables),
                               self.data_dir / f"shard-{index:05d}.parquet")
                index += 1
                for p in group:
                    p.unlink()
                group, tables = [], []

    def finalize(self) -> Dataset:
        """Compact, then save the latest record of every rollout as one dataset."""
        self.compact()
        # read by pyarrow (datasets' parquet builder took 1.7 s of CPU for 2,050 records)
        tables = [pq.read_table(path, schema=self.schema) for path in self.files()]
        table = pa.concat_tables(tables) if tables else self.schema.empty_table()
        ds = _latest_per_rollout(Dataset(table, info=DatasetInfo(features=FEATURES)))
        tmp = self.dataset_dir.with_name(self.dataset_dir.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        ds.save_to_disk(str(tmp))
        if self.dataset_dir.exists():
            shutil.rmtree(self.dataset_dir)
        os.replace(tmp, self.dataset_dir)
        return ds


def _index(path: Path) -> int:
    return int(path.stem.split("-", 1)[1])


def _write_durably(table: pa.Table, path: Path, options: dict[str, Any] | None = None) -> None:
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp, **(options or {}))
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _latest_per_rollout(ds: Dataset) -> Dataset:
    """A resumed run may hold an infra_error record and its later retry: keep the last one."""
    last = {rid: i for i, rid in enumerate(ds["rollout_id"])}
    if len(last) == len(ds):
        return ds
    return ds.select(sorted(last.values()))
