"""verifiers (0.4, `verifiers.v1`) in both directions.

- `envs.vf.plugin`: our tasks as a verifiers Taskset, with our tools and hidden-test reward,
  and a harness and env that run it locally (`vf-eval ... --no-push`).
- `envs.vf.environment`: any verifiers Taskset as an environment of the rollout job.

Nothing is imported here, so `python -m envs.vf.toolset` (the tool server) stays light.
"""
