"""A small verifiers Taskset for the bridge tests: reach a target with a stateful counter tool.

It uses what real tasksets use: typed task data, `Task.setup` on the runtime, a per-rollout
tool server with shared state and `setup_task`, a trace-level `@stop`, rewards and metrics.
Run as `python -m tests.envs.vf.counter` it is the tool server.
"""

from __future__ import annotations

from collections.abc import Iterator

import verifiers.v1 as vf


class CounterData(vf.TaskData):
    target: int


class CounterState(vf.State):
    value: int = 0
    start: int = 0
    done: bool = False


class CounterTools(vf.Toolset[vf.ToolsetConfig, CounterState]):
    TOOL_PREFIX = "counter"

    async def setup_task(self, task: CounterData) -> None:
        self.target = task.target  # proves the server got its rollout's task

    @vf.tool
    async def add(self, amount: int, times: int = 1) -> str:
        """Add amount to the counter, times times."""
        if amount < 0:
            raise ValueError("amount must not be negative")
        self.state.value += amount * times
        return f"counter is {self.state.value}"

    @vf.tool
    async def peek(self) -> str:
        """Show the counter and the target."""
        return f"counter {self.state.value}, target {self.target}"

    @vf.tool
    async def done(self) -> str:
        """Finish the episode."""
        self.state.done = True
        return "done"


class CounterTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class CounterTask(vf.Task[CounterData, CounterState, CounterTaskConfig]):
    @classmethod
    def toolsets(cls, config: CounterTaskConfig) -> list[vf.Toolset]:
        return [CounterTools(config.tools)]

    async def setup(self, trace: vf.Trace, runtime: vf.Runtime) -> None:
        if self.data.target == 0:
            raise ValueError("a target of 0 is refused at setup")
        await runtime.write("start.txt", b"7")
        trace.state.start = int((await runtime.read("start.txt")).decode())

    @vf.stop
    async def finished(self, trace: vf.Trace) -> bool:
        return trace.state.done

    @vf.reward(weight=1.0)
    async def reached(self, trace: vf.Trace) -> float:
        if self.data.target < 0:
            raise ValueError("a negative target cannot be scored")
        return float(trace.state.value == self.data.target)

    @vf.metric
    async def value(self, trace: vf.Trace) -> float:
        return float(trace.state.value)

    @vf.metric
    async def start(self, trace: vf.Trace) -> float:
        return float(trace.state.start)


class CounterConfig(vf.TasksetConfig):
    targets: list[int] = [3, 5]
    task: CounterTaskConfig = CounterTaskConfig()


class CounterTaskset(vf.Taskset[CounterTask, CounterConfig]):
    def load(self) -> Iterator[CounterTask]:
        for target in self.config.targets:
            data = CounterData(id=f"reach-{target}", prompt=f"Make the counter {target}.",
                               system_prompt="Use the counter tools.", target=target)
            yield CounterTask(data, self.config.task)


if __name__ == "__main__":
    CounterTools.run()
