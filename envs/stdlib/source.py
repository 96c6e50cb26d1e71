"""The installed standard library: where it lives and the exact text of its modules."""

from __future__ import annotations

import hashlib
import platform
import sysconfig
from pathlib import Path


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def python_version() -> str:
    return platform.python_version()


def read_exact(path: Path) -> str:
    """The file's text with its newlines untouched, so spans and hashes stay byte-exact."""
    return path.read_bytes().decode("utf-8")


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
