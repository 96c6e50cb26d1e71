"""A session's private copy of a task repository, and commands run inside it, sandboxed."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from envs.lease import OWNER, SessionLease
from envs.sandbox import (
    SandboxPolicy,
    give_to_sandbox,
    launch,
    setup_failure,
    stop,
    wait_exit,
)
from envs.session_sandbox import SessionSandbox
from envs.unittest_forks import FORKS
from rollfleet.owner import tag


@dataclass(frozen=True)
class CommandResult:
    exit_code: int | None  # None: killed at the timeout
    output: str
    timed_out: bool


class ChangesError(OSError):
    """git could not record or replay a session's changes."""


class _TooLarge(Exception):
    """git wrote past the diff limit."""


@dataclass(frozen=True)
class Changes:
    """What a session did to its repository, as `git diff --binary` from the starting tree:
    `git apply` on a fresh copy of the task reproduces the final repository, byte for byte,
    whatever the files are (binary, non-UTF-8, odd names, modes, deletions)."""

    diff: str
    refused: str | None = None  # why there is no diff (too large to keep): the agent failed

    def apply(self, root: Path) -> None:
        if self.refused:
            raise ChangesError(f"changes were refused: {self.refused}")
        if not self.diff:
            return
        # The ceiling keeps git from treating an enclosing checkout as the repository.
        env = {**_GIT_ENV, "GIT_CEILING_DIRECTORIES": str(root.parent)}
        proc = subprocess.run(["git", "apply", "--binary", "--whitespace=nowarn", "-"],
                              cwd=root, input=self.diff.encode(), env=env, capture_output=True,
                              check=False)
        if proc.returncode != 0:
            err = f"git apply failed: {proc.stderr.decode(errors='replace')[:500]}"
            if "No space left on device" in err:  # a disk quota, full: tell it by its errno
                raise ChangesError(errno.ENOSPC, err)
            raise ChangesError(err)


MB = 1024 * 1024
# git as a tool, never as the user's: no system or global config, no pager, no locale surprises.
_GIT_ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull, "LC_ALL": "C", "GIT_TERMINAL_PROMPT": "0"}
# Every file counts (--force: a .gitignore the agent writes hides nothing), except the caches
# a test run leaves behind.
_GIT_ADD = ("add", "--all", "--force", "--", ".", ":(exclude,glob)**/__pycache__/**",
            ":(exclude,glob)**/*.pyc")


@dataclass(frozen=True)
class StartingTree:
    """A populated tree written into git once, for every history that starts from it."""

    objects: Path  # its git object folder, which the histories borrow (git's alternates)
    tree: str  # its tree id


class StartingTrees:
    """Each task's starting tree in git, written once per process under `root` and shared by
    its sessions' histories: a session then starts without running git (three git runs were
    ~14 ms of CPU per session on this host). The folder goes with its owner's leftovers
    (`envs.lease.sweep`)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._trees: dict[str, StartingTree] = {}
        self._folder: Path | None = None
        self._lock = threading.Lock()

    def get(self, key: str, populate: Callable[[Path], None]) -> StartingTree:
        """`populate`'s tree (the same for every call with `key`)."""
        with self._lock:
            if key not in self._trees:
                if self._folder is None:
                    self.root.mkdir(parents=True, exist_ok=True)
                    self._folder = Path(tempfile.mkdtemp(prefix=f"{OWNER}{tag()}trees-",
                                                         dir=self.root))
                home = Path(tempfile.mkdtemp(dir=self._folder))
                work = home / "tree"
                work.mkdir()
                populate(work)
                history = RepoHistory(home / "git", work)
                shutil.rmtree(work)
                self._trees[key] = StartingTree(history.git_dir / "objects", history.start)
            return self._trees[key]


