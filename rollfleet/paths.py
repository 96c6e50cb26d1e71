"""Where the project's own files are, found once from this file's place."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the checkout (an editable install's source)
CONF = ROOT / "conf"  # the Hydra configs of every command


def cache_dir(configured: str | None) -> Path:
    """The cache folder (generated model, vLLM and compiler caches): `cache_dir` as
    configured (relative to where the command started), else the project's `.cache`."""
    return Path(configured).absolute() if configured else ROOT / ".cache"
