"""SWE-bench-format rows over local git checkouts, for users who bring their own repositories.

A row: instance_id, repo (a local git checkout), base_commit, patch (the reference fix),
test_patch (the hidden tests), problem_statement, FAIL_TO_PASS, PASS_TO_PASS (pytest node ids,
as lists or JSON strings), and optionally test_cmd. The session's repository is `git archive` of
the base commit: no history, so no later commit can leak the fix.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.task import EnvError, Grade, Task, warn_bad_task

REQUIRED = ("instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement",
            "FAIL_TO_PASS", "PASS_TO_PASS")
_RESULT = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED) (\S+)", re.M)


def _git(args: list[str], cwd: Path, data: bytes | None = None) -> bytes:
    proc = subprocess.run(["git", *args], cwd=cwd, input=data, capture_output=True)
    if proc.returncode != 0:
        raise OSError(f"git {args[0]} failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


@dataclass(frozen=True)
class GitRepo:
    instance_id: str
    repo: Path
    base_commit: str
    patch: str
    test_patch: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    test_cmd: str | None = None

    def materialize(self, dest: Path) -> None:
        archive = _git(["archive", "--format=tar", self.base_commit], self.repo)
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)

    def add_hidden_tests(self, dest: Path) -> None:
        _git(["apply", "--whitespace=nowarn", "-"], dest, self.test_patch.encode())

    def hidden_test_argv(self, python: str) -> list[str]:
        ids = list(self.fail_to_pass + self.pass_to_pass)
        if self.test_cmd:
            return ["bash", "-c", self.test_cmd]
        return [python, "-m", "pytest", "-rA", "-p", "no:cacheprovider", *ids]

    def visible_test_argv(self, python: str) -> list[str]:
        return [python, "-m", "pytest", "-q", "-p", "no:cacheprovider"]

    def grade(self, output: str, exit_code: int | None) -> Grade:
        outcome = {test: status for status, test in _RESULT.findall(output)}
        wanted = self.fail_to_pass + self.pass_to_pass
        failed = sum(outcome.get(t) != "PASSED" for t in wanted)
        return Grade(len(wanted), failed, bool(wanted) and failed == 0)

    def masked_paths(self) -> list[str]:
        return []

    def reference_fix(self) -> dict[str, str]:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            self.materialize(root)
            _git(["apply", "--whitespace=nowarn", "-"], root, self.patch.encode())
            files = re.findall(r"^\+\+\+ b/(\S+)", self.patch, re.M)
            return {f: (root / f).read_text() for f in files if (root / f).exists()}


def _ids(value: Any, field: str, iid: str) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise EnvError(f"task {iid}: {field} is not a JSON list") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise EnvError(f"task {iid}: {field} must be a list of test ids")
    return tuple(value)


def task_from_row(row: dict[str, Any], base: Path) -> Task:
    iid = row.get("instance_id") or "<no instance_id>"
    missing = [k for k in REQUIRED if row.get(k) in (None, "")]
    if missing:
        raise EnvError(f"task {iid}: row lacks {missing}")
    repo = (base / row["repo"]).expanduser()
    if not (repo / ".git").exists() and not (repo / "HEAD").exists():
        raise EnvError(f"task {iid}: repo {repo} is not a local git checkout")
    try:
        _git(["cat-file", "-e", f"{row['base_commit']}^{{commit}}"], repo)
    except OSError:
        raise EnvError(f"task {iid}: base_commit {row['base_commit']} not in {repo}") from None
    git_repo = GitRepo(iid, repo, row["base_commit"], row["patch"], row["test_patch"],
                       _ids(row["FAIL_TO_PASS"], "FAIL_TO_PASS", iid),
                       _ids(row["PASS_TO_PASS"], "PASS_TO_PASS", iid), row.get("test_cmd"))
    return Task(iid, row["problem_statement"], git_repo, row.get("difficulty") or "unknown",
                suite="swebench", category=str(row["repo"]))


def load_swebench(path: Path, on_bad_task: str) -> list[Task]:
    """Rows from a local .jsonl/.json or .parquet file, read through `datasets`."""
    from datasets import load_dataset

    if not path.is_file():
        raise EnvError(f"swebench suite: {path} does not exist")
    kind = "parquet" if path.suffix == ".parquet" else "json"
    rows = load_dataset(kind, data_files=str(path), split="train")
    tasks = []
    for row in rows:
        try:
            tasks.append(task_from_row(row, path.parent))
        except EnvError as exc:
            if on_bad_task == "fail":
                raise
            warn_bad_task(exc)
    return tasks
