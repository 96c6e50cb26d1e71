"""The sandbox launcher (envs/launch.c), compiled on first use into the project's cache.

Every sandbox start goes through it, so it must cost next to nothing: one small C program
instead of the shell, prlimit, unshare, shell, mount and umount it replaces (12.0 against 24.7
ms of CPU per start at 1,000 open sessions, bench/sandbox_launcher.json). It is built per
source text (a changed launch.c builds anew) by whichever process needs it first; others that
race it find the finished binary, renamed into place whole.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
from pathlib import Path

from rollfleet.paths import ROOT

SOURCE = Path(__file__).with_name("launch.c")
BUILDS = ROOT / ".cache" / "launch"
_built: Path | None = None
_lock = threading.Lock()


def launcher_path() -> Path:
    """The launcher's binary, built now if this source has none yet."""
    global _built
    with _lock:
        if _built is None:
            _built = build(SOURCE, BUILDS)
        return _built


def build(source: Path, builds: Path) -> Path:
    """`source` compiled into `builds`/<its hash>/, unless it is there already."""
    binary = builds / hashlib.sha256(source.read_bytes()).hexdigest()[:16] / "rollfleet-launch"
    if binary.exists():
        return binary
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise OSError("the sandbox launcher (envs/launch.c) needs a C compiler: none named cc "
                      "or gcc on PATH (scripts/setup.sh installs gcc)")
    binary.parent.mkdir(parents=True, exist_ok=True)
    partial = binary.with_name(f".{binary.name}.{os.getpid()}.{threading.get_ident()}")
    built = subprocess.run([cc, "-O2", "-o", str(partial), str(source)],
                           capture_output=True, text=True)
    if built.returncode != 0:
        partial.unlink(missing_ok=True)
        raise OSError(f"building the sandbox launcher with {cc} failed:\n{built.stderr[-2000:]}")
    os.replace(partial, binary)
    return binary
