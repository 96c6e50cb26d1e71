"""Task suites: each turns its own storage format into `Task`s (a registry: name -> loader)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from envs.task import EnvError, Task

if TYPE_CHECKING:
    from envs.environment import EnvConfig

BUILTIN = Path(__file__).resolve().parents[1] / "tasks"


def _mini(cfg: EnvConfig) -> list[Task]:
    from envs.suites.mini import load_mini_suite

    return load_mini_suite(Path(cfg.tasks_path or BUILTIN / cfg.name), cfg.on_bad_task)


def _stdlib(cfg: EnvConfig) -> list[Task]:
    from envs.suites.stdlib import load_stdlib_suite

    return load_stdlib_suite(Path(cfg.tasks_path) if cfg.tasks_path else None, cfg.on_bad_task)


def _swebench(cfg: EnvConfig) -> list[Task]:
    from envs.suites.swebench import load_swebench

    if not cfg.tasks_path:
        raise EnvError("env.suite=swebench needs env.tasks_path (a .jsonl or .parquet file)")
    return load_swebench(Path(cfg.tasks_path), cfg.on_bad_task)


LOADERS: dict[str, Callable[[EnvConfig], list[Task]]] = {
    "mini": _mini, "stdlib": _stdlib, "swebench": _swebench}
SUITES = (*LOADERS, "verifiers")  # verifiers: a Taskset, loaded by envs.load (envs/vf)


def load_suite(cfg: EnvConfig) -> list[Task]:
    try:
        loader = LOADERS[cfg.suite]
    except KeyError:
        raise EnvError(f"unknown env.suite {cfg.suite!r}; expected one of {SUITES}") from None
    return loader(cfg)
