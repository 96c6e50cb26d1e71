"""One of our tasks as a verifiers Task: its workspace tool server, `submit`, hidden-test reward."""

from __future__ import annotations

import asyncio

import verifiers.v1 as vf

from envs.environment import EnvConfig
from envs.scoring import Score, score_changes
from envs.vf.registry import environment_for
from envs.vf.state import WorkspaceState
from envs.vf.toolset import WorkspaceToolsConfig, WorkspaceToolset
from envs.workspace import Changes


class RollfleetData(vf.TaskData):
    """`id` is our task id; the prompt and system prompt are what `Environment.prompt` gives."""

    difficulty: str = "unknown"
    suite: str = ""


class RollfleetTaskConfig(vf.TaskConfig):
    env: EnvConfig = EnvConfig()
    """Our environment the tasks come from (suite, tasks, tool and scoring limits)."""
    tools: vf.ToolsetConfig = vf.ToolsetConfig()
    """Where the workspace tool server runs: a local subprocess unless set otherwise."""


class RollfleetTask(vf.Task[RollfleetData, WorkspaceState, RollfleetTaskConfig]):
    @property
    def key(self) -> str:
        """Our task id is durable; the default content hash would change with `idx`."""
        return f"{self.data.suite}/{self.data.id}"

    @classmethod
    def toolsets(cls, config: RollfleetTaskConfig) -> list[vf.Toolset]:
        tools = WorkspaceToolsConfig.model_validate({**config.tools.model_dump(),
                                                     "env": config.env})
        return [WorkspaceToolset(tools)]

    @vf.stop
    async def submitted(self, trace: vf.Trace) -> bool:
        """`submit` ends the rollout, as it ends a session of the rollout job."""
        return trace.state.submitted

    @vf.reward(weight=1.0)
    async def hidden_tests(self, trace: vf.Trace) -> float:
        """Our score: the hidden tests, in a fresh sandbox, on the session's changes."""
        score = await asyncio.to_thread(self._score, trace.state)
        if score.infra_error:  # never a reward of 0: the trace records an error instead
            raise RuntimeError(score.infra_error)
        trace.record_metrics({"tests_total": score.tests_total,
                              "tests_failed": score.tests_failed})
        trace.info.update(diff=score.diff, hidden_tests_output=score.output)
        return score.reward

    def _score(self, state: WorkspaceState) -> Score:
        env = environment_for(self.config.env)
        return score_changes(env.tasks[self.data.id], Changes(state.diff, state.refused or None),
                             env.scratch, env.cfg.score_timeout_s, env.policy,
                             env.cfg.max_output_chars)
