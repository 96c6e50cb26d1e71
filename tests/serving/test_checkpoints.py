"""Policy checkpoints: identity by content, new weights checked before a byte is written, and
retention that never deletes the served checkpoint or the one an update would roll back to."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from rollfleet.paths import ROOT
from rollfleet.run_dir import RunDir
from serving.checkpoints import (
    CheckpointStore,
    PolicyCheckpoint,
    PolicyUpdateError,
    Retention,
    digest_of,
    read_index,
    read_served,
    save_model_folder,
    tensors_of,
    write_served,
)
from serving.tiny_model import ensure_tiny_glm

SERVED = ensure_tiny_glm(ROOT / ".cache" / "models")


@pytest.fixture(scope="module")
def weights():
    return load_file(str(SERVED / "model.safetensors"))


@pytest.fixture
def store(tmp_path):
    served = PolicyCheckpoint(0, str(SERVED), digest_of(SERVED))
    return CheckpointStore(tmp_path, served, Retention(keep_last=1)), served


def _on_disk(checkpoint):
    return Path(checkpoint.path).is_dir()


def _moved(weights, seed):
    gen = torch.Generator().manual_seed(seed)
    return {k: (v.float() + torch.randn(v.shape, generator=gen)).to(v.dtype)
            for k, v in weights.items()}


def test_the_digest_is_the_weights_bytes_and_a_cache_never_hides_a_change(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(SERVED, a)
    shutil.copytree(SERVED, b)
    (b / "config.json").write_text("{}")  # not weights: same identity
    assert digest_of(a, tmp_path / "cache") == digest_of(b) == digest_of(SERVED)
    data = bytearray((a / "model.safetensors").read_bytes())
    data[-1] ^= 1  # one bit of one weight
    (a / "model.safetensors").write_bytes(bytes(data))
    assert digest_of(a, tmp_path / "cache") != digest_of(b)


def test_new_weights_are_checked_before_anything_is_written(store, weights, tmp_path):
    store, _ = store
    bad = dict(weights)
    bad["lm_head.weight"] = bad["lm_head.weight"][:10]
    with pytest.raises(PolicyUpdateError, match=r"lm_head.weight has shape \[10, 256\]"):
        store.from_tensors(bad, 1)
    assert not (RunDir(tmp_path).checkpoints / "v1").exists()
    ok = store.from_tensors(_moved(weights, 1), 1)
    assert (ok.version, ok.digest) == (1, digest_of(RunDir(tmp_path).checkpoints / "v1"))
    folder = RunDir(tmp_path).checkpoints / "v1"
    assert (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()


def test_weights_alone_become_a_folder_an_engine_loads(store, weights, tmp_path):
    store, _ = store
    own = tmp_path / "trainer-step-3"
    own.mkdir()
    shutil.copy(SERVED / "model.safetensors", own / "model.safetensors")
    got = store.from_folder(own, 3)
    folder = RunDir(tmp_path).checkpoints / "v3"
    assert got.path == str(folder) and (folder / "config.json").is_file()
    assert (folder / "model.safetensors").resolve() == (own / "model.safetensors").resolve()
    whole = tmp_path / "whole"
    shutil.copytree(SERVED, whole)
    assert store.from_folder(whole, 4).path == str(whole)  # used in place


def test_a_trainer_s_saved_version_is_the_folder_the_store_writes_for_the_same_weights(
        store, weights, tmp_path):
    store, _ = store
    changed = {k: v + 1 if k.endswith("norm.weight") else v for k, v in weights.items()}
    saved = tmp_path / "kept" / "v5"
    save_model_folder(SERVED, saved, changed)
    written = Path(store.from_tensors(changed, 5).path)
    assert sorted(f.name for f in saved.iterdir()) == sorted(f.name for f in written.iterdir())
    assert not any(f.is_symlink() for f in saved.iterdir())  # copies: it outlives the run
    assert (saved / "config.json").read_bytes() == (SERVED / "config.json").read_bytes()
    assert digest_of(saved) == digest_of(written) != digest_of(SERVED)
    got = load_file(str(saved / "model.safetensors"))
    assert all(torch.equal(got[k], v) for k, v in changed.items())


def test_a_refused_then_a_failed_update_keeps_the_served_and_rollback_checkpoints(
        store, weights):
    """The sequence that once lost the rollback target: v1 served, v2 refused by the fleet,
    v3 written and failing; v1 must still be there to go back to."""
    store, v0 = store
    v1 = store.from_tensors(_moved(weights, 1), 1)
    store.retain(v1)
    v2 = store.from_tensors(_moved(weights, 2), 2)
    store.discard(v2, served=v1)  # refused
    v3 = store.from_tensors(_moved(weights, 3), 3)
    assert all(_on_disk(c) for c in (v1, v3))
    store.discard(v3, served=v1)  # failed: back on v1
    assert _on_disk(v1) and not _on_disk(v2) and not _on_disk(v3)
    assert sorted(read_index(store.root.parent.parent)) == [0, 1]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 3), st.sampled_from([None, 2, 3]), st.integers(1, 9))
def test_retention_keeps_the_served_the_rollback_the_last_and_every_kth(keep_last, every, n):
    versions = list(range(n + 1))
    policy = Retention(keep_last, every)
    for v in versions:
        want = v in versions[-keep_last:] if keep_last else False
        want = want or (every is not None and v % every == 0)
        assert policy.keeps(v, versions) == want


def test_the_store_never_deletes_a_folder_it_did_not_write(store, weights, tmp_path):
    store, v0 = store
    v1 = store.from_tensors(_moved(weights, 1), 1)
    v2 = store.from_tensors(_moved(weights, 2), 2)
    store.retain(v2, rollback=v1)
    assert _on_disk(v1) and _on_disk(v2) and _on_disk(v0)
    store.retain(v2)  # keep_last=1: v1 goes, v0 (the model folder) is only referenced
    assert not _on_disk(v1) and _on_disk(v0)
    index = json.loads((store.root / "index.json").read_text())
    assert sorted(index) == ["0", "2"]


def test_the_served_policy_file_is_what_the_cluster_wrote(tmp_path):
    v = PolicyCheckpoint(7, "/x", "c" * 64)
    assert read_served(write_served(tmp_path, v)) == v
    assert v.label == "7:" + "c" * 16


def test_a_folder_that_is_not_one_or_does_not_fit_is_refused_naming_it(store, tmp_path):
    store, _ = store
    with pytest.raises(PolicyUpdateError, match=rf"^checkpoint {tmp_path}/gone is not a folder$"):
        store.from_folder(tmp_path / "gone", 5)
    (tmp_path / "other").mkdir()
    save_file({"x": torch.zeros(1)}, str(tmp_path / "other" / "model.safetensors"))
    with pytest.raises(PolicyUpdateError, match=rf"^checkpoint {tmp_path}/other lacks tensor "):
        store.from_folder(tmp_path / "other", 5)


def test_a_version_handed_over_again_as_a_folder_replaces_its_links(store, tmp_path):
    """A retried update: v3's folder is made anew, the served model's other files linked."""
    store, _ = store
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        shutil.copy(SERVED / "model.safetensors", tmp_path / name / "model.safetensors")
        got = store.from_folder(tmp_path / name, 3)
    folder = Path(got.path)
    assert (folder / "model.safetensors").resolve() == (tmp_path / "second" /
                                                        "model.safetensors").resolve()
    assert (folder / "config.json").is_symlink() and store.get(3) == got


def test_weights_from_ranks_are_listed_by_their_plan_s_digest_once_their_tensors_fit(store,
                                                                                   tmp_path):
    store, _ = store
    schema = tensors_of(SERVED)
    got = store.from_transfer(schema, "d" * 64, 5)
    assert got == PolicyCheckpoint(5, "", "d" * 64) and store.get(5) == got
    assert read_index(tmp_path)[5] == got
    schema.pop("lm_head.weight")
    with pytest.raises(PolicyUpdateError, match=r"^the new weights lacks tensor lm_head.weight"):
        store.from_transfer(schema, "e" * 64, 6)
    assert store.get(6) is None


def test_the_served_policy_file_is_written_into_a_new_run_folder_and_over_itself(tmp_path):
    run = tmp_path / "new" / "run"
    write_served(run, PolicyCheckpoint(1, "/x", "a" * 64))
    v2 = PolicyCheckpoint(2, "/y", "b" * 64)
    assert read_served(write_served(run, v2)) == v2
