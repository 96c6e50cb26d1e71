"""The serving cluster as one context manager: start everything, hand out an Endpoint, stop all."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx

from serving.config import ModelConfig, ServingConfig, ServingError
from serving.endpoint import Endpoint
from serving.tiny_model import ensure_tiny_glm
from serving.toolcall import SPECIAL_TOKENS
from serving.vllm_engine import VllmEngine

log = logging.getLogger(__name__)
MODES = ("embedded", "external")


def resolve_model_dir(model: ModelConfig, cache_dir: Path) -> Path:
    """The model folder to serve: the configured path, or the generated tiny GLM model."""
    if model.path is None:
        return ensure_tiny_glm(cache_dir / "models")
    path = Path(model.path).expanduser()
    if not path.is_dir():
        raise ServingError(f"model path {path} does not exist (model.path); "
                           "point it at a local model folder, or null for the tiny GLM model")
    if not (path / "config.json").is_file():
        raise ServingError(f"model path {path} has no config.json; is it a model folder?")
    return path


def markup_token_ids(root_url: str, model: str,
                     headers: dict[str, str] | None = None) -> dict[str, int]:
    """Ask the server's /tokenize which single token each tool-call markup string is.

    Markup that is not one token (or a server without /tokenize) is left out: the project's
    tool-call grammar then refuses to build, with the missing markup named.
    """
    ids: dict[str, int] = {}
    for text in SPECIAL_TOKENS:
        try:
            resp = httpx.post(f"{root_url}/tokenize", headers=headers, timeout=10.0,
                              json={"model": model, "prompt": text, "add_special_tokens": False})
            tokens = resp.json().get("tokens") if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            tokens = None
        if tokens and len(tokens) == 1:
            ids[text] = tokens[0]
    return ids


class Cluster:
    """`with Cluster(...) as endpoint:` runs the configured servers for the block's duration."""

    def __init__(self, serving: ServingConfig, model: ModelConfig, run_dir: Path,
                 cache_dir: Path) -> None:
        if serving.mode not in MODES:
            raise ServingError(f"unknown serving.mode {serving.mode!r}; expected one of {MODES}")
        self.serving = serving
        self.model = model
        self.run_dir = run_dir
        self.cache_dir = cache_dir
        self.engines: list[VllmEngine] = []

    def __enter__(self) -> Endpoint:
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    def _start(self) -> Endpoint:
        if self.serving.mode == "external":
            return self._external()
        model_dir = resolve_model_dir(self.model, self.cache_dir)
        engine = VllmEngine("0", model_dir, self.model, self.serving, self.run_dir,
                            self.cache_dir, port=self.serving.port)
        self.engines.append(engine)
        log.info("starting vLLM engine %s on %s (model %s)", engine.engine_id, engine.base_url,
                 model_dir)
        engine.start()
        return Endpoint(
            markup_token_ids=markup_token_ids(engine.base_url, self.model.name),
            base_url=f"{engine.base_url}/v1", model=self.model.name,
            token_ids="vllm", enable_thinking=self.model.enable_thinking,
            request_timeout_s=self.serving.request_timeout_s,
            engine_ids=(engine.engine_id,),
            metrics_urls={engine.engine_id: f"{engine.base_url}/metrics"},
        )

    def _external(self) -> Endpoint:
        url = (self.serving.base_url or "").rstrip("/")
        if not url:
            raise ServingError("serving.mode=external needs serving.base_url "
                               "(e.g. serving.base_url=http://127.0.0.1:8000/v1)")
        headers = {"Authorization": f"Bearer {self.serving.api_key}"}
        try:
            resp = httpx.get(f"{url}/models", headers=headers, timeout=10.0)
            resp.raise_for_status()
        except httpx.HTTPError as exc:
            raise ServingError(f"external server {url} does not answer: "
                               f"{type(exc).__name__}: {exc}") from None
        served = [m["id"] for m in resp.json().get("data", [])]
        if served and self.model.name not in served:
            raise ServingError(f"external server {url} does not serve model "
                               f"{self.model.name!r}; it serves {served}")
        root = url.removesuffix("/v1")
        return Endpoint(markup_token_ids=markup_token_ids(root, self.model.name, headers),
                        base_url=url, model=self.model.name, api_key=self.serving.api_key,
                        token_ids="vllm", enable_thinking=self.model.enable_thinking,
                        request_timeout_s=self.serving.request_timeout_s)

    def stop(self) -> None:
        while self.engines:
            engine = self.engines.pop()
            log.info("stopping engine %s", engine.engine_id)
            engine.stop()
