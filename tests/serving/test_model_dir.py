"""A model folder that cannot be served fails before any engine starts, naming the fault."""

import json
import shutil

import pytest

from rollfleet.paths import ROOT
from serving import ModelConfig, ServingError
from serving.model_dir import resolve_model_dir
from serving.tiny_model import ensure_tiny_glm


@pytest.fixture
def model_dir(tmp_path):
    """A copy of the tiny model's folder, to break."""
    return shutil.copytree(ensure_tiny_glm(ROOT / ".cache" / "models"),
                           tmp_path / "model")


def _resolve(path):
    return resolve_model_dir(ModelConfig(path=str(path)), path.parent)


def test_a_whole_folder_resolves_to_its_absolute_path(model_dir, monkeypatch):
    monkeypatch.chdir(model_dir.parent)
    assert _resolve(model_dir.relative_to(model_dir.parent)) == model_dir.absolute()


def test_missing_folder_or_config(tmp_path):
    with pytest.raises(ServingError, match="does not exist"):
        _resolve(tmp_path / "nope")
    with pytest.raises(ServingError, match="no config.json"):
        _resolve(tmp_path)


@pytest.mark.parametrize(("break_it", "message"), [
    (lambda d: (d / "config.json").write_text("{not json"), "config.json is not valid JSON"),
    (lambda d: (d / "config.json").write_text("{}"), "names no model"),
    (lambda d: (d / "tokenizer.json").unlink(), "no tokenizer.json"),
    (lambda d: (d / "tokenizer.json").write_text('{"version": "1.0", "model": 7}'),
     "does not load as a tokenizer"),
    (lambda d: (d / "model.safetensors").unlink(), r"no weights \(\*.safetensors"),
    (lambda d: (d / "model.safetensors").write_bytes(
        (d / "model.safetensors").read_bytes()[:4096]), "model.safetensors cannot be read"),
    (lambda d: (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"w": "model-00002-of-00002.safetensors"}})), "lacks weight files"),
])
def test_a_broken_folder_names_its_fault(model_dir, break_it, message):
    break_it(model_dir)
    with pytest.raises(ServingError, match=message):
        _resolve(model_dir)
