"""Our environment's tasks (the mini suite by default) as a verifiers Taskset."""

from __future__ import annotations

from collections.abc import Iterator

import verifiers.v1 as vf

from envs.vf.registry import environment_for
from envs.vf.task import RollfleetData, RollfleetTask, RollfleetTaskConfig


class RollfleetTasksetConfig(vf.TasksetConfig):
    task: RollfleetTaskConfig = RollfleetTaskConfig()


class RollfleetTaskset(vf.Taskset[RollfleetTask, RollfleetTasksetConfig]):
    """Pick the suite with `--env.taskset.task.env.suite`, `...env.task-ids` and so on."""

    def load(self) -> Iterator[RollfleetTask]:
        env = environment_for(self.config.task.env)
        for task in env.tasks.values():
            data = RollfleetData(id=task.task_id, name=task.task_id, prompt=task.statement,
                                 system_prompt=env.cfg.system_prompt,
                                 difficulty=task.difficulty, suite=task.suite)
            yield RollfleetTask(data, self.config.task)
