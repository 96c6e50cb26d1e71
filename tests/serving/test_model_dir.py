"""A model folder that cannot be served fails before any engine starts, naming the fault."""

import json
import shutil

import pytest

from rollfleet.paths import ROOT
from serving import ModelConfig, ServingError
from serving.model_dir import engine_stop_ids, resolve_model_dir
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


def test_the_stop_tokens_are_the_engines(model_dir):
    """The tokenizer's end of sequence and every `eos_token_id` of both configs, as vLLM stops
    on them; an int or a list, either file."""
    config = json.loads((model_dir / "config.json").read_text())
    generation = json.loads((model_dir / "generation_config.json").read_text())
    want = {config["eos_token_id"]} if isinstance(config["eos_token_id"], int) else set(
        config["eos_token_id"])
    want |= set(generation["eos_token_id"])
    assert engine_stop_ids(model_dir) == sorted(want) and len(want) >= 3
    (model_dir / "generation_config.json").unlink()
    config["eos_token_id"] = 7
    (model_dir / "config.json").write_text(json.dumps(config))
    assert engine_stop_ids(model_dir) == [7]
