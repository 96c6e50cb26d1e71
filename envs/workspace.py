"""A session's private copy of a task repository, and commands run inside it, sandboxed."""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from envs.sandbox import SandboxFailure, SandboxPolicy, give_to_sandbox, limit_child, wrap


@dataclass(frozen=True)
class CommandResult:
    exit_code: int | None  # None: killed at the timeout
    output: str
    timed_out: bool


@dataclass(frozen=True)
class Changes:
    """What a session did to its repository: new full text (or None: deleted) per file."""

    files: dict[str, str | None]
    diff: str  # unified diff, for people and corpora

    def apply(self, root: Path) -> None:
        for rel, text in self.files.items():
            target = root / rel
            if text is None:
                target.unlink(missing_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)


class Workspace:
    """A temporary folder holding a copy of the repository; removed on `close()`.

    Command output goes to a file outside the folder, so a flood of output costs disk up to the
    file-size limit, never memory; only its head and tail are read back.
    """

    def __init__(self, populate: Callable[[Path], None], root: Path | None = None,
                 prefix: str = "ws-", policy: SandboxPolicy | None = None) -> None:
        self.policy = policy or SandboxPolicy()
        root = root or Path(tempfile.gettempdir())
        root.mkdir(parents=True, exist_ok=True)
        self.home = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
        self.path = self.home / "repo"
        self.path.mkdir()
        try:
            populate(self.path)
        except BaseException:
            self.close()
            raise
        self.start = _snapshot(self.path)
        give_to_sandbox(self.path, self.policy)

    def changes(self, max_diff_chars: int = 20000) -> Changes:
        """Files changed, added or removed since the workspace was populated."""
        now = _snapshot(self.path)
        files: dict[str, str | None] = {}
        diff: list[str] = []
        for rel in sorted(set(self.start) | set(now)):
            if self.start.get(rel, (None,))[0] == now.get(rel, (None,))[0]:
                continue
            new = now[rel][1] if rel in now else None
            files[rel] = new
            old = self.start[rel][1] if rel in self.start else ""
            diff += difflib.unified_diff(old.splitlines(True), (new or "").splitlines(True),
                                         f"a/{rel}", f"b/{rel}")
        return Changes(files, truncate("".join(diff), max_diff_chars))

    def resolve(self, rel: str) -> Path:
        """A path inside the workspace; refuses anything that escapes it."""
        target = (self.path / rel).resolve()
        if target != self.path and self.path not in target.parents:
            raise PermissionError(f"path {rel!r} is outside the repository")
        return target

    def write_text(self, rel: str, content: str) -> None:
        """Replace a file atomically, owned by the sandbox user like the rest of the folder."""
        target = self.resolve(rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f".{target.name}.rollfleet-tmp"
        tmp.write_text(content)
        os.replace(tmp, target)
        for path in (target, *target.parents):
            if path == self.path:
                break
            give_to_sandbox(path, self.policy)

    def run(self, argv: list[str], timeout_s: float, max_output: int,
            env: dict[str, str] | None = None) -> CommandResult:
        """Run a command in the workspace; on timeout its whole process group is killed."""
        base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.path),
                "PYTHONPATH": str(self.path), "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0",
                "LANG": "C.UTF-8"}
        with tempfile.TemporaryFile(dir=self.home) as out:
            proc = subprocess.Popen(wrap(argv, self.path, self.policy), cwd=self.path,
                                    env={**base, **(env or {})}, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT,
                                    preexec_fn=limit_child(self.policy))
            try:
                proc.wait(timeout=timeout_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                # bwrap's child is the sandbox's pid-namespace init: it exits only once every
                # process in the namespace is gone, so waiting for it means nothing is left
                inner = _children(proc.pid)
                _kill_group(proc.pid)
                proc.wait()
                _wait_gone(inner)
            text = _head_and_tail(out, max_output)
        if self.policy.isolate and proc.returncode == 1 and text.startswith("bwrap: "):
            raise SandboxFailure(text.strip().splitlines()[0])
        return CommandResult(None if timed_out else proc.returncode, text, timed_out)

    def python(self) -> str:
        return sys.executable

    def close(self) -> None:
        shutil.rmtree(self.home, ignore_errors=True)


def _snapshot(root: Path) -> dict[str, tuple[str, str]]:
    """Relative path -> (sha256, text) of every text file; caches and binaries are skipped."""
    snap = {}
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.is_symlink() or "__pycache__" in path.parts:
            continue
        data = path.read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        snap[str(path.relative_to(root))] = (hashlib.sha256(data).hexdigest(), text)
    return snap


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _wait_gone(pids: list[int], timeout_s: float = 10.0) -> None:
    """Until none of `pids` runs (a zombie has finished: its namespace is already empty)."""
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                break
            if stat[stat.rindex(")") + 2] in "ZX":
                break
            time.sleep(0.01)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _head_and_tail(f, limit: int) -> str:
    size = f.seek(0, os.SEEK_END)
    if size <= limit:
        f.seek(0)
        return f.read().decode("utf-8", errors="replace")
    head, tail = limit * 2 // 3, limit // 3
    f.seek(0)
    first = f.read(head).decode("utf-8", errors="replace")
    f.seek(size - tail)
    last = f.read(tail).decode("utf-8", errors="replace")
    return f"{first}\n[... {size - head - tail} bytes truncated ...]\n{last}"


def truncate(text: str, limit: int) -> str:
    """Keep the head and tail of long text, with a marker saying how much was cut."""
    if len(text) <= limit:
        return text
    head, tail = limit * 2 // 3, limit // 3
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} characters truncated ...]\n{text[-tail:]}"
