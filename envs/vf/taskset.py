"""Our environment's tasks (the mini suite by default) as a verifiers Taskset."""

from __future__ import annotations

from collections.abc import Iterator

import verifiers.v1 as vf

from envs.vf.registry import environment_for
from envs.vf.task import RollfleetData, RollfleetTask, RollfleetTaskConfig


class RollfleetTasksetConfig(vf.TasksetConfig):
    task: RollfleetTaskConfig = RollfleetTaskConfig()


class RollfleetTaskset(vf.Taskset[RollfleetTask, RollfleetTasksetConfig]):
    """The env config is `--env.taskset.task.env.*` (`...env.suite stdlib`); list and dict
    fields (task_ids, sandbox) need a `@ file.toml`. `--select.include.ids` picks tasks by id."""

    def load(self) -> Iterator[RollfleetTask]:
        env = environment_for(self.config.task.env)
        for task in env.tasks.values():
            data = RollfleetData(id=task.task_id, name=task.task_id, prompt=task.statement,
                                 system_prompt=env.cfg.system_prompt,
                                 difficulty=task.difficulty, suite=task.suite)
            yield RollfleetTask(data, self.config.task)
