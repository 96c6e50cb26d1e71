"""What verifiers loads by taskset id: exactly one Taskset, Harness and Env, via `__all__`.

`vf-eval <id>` imports the module named by the id; verifiers 0.4.0 cannot import a dotted id
(`envs.vf.plugin`), so the id is a top-level module re-exporting this one (`rollfleet_tasks`):

    from envs.vf.plugin import *  # noqa: F403
    from envs.vf.plugin import __all__  # noqa: F401
"""

from envs.vf.harness import LocalChatHarness
from envs.vf.local_env import LocalEnv
from envs.vf.taskset import RollfleetTaskset

__all__ = ["LocalChatHarness", "LocalEnv", "RollfleetTaskset"]
