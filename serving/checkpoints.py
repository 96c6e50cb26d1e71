"""Policy checkpoints: each version's weights, its identity, and which ones a run keeps.

A version's identity is a content hash of its weight files (`digest`), so that a record says
exactly which weights sampled it and a trainer can re-score it against them (scripts/rescore.py).
Every engine reports `label` (version and digest) back after an update, and the KV tier keys
its blocks by it (serving/engine/kvtier/connector.py reads the served policy file the cluster
writes, `write_served`): the cluster is the one owner of the served version.

Weights a trainer hands over in memory are checked against the served model first and only then
written, once, into the run folder (`<run>/policy/checkpoints/v<N>`), where every engine's loader
reads them. Retention: the last `keep_last` versions, every `keep_every`-th, and always the
served one and the one an update in progress would roll back to; a checkpoint folder a trainer
wrote itself is referenced, never deleted. `index.json` lists what is kept, for re-scoring.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rollfleet.run_dir import RunDir
from serving.errors import ServingError

DIGEST_CHARS = 16  # of the sha256 in labels and tier keys


class PolicyUpdateError(ServingError):
    """An update the fleet refused or could not finish; the message names what and where."""


@dataclass(frozen=True)
class PolicyCheckpoint:
    """One version of the policy: where its weights are, and what they are."""

    version: int
    path: str  # a folder an engine loads (config, tokenizer and weights); "": none, the
    # weights came from a trainer's ranks (serving/weight_transfer.py) and only it keeps them
    digest: str  # sha256 over the weight files' names and bytes, or the transfer plan's

    @property
    def label(self) -> str:
        """What every engine serving it reports as its weight version."""
        return f"{self.version}:{self.digest[:DIGEST_CHARS]}"


def weight_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def model_files(like: Path) -> list[Path]:
    """The served model's files other than its weights (config, tokenizer, ...): what new
    weights need beside them to be a folder an engine loads."""
    return sorted(f for f in like.iterdir() if f.is_file() and f.suffix != ".safetensors"
                  and f.name != "model.safetensors.index.json")


def save_model_folder(like: Path, folder: Path, tensors: Mapping[str, Any]) -> None:
    """New weights as a model folder an engine, or transformers, loads: one model.safetensors
    with `like`'s other files copied beside it."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    for f in model_files(like):
        shutil.copy2(f, folder / f.name)
    save_file({k: v.detach().contiguous() for k, v in tensors.items()},
              str(folder / "model.safetensors"))


def digest_of(folder: Path, cache_dir: Path | None = None) -> str:
    """sha256 over each weight file's name and bytes, in name order. With `cache_dir`, a
    folder whose files (names, sizes, mtimes) are unchanged is not read again."""
    files = weight_files(folder)
    if not files:
        raise PolicyUpdateError(f"checkpoint {folder} has no *.safetensors files")
    stamp = json.dumps([[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns]
                        for f in files])
    cache = cache_dir / "digests.json" if cache_dir else None
    known = json.loads(cache.read_text()) if cache and cache.is_file() else {}
    if stamp in known:
        return known[stamp]
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0")
        with f.open("rb") as stream:
            h.update(hashlib.file_digest(stream, "sha256").digest())
    digest = h.hexdigest()
    if cache:
        cache.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(cache, json.dumps({**known, stamp: digest}))
    return digest


# -- checking new weights against the served model ------------------------------------------------

def _header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """A safetensors file's tensors: name -> (dtype, shape), read from its header alone."""
    with path.open("rb") as f:
        size = int.from_bytes(f.read(8), "little")
        if not 0 < size < 100 << 20:
            raise ValueError(f"header of {size} bytes")
        header = json.loads(f.read(size))
    data = path.stat().st_size - 8 - size
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        end = info["data_offsets"][1]
        if end > data:
            raise ValueError(f"tensor {name} ends at byte {end}, past the file's {data}")
        out[name] = (info["dtype"], tuple(info["shape"]))
    return out


