import json
import shutil

import pytest

import envs.scoring
import envs.session_sandbox
import envs.workspace
from envs import EnvConfig, EnvError, load
from envs.workspace import Changes

ENV = load(EnvConfig())


def test_builtin_suite_has_five_tasks():
    assert sorted(ENV.tasks) == ["merge_touching", "roman_subtractive", "slugify_lower",
                                 "stack_pop", "stats_mean"]


@pytest.mark.parametrize("task_id", sorted(ENV.tasks))
def test_task_is_valid(task_id, tmp_path):
    """The broken repo fails its hidden tests; the reference fix, applied by tools, passes."""
    task = ENV.tasks[task_id]
    with ENV.episode(task_id) as ep:
        before = ep.score()
        assert before.reward == 0.0 and before.tests_failed > 0, before.output
        assert before.diff == ""
        for rel, text in task.repo.reference_fix().items():
            result = ep.call("write_file", json.dumps({"path": rel, "content": text}))
            assert result.ok and result.error is None, result.output
        after = ep.score()
        assert after.reward == 1.0 and after.tests_failed == 0, after.output
        assert after.tests_total == before.tests_total
        # the recorded diff is git's: applied to a fresh copy it gives the fixed files
        assert after.diff.startswith("diff --git a/")
        fresh = tmp_path / "fresh"
        fresh.mkdir()
        task.repo.materialize(fresh)
        Changes(after.diff).apply(fresh)
        for rel, text in task.repo.reference_fix().items():
            assert (fresh / rel).read_text() == text


def test_scoring_uses_a_fresh_copy():
    """Hidden tests never land in the agent's workspace."""
    with ENV.episode("stack_pop") as ep:
        ep.score()
        assert not (ep.workspace.path / "_hidden_tests").exists()


def test_hidden_tests_run_in_a_sandbox_of_their_own(monkeypatch):
    """Sessions' sandboxes are persistent by default; the hidden tests still get a new one
    (a sandbox per command), never a session's exec server."""
    ran = []
    session_run = envs.session_sandbox.SessionSandbox.run
    alone = envs.workspace.Workspace._run_alone

    def in_session(self, *args):
        ran.append("session")
        return session_run(self, *args)

    def on_its_own(self, *args):
        ran.append("alone")
        return alone(self, *args)

    monkeypatch.setattr(envs.session_sandbox.SessionSandbox, "run", in_session)
    monkeypatch.setattr(envs.workspace.Workspace, "_run_alone", on_its_own)
    assert ENV.policy.persistent
    with ENV.episode("stack_pop") as ep:
        score = ep.score()
    assert ran == ["alone"] and score.tests_total > 0 and score.infra_error is None


def test_bad_task_row_is_skipped_or_refused(tmp_path):
    good = ENV.tasks["stack_pop"].repo.folder
    shutil.copytree(good, tmp_path / "ok")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "task.json").write_text(json.dumps({"id": "bad"}))
    env = load(EnvConfig(tasks_path=str(tmp_path)))
    assert list(env.tasks) == ["stack_pop"]
    with pytest.raises(EnvError, match="task bad: task.json lacks"):
        load(EnvConfig(tasks_path=str(tmp_path), on_bad_task="fail"))


def test_unknown_task_ids_are_refused():
    with pytest.raises(EnvError, match="unknown task ids"):
        load(EnvConfig(task_ids=["nope"]))


def test_a_hidden_test_sandbox_that_fails_is_an_infra_error_never_a_zero(monkeypatch):
    """The harness failing (the scoring sandbox, or running the hidden tests) says nothing of
    the agent's fix: infra_error (retried), not a reward of 0."""
    real = envs.scoring.Workspace
    with ENV.episode("stack_pop") as ep:
        def no_sandbox(*args, **kwargs):
            raise OSError("bwrap: cannot mount /proc")

        monkeypatch.setattr(envs.scoring, "Workspace", no_sandbox)
        score = ep.score()
    assert score.infra_error and "scoring sandbox failed" in score.infra_error
    with ENV.episode("stack_pop") as ep:

        class TestsDoNotRun(real):
            def run(self, *args, **kwargs):
                raise OSError("exec failed")

        monkeypatch.setattr(envs.scoring, "Workspace", TestsDoNotRun)
        score = ep.score()
    assert score.infra_error and "hidden tests did not run" in score.infra_error


def test_first_call_rewards_the_named_tool_and_refuses_an_unknown_one():
    env = load(EnvConfig(reward="first_call", reward_tool="run_tests", task_ids=["stack_pop"]))
    with env.episode("stack_pop") as ep:
        ep.call("run_tests", {})
        ep.call("submit", {})
        assert ep.score().reward == 1.0
    with env.episode("stack_pop") as ep:
        ep.call("submit", {})
        ep.call("run_tests", {})
        assert ep.score().reward == 0.0
    with pytest.raises(EnvError, match="env.reward_tool='nope' is not a tool"):
        load(EnvConfig(reward="first_call", reward_tool="nope"))
