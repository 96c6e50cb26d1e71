"""A session's private copy of a task repository, and commands run inside it with limits."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CommandResult:
    exit_code: int | None  # None: killed at the timeout
    output: str
    timed_out: bool


class Workspace:
    """A temporary folder holding a copy of the repository; removed on `close()`."""

    def __init__(self, source: Path, root: Path | None = None, prefix: str = "ws-") -> None:
        root = root or Path(tempfile.gettempdir())
        root.mkdir(parents=True, exist_ok=True)
        self.path = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
        shutil.copytree(source, self.path, dirs_exist_ok=True, symlinks=True)

    def resolve(self, rel: str) -> Path:
        """A path inside the workspace; refuses anything that escapes it."""
        target = (self.path / rel).resolve()
        if target != self.path and self.path not in target.parents:
            raise PermissionError(f"path {rel!r} is outside the repository")
        return target

    def run(self, argv: list[str], timeout_s: float, max_output: int) -> CommandResult:
        """Run a command in the workspace; on timeout its whole process group is killed."""
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.path),
               "PYTHONPATH": str(self.path), "PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8"}
        proc = subprocess.Popen(argv, cwd=self.path, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            out, _ = proc.communicate()
            timed_out = True
        finally:
            _kill_group(proc.pid)
        text = out.decode("utf-8", errors="replace")
        return CommandResult(None if timed_out else proc.returncode,
                             truncate(text, max_output), timed_out)

    def python(self) -> str:
        return sys.executable

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def truncate(text: str, limit: int) -> str:
    """Keep the head and tail of long output, with a marker saying how much was cut."""
    if len(text) <= limit:
        return text
    head, tail = limit * 2 // 3, limit // 3
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} characters truncated ...]\n{text[-tail:]}"
