"""The single-agent env with a local default runtime: verifiers' default is a remote sandbox."""

from __future__ import annotations

import verifiers.v1 as vf


class LocalEnvConfig(vf.SingleAgentEnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig())


class LocalEnv(vf.Env[LocalEnvConfig]):
    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        await agents.agent.run(task)
