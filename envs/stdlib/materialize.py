"""A task's repository is the mutant of one installed stdlib module, made at run time."""

from __future__ import annotations

from pathlib import Path

from envs.stdlib.mutations import MutationError
from envs.stdlib.rows import Row, TaskRowError
from envs.stdlib.source import python_version, read_exact, sha256_text, stdlib_dir


def original_source(row: Row, root: Path | None = None) -> str:
    """The installed module's text, refused unless it is byte-identical to the task's."""
    root = root or stdlib_dir()
    path = root / row.path
    built = f"built on Python {row.python}, this is Python {python_version()}"
    if not path.is_file():
        raise TaskRowError(f"task {row.task_id}: module {row.module} not found: no {path} "
                           f"({built})")
    text = read_exact(path)
    if sha256_text(text) != row.source_sha256:
        raise TaskRowError(f"task {row.task_id}: {path} is not the source the task was built "
                           f"from (sha256 {sha256_text(text)[:12]} != {row.source_sha256[:12]}, "
                           f"{built}); rebuild with scripts/build_stdlib_tasks.py")
    return text


def mutant_source(row: Row, root: Path | None = None) -> str:
    try:
        return row.mutation.apply(original_source(row, root))
    except MutationError as exc:
        raise TaskRowError(f"task {row.task_id}: mutation no longer applies to {row.path}: "
                           f"{exc}") from None


def verify(row: Row, root: Path | None = None) -> None:
    """Raise TaskRowError unless the task can be materialized here."""
    mutant_source(row, root)


def materialize(row: Row, dest: Path, root: Path | None = None) -> None:
    """Write the mutated module into `dest`; with `dest` first on sys.path it shadows the
    installed one. Raises TaskRowError (naming the task) if the installed source changed."""
    text = mutant_source(row, root)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / row.path).write_bytes(text.encode("utf-8"))


def reference_fix(row: Row, root: Path | None = None) -> tuple[str, str]:
    """(relative path, full fixed text): the stored mutation reversed on the mutant."""
    return row.path, row.mutation.revert(mutant_source(row, root))


def reference_edit(row: Row, root: Path | None = None) -> tuple[str, str, str]:
    """(relative path, old, new) for a replace-once edit tool: `old` is the mutated lines,
    widened by a line on each side until it occurs exactly once in the mutant."""
    mutant = mutant_source(row, root)
    before, after = mutant.split("\n"), row.mutation.revert(mutant).split("\n")
    lo = row.mutation.start[0] - 1  # lines above lo and the last `keep` lines are unchanged
    keep = len(before) - lo - row.mutation.replacement.count("\n") - 1
    while True:
        old = "\n".join(before[lo:len(before) - keep])
        if mutant.count(old) == 1 or (lo == 0 and keep == 0):
            return row.path, old, "\n".join(after[lo:len(after) - keep])
        lo, keep = max(lo - 1, 0), max(keep - 1, 0)