def tensors_of(folder: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Every tensor of a checkpoint folder's safetensors files, with dtype and shape."""
    files = weight_files(folder)
    if not files:
        raise PolicyUpdateError(f"checkpoint {folder} has no *.safetensors files")
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for file in files:
        try:
            out.update(_header(file))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise PolicyUpdateError(f"checkpoint file {file} cannot be read: {exc}") from None
    return out


# safetensors' dtype names -> torch's (the one table: headers read here, rows sent over the wire)
SAFETENSORS_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64",
                      "I64": "int64", "I32": "int32", "I8": "int8", "U8": "uint8", "BOOL": "bool",
                      "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
_DTYPES = {f"torch.{t}": s for s, t in SAFETENSORS_DTYPES.items()}


def check_tensors(want: dict[str, tuple[str, tuple[int, ...]]],
                  have: dict[str, tuple[str, tuple[int, ...]]], what: str) -> None:
    """PolicyUpdateError naming the first tensor that does not fit the served model (missing,
    extra, another shape or dtype)."""
    missing = sorted(set(want) - set(have))
    if missing:
        raise PolicyUpdateError(f"{what} lacks tensor {missing[0]} ({len(missing)} missing)")
    extra = sorted(set(have) - set(want))
    if extra:
        raise PolicyUpdateError(f"{what} has tensor {extra[0]}, which the served model does "
                                f"not ({len(extra)} extra)")
    for name, (dtype, shape) in want.items():
        if have[name][1] != shape:
            raise PolicyUpdateError(f"{what}: tensor {name} has shape {list(have[name][1])}, "
                                    f"the served model {list(shape)}")
        if have[name][0] != dtype:
            raise PolicyUpdateError(f"{what}: tensor {name} is {have[name][0]}, the served "
                                    f"model's is {dtype}")


def check_checkpoint(served: Path, checkpoint: Path) -> None:
    """A checkpoint folder against the served model; nothing is loaded anywhere before this
    passes."""
    if not checkpoint.is_dir():
        raise PolicyUpdateError(f"checkpoint {checkpoint} is not a folder")
    check_tensors(tensors_of(served), tensors_of(checkpoint), f"checkpoint {checkpoint}")


def check_in_memory(served: Path, tensors: dict[str, Any]) -> None:
    """Tensors handed over in memory against the served model, before a byte is written."""
    have = {name: (_DTYPES.get(str(t.dtype), str(t.dtype)), tuple(t.shape))
            for name, t in tensors.items()}
    check_tensors(tensors_of(served), have, "the new weights")


# -- the store -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Retention:
    """Which versions a run keeps besides the served one and a rollback target."""

    keep_last: int = 2  # the newest versions
    keep_every: int | None = None  # and every version divisible by it (null: none)

    def keeps(self, version: int, versions: list[int]) -> bool:
        """Whether `version` stays, of `versions` (sorted)."""
        if self.keep_last > 0 and version in versions[-self.keep_last:]:
            return True
        return self.keep_every is not None and version % self.keep_every == 0


class CheckpointStore:
    """The run's policy checkpoints (see the module docstring); `served` is version 0's."""

    def __init__(self, run_dir: Path, served: PolicyCheckpoint, retention: Retention) -> None:
        self.root = RunDir(run_dir).checkpoints
        self.root.mkdir(parents=True, exist_ok=True)
        self.like = Path(served.path)  # the served model's folder: its other files are copied
        self.retention = retention
        self.kept: dict[int, PolicyCheckpoint] = {served.version: served}
        self._write_index()

    def owns(self, checkpoint: PolicyCheckpoint) -> bool:
        """Whether the store wrote it (and so may delete it)."""
        return bool(checkpoint.path) and Path(checkpoint.path).parent == self.root

    def from_tensors(self, tensors: dict[str, Any], version: int) -> PolicyCheckpoint:
        """Checked, then written once as a folder an engine loads."""
        check_in_memory(self.like, tensors)
        folder = self.root / f"v{version}"
        if folder.exists():
            shutil.rmtree(folder)
        scratch = Path(tempfile.mkdtemp(prefix=f".v{version}-", dir=self.root))
        try:
            save_model_folder(self.like, scratch, tensors)
            os.replace(scratch, folder)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        return self._add(version, folder)

    def from_folder(self, checkpoint: Path, version: int) -> PolicyCheckpoint:
        """A trainer's folder, checked and used in place (its weights alone become a folder
        an engine loads, with the served model's other files linked beside them)."""
        checkpoint = checkpoint.absolute()
        check_checkpoint(self.like, checkpoint)
        if not (checkpoint / "config.json").is_file():
            folder = self.root / f"v{version}"
            if folder.exists():
                shutil.rmtree(folder)
            folder.mkdir()
            for f in weight_files(checkpoint):
                (folder / f.name).symlink_to(f)
            for f in model_files(self.like):
                (folder / f.name).symlink_to(f.absolute())
            checkpoint = folder
        return self._add(version, checkpoint)

    def from_transfer(self, schema: dict[str, tuple[str, tuple[int, ...]]], digest: str,
                      version: int) -> PolicyCheckpoint:
        """Weights a trainer's ranks send (their plan's tensors and digest), checked: listed,
        with no folder."""
        check_tensors(tensors_of(self.like), schema, "the new weights")
        return self._add(version, None, digest)

    def _add(self, version: int, folder: Path | None, digest: str = "") -> PolicyCheckpoint:
        checkpoint = (PolicyCheckpoint(version, str(folder), digest_of(folder)) if folder
                      else PolicyCheckpoint(version, "", digest))
        self.kept[version] = checkpoint
        self._write_index()
        return checkpoint

    def discard(self, checkpoint: PolicyCheckpoint, served: PolicyCheckpoint) -> None:
        """A version that was refused or rolled back: gone unless it is the served one."""
        if checkpoint.version != served.version:
            self._forget(checkpoint)
        self._write_index()

    def retain(self, served: PolicyCheckpoint, rollback: PolicyCheckpoint | None = None) -> None:
        """Apply the retention policy to what the store wrote; `served` and `rollback` always
        stay (a folder it did not write is only referenced, and stays listed)."""
        versions = sorted(self.kept)
        for version, checkpoint in list(self.kept.items()):
            if version in (served.version, rollback.version if rollback else None):
                continue
            if self.owns(checkpoint) and not self.retention.keeps(version, versions):
                self._forget(checkpoint)
        self._write_index()

    def get(self, version: int) -> PolicyCheckpoint | None:
        return self.kept.get(version)

    def _forget(self, checkpoint: PolicyCheckpoint) -> None:
        self.kept.pop(checkpoint.version, None)
        if self.owns(checkpoint):
            shutil.rmtree(checkpoint.path, ignore_errors=True)

    def _write_index(self) -> None:
        _write_atomic(self.root / "index.json", json.dumps(
            {str(v): asdict(c) for v, c in sorted(self.kept.items())}, indent=1))


def read_index(run_dir: Path) -> dict[int, PolicyCheckpoint]:
    """A run's kept checkpoints by version ({} if it never updated)."""
    index = RunDir(run_dir).checkpoints / "index.json"
    if not index.is_file():
        return {}
    return {int(v): PolicyCheckpoint(**c) for v, c in json.loads(index.read_text()).items()}


# -- the served policy, for the engines' KV-tier connectors ------------------------------------

def write_served(run_dir: Path, checkpoint: PolicyCheckpoint) -> Path:
    """The served policy's file (atomic): the tier connectors key their blocks by it."""
    path = RunDir(run_dir).served_policy
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(path, json.dumps(asdict(checkpoint)))
    return path


def read_served(path: str | Path) -> PolicyCheckpoint:
    return PolicyCheckpoint(**json.loads(Path(path).read_text()))


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