class RepoHistory:
    """The starting tree of a workspace in a git repository kept OUTSIDE it (the agent cannot
    see or rewrite it); `diff()` records everything changed since.

    On the agent's files (`diff`), git runs as root inside the session's cgroup (`groups`):
    what it reads is bounded by the session's disk quota, what it holds by the session's
    memory, and the diff it writes by `diff`'s limit. The starting tree is the task's own: git
    runs unbound (no launcher in between), or not at all when it is a shared `start`.
    """

    def __init__(self, git_dir: Path, work_tree: Path, groups: list[Path] = (),
                 start: StartingTree | None = None) -> None:
        self.git_dir, self.work_tree, self.groups = git_dir, work_tree, list(groups)
        if start is None:
            self._git("init", "-q", "--template=")  # no sample hooks: files to write and remove
            self.start = self._tree()
        else:  # a repository of its own, whose objects start as the shared tree's
            (git_dir / "objects" / "info").mkdir(parents=True)
            (git_dir / "refs" / "heads").mkdir(parents=True)
            (git_dir / "HEAD").write_text("ref: refs/heads/main\n")
            (git_dir / "objects" / "info" / "alternates").write_text(f"{start.objects}\n")
            self.start = start.tree

    def _git(self, *args: str, bound: bool = False, out=None,
             max_bytes: int | None = None) -> bytes:
        """git's stdout (or None where it went to the file `out`, cut at `max_bytes`)."""
        # safe.directory: the work tree belongs to the sandbox user, git runs as the host's
        argv = ["git", "-c", "safe.directory=*", "-c", "core.quotepath=true", "-c",
                "core.autocrlf=false", f"--git-dir={self.git_dir}",
                f"--work-tree={self.work_tree}", *args]
        if bound:  # one byte past the limit: a diff over it is refused
            argv = launch(argv, self.groups,
                          {} if max_bytes is None else {"fsize": max_bytes + 1})
        proc = subprocess.run(argv, env=_GIT_ENV, stdout=out or subprocess.PIPE,
                              stderr=subprocess.PIPE, start_new_session=bound, check=False)
        if proc.returncode == -signal.SIGXFSZ:
            raise _TooLarge()
        if proc.returncode != 0:
            raise ChangesError(f"git {args[0]} failed: "
                               f"{proc.stderr.decode(errors='replace')[:500]}")
        return proc.stdout

    def _tree(self) -> str:
        self._git(*_GIT_ADD)
        return self._git("write-tree").decode().strip()

    def diff(self, max_bytes: int) -> Changes:
        """The diff as text; if some changed text is not UTF-8 (a record holds text), every
        file's change is written as a binary patch instead (ASCII, still exact). A diff over
        `max_bytes` is refused, with the reason."""
        self._git(*_GIT_ADD, bound=True)
        try:
            raw = self._bounded_diff(max_bytes)
            try:
                return Changes(raw.decode("utf-8"))
            except UnicodeDecodeError:
                attributes = self.git_dir / "info" / "attributes"
                attributes.parent.mkdir(exist_ok=True)
                attributes.write_text("* binary\n")
                try:
                    return Changes(self._bounded_diff(max_bytes).decode("ascii"))
                finally:
                    attributes.unlink()
        except _TooLarge:
            return Changes("", refused=f"the changes' diff is over the {max_bytes // MB} MB "
                                       f"limit (sandbox changes_mb)")

    def _bounded_diff(self, max_bytes: int) -> bytes:
        """The index (everything added) against the starting tree."""
        with tempfile.TemporaryFile(dir=self.git_dir) as out:
            self._git("diff", "--cached", "--binary", "--full-index", "--no-renames",
                      "--no-color", "--no-ext-diff", self.start, bound=True, out=out,
                      max_bytes=max_bytes)
            if out.seek(0, os.SEEK_END) > max_bytes:
                raise _TooLarge()
            out.seek(0)
            return out.read()


class Workspace:
    """A temporary folder holding a copy of the repository; removed on `close()`.

    Command output goes to a file outside the folder, so a flood of output costs disk up to the
    file-size limit, never memory; only its head and tail are read back.
    """

    def __init__(self, populate: Callable[[Path], None], root: Path | None = None,
                 prefix: str = "ws-", policy: SandboxPolicy | None = None,
                 history: bool = True, start: StartingTree | None = None) -> None:
        """`history`: keep the starting tree, for `changes()` (a scoring run needs none);
        `start`: that tree, already in git (what `populate` makes, from StartingTrees)."""
        policy = policy or SandboxPolicy()
        root = root or Path(tempfile.gettempdir())
        root.mkdir(parents=True, exist_ok=True)
        if not any(str(root) == h or str(root).startswith(h.rstrip("/") + "/")
                   for h in policy.hide):  # other sessions' folders stay out of sight
            policy = replace(policy, hide=(*policy.hide, str(root)))
        self.policy = policy
        self.lease = SessionLease(root, prefix, policy)
        self.home, self.path = self.lease.home, self.lease.repo
        self._session: SessionSandbox | None = None
        try:
            populate(self.path)
            self.history = (RepoHistory(self.home / "git", self.path, self.lease.groups, start)
                            if history else None)
            give_to_sandbox(self.path, self.lease.uid)
            if policy.persistent and policy.isolate:
                self._session = SessionSandbox(self.lease, policy)
        except BaseException:
            self.close()
            raise

    def changes(self) -> Changes:
        """Everything changed, added or removed since the workspace was populated; refused
        (a scored failure) when its diff is over the policy's changes_mb."""
        if self.history is None:
            raise ChangesError("this workspace keeps no history (history=False)")
        return self.history.diff(self.policy.changes_mb * MB)

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
            give_to_sandbox(path, self.lease.uid)

    def run(self, argv: list[str], timeout_s: float, max_output: int,
            env: dict[str, str] | None = None) -> CommandResult:
        """Run a command in the workspace; on timeout its whole process group is killed, and
        nothing it started outlives it."""
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.path),
               "PYTHONPATH": str(self.path), "PYTHONDONTWRITEBYTECODE": "1",
               "PYTHONHASHSEED": "0", "LANG": "C.UTF-8", **(env or {})}
        with tempfile.TemporaryFile(dir=self.home) as out:
            if self._session is not None:
                code, timed_out = self._session.run(argv, env, timeout_s, out.fileno())
            else:
                code, timed_out = self._run_alone(argv, env, timeout_s, out)
            text = _head_and_tail(out, max_output)
        if (self._session is None and self.policy.isolate and code == 1
                and (failure := setup_failure(text)) is not None):
            raise failure
        return CommandResult(code, text, timed_out)

    def _run_alone(self, argv: list[str], env: dict[str, str], timeout_s: float,
                   out) -> tuple[int | None, bool]:
        """A sandbox of its own for one command."""
        if (self.policy.warm_unittest and self.policy.isolate and self.lease.uid is not None
                and FORKS.serves(argv, env, self.path)):
            return FORKS.run(self.lease, self.policy, argv, env, timeout_s, out.fileno())
        proc = self.lease.start(argv, self.policy, cwd=self.path, env=env,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            timed_out = not wait_exit(proc.pid, timeout_s)
        finally:
            stop(proc)
        return (None if timed_out else proc.returncode), timed_out

    def python(self) -> str:
        return sys.executable

    def close(self) -> None:
        """Kill what is left of the session, unmount its disk, remove its folder and cgroup."""
        try:
            if self._session is not None:
                self._session.close()
        finally:
            self.lease.close()


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
