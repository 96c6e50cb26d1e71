"""`vf-eval rollfleet_tasks`: our tasks as a verifiers Taskset (envs/vf).

verifiers 0.4 resolves a taskset id as a top-level module, so this one-line module is the id.
"""

from envs.vf.plugin import *  # noqa: F403
from envs.vf.plugin import __all__  # noqa: F401
