"""The model folder to serve, checked before any engine starts.

A folder that cannot be served fails here in about a second with what is wrong, instead of
minutes later inside an engine's log: its config must be JSON that names a model, its
tokenizer must load, and its weight files must be there with readable headers.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer

from serving.config import ModelConfig
from serving.errors import ServingError
from serving.tiny_model import ensure_tiny_glm
from serving.toolcall import SPECIAL_TOKENS


def resolve_model_dir(model: ModelConfig, cache_dir: Path) -> Path:
    """The model folder to serve (absolute): the configured path, or the generated tiny GLM
    model; ServingError naming the fault if it cannot be served."""
    if model.path is None:
        return ensure_tiny_glm(cache_dir / "models").absolute()
    path = Path(model.path).expanduser().absolute()
    if not path.is_dir():
        raise ServingError(f"model path {path} does not exist (model.path); "
                           "point it at a local model folder, or null for the tiny GLM model")
    check_model_dir(path)
    return path


def check_model_dir(path: Path) -> None:
    config = path / "config.json"
    if not config.is_file():
        raise ServingError(f"model path {path} has no config.json; is it a model folder?")
    try:
        fields = json.loads(config.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ServingError(f"{config} is not valid JSON: {exc}") from None
    if not isinstance(fields, dict) or not (fields.get("architectures")
                                            or fields.get("model_type")):
        raise ServingError(f"{config} names no model (no architectures or model_type)")
    tokenizer_markup_ids(path)
    _check_weights(path)


def _check_weights(path: Path) -> None:
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        if any(path.glob("*.bin")) or any(path.glob("*.pt")):
            return  # PyTorch checkpoints: vLLM reads them; no cheap header to check
        raise ServingError(f"model folder {path} has no weights (*.safetensors or *.bin)")
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            wanted = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ServingError(f"{index} is not a safetensors index: {exc}") from None
        missing = sorted(wanted - {f.name for f in files})
        if missing:
            raise ServingError(f"model folder {path} lacks weight files its index lists: "
                               f"{missing[:3]}")
    for file in files:
        try:
            with safe_open(str(file), framework="numpy") as f:
                f.keys()
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own kinds
            raise ServingError(f"weight file {file} cannot be read: "
                               f"{type(exc).__name__}: {exc}") from None


def tokenizer_markup_ids(model_dir: Path) -> dict[str, int]:
    """Each tool-call markup string that the model's tokenizer makes into exactly one token ->
    that token. Markup that is not one token is left out: the project's tool-call grammar then
    refuses to build, with the missing markup named."""
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise ServingError(f"model folder {model_dir} has no tokenizer.json: token-in sessions "
                           "render prompts with the model's own tokenizer")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception
        raise ServingError(f"{path} does not load as a tokenizer: {exc}") from None
    ids: dict[str, int] = {}
    for text in SPECIAL_TOKENS:
        tokens = tok.encode(text, add_special_tokens=False).ids
        if len(tokens) == 1:
            ids[text] = tokens[0]
    return ids


def engine_stop_ids(model_dir: Path) -> list[int]:
    """The stop tokens vLLM hands the grammar matcher for a request without stop ids of its
    own: the tokenizer's end-of-sequence token and the generation config's `eos_token_id`s
    (vLLM's `SamplingParams.all_stop_token_ids`)."""
    ids: set[int] = set()
    gen = model_dir / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids.update([eos] if isinstance(eos, int) else eos or [])
    config = json.loads((model_dir / "config.json").read_text())
    eos = config.get("eos_token_id")
    ids.update([eos] if isinstance(eos, int) else eos or [])
    return sorted(ids)
