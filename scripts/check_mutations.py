"""Break promises on purpose in a scratch copy of the tree and show the tests that catch it.

    python scripts/check_mutations.py [--fast] [--only TEXT]
        --fast: leave out the end-to-end ones; --only: the mutations whose name has TEXT

First every named test runs on the unbroken tree and must pass (a test failing for another
reason would count as a catch). Then each mutation is applied to a fresh `git worktree` of
HEAD (the working tree is never touched), its tests run there, and the script exits 1 if any
of them still passes (tests/README.md, "Shown failing on a deliberately broken build").
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from rollfleet.paths import ROOT

MUTATIONS = [
    ("the parser keeps the sampled turn-end token as content", "serving/toolcall/parser.py",
     "    if tokens and any(tokens[-1] == end for end in TURN_ENDS):\n        tokens.pop()\n", "",
     ["tests/serving/toolcall/test_parser.py::test_the_turn_end_token_is_not_content",
      "tests/rollout/test_session.py::"
      "test_every_prompt_is_the_last_one_plus_what_was_sampled_plus_the_new_messages"]),
    ("the engines ask for raw logprobs without the unmasking plugin", "serving/vllm_engine.py",
     '    env[BEHAVIOUR_LOGPROBS_ENV if c.logprobs == "behaviour" else UNMASKED_LOGPROBS_ENV]',
     "    env[BEHAVIOUR_LOGPROBS_ENV]",
     ["tests/serving/test_vllm_engine.py::"
      "test_raw_logprobs_are_asked_for_and_unmasked_by_the_plugin"]),
    ("the sink buffers records instead of writing each", "rollout/sink.py",
     "        _write_durably(pa.Table.from_pylist(records, schema=self.schema), path, "
     "PART_OPTIONS)\n",
     "        self.__dict__.setdefault('buffer', []).extend(records)\n",
     ["tests/rollout/test_record.py::"
      "test_records_written_together_are_one_file_on_disk_when_write_returns",
      "tests/rollout/test_record.py::test_records_written_before_a_sigkill_survive"]),
    ("the scheduler records infrastructure errors instead of retrying", "rollout/scheduler.py",
     "                    if job.attempt < self.max_retries:", "                    if False:",
     ["tests/rollout/test_scheduler.py::test_infra_errors_are_retried_with_backoff_then_recorded"]),
    ("a missing metric reads as 0.0", "serving/metrics.py",
     "    if name not in metrics:\n"
     "        raise MetricsError(f\"{url or 'metrics'} reports no {name}\")\n", "",
     ["tests/serving/test_metrics.py::test_a_missing_metric_is_an_error_not_zero"]),
    ("the plugin hands the sampler the grammar-masked logprobs", "serving/engine/plugin.py",
     "        return unmasked if unmasked is not None else compute(logits)\n",
     "        return compute(logits)\n",
     ["tests/serving/test_vllm_plugin.py::"
      "test_raw_logprobs_are_the_models_own_not_the_grammar_masked_ones"]),
    ("each turn records constant sampling settings", "rollout/session.py",
     "        temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens, seed=s.seed,",
     "        temperature=1.0, top_p=1.0, max_tokens=s.max_tokens, seed=0,",
     ["tests/rollout/test_session.py::test_each_turn_records_the_sampling_it_was_sent_with"]),
    ("the sink fsyncs neither the record nor its folder", "rollout/sink.py",
     "        os.fsync(f.fileno())\n", "        f.flush()\n",
     ["tests/rollout/test_record.py::test_each_record_and_its_folder_entry_are_fsynced"]),
    ("a session's history writes its starting tree again instead of borrowing it",
     "envs/workspace.py", "        if start is None:\n            self._git(\"init\"",
     "        if True:\n            self._git(\"init\"",
     ["tests/envs/test_workspace.py::"
      "test_sessions_borrow_their_task_s_starting_tree_and_diff_as_if_they_owned_it"]),
    ("the scheduler drops the records that landed when the run stops", "rollout/scheduler.py",
     "        finally:  # on every way out, what landed is handed on\n            landed.flush()\n",
     "        finally:\n            pass\n",
     ["tests/rollout/test_scheduler.py::"
      "test_what_landed_before_the_run_stops_is_handed_on_before_it_raises"]),
    ("the retry wait does not double", "rollout/scheduler.py",
     "wait = self.backoff_s * 2 ** job.attempt", "wait = self.backoff_s",
     ["tests/rollout/test_scheduler.py::test_the_wait_before_a_retry_doubles"]),
    ("the count of infrastructure errors in a row is never reset", "rollout/scheduler.py",
     "                    self.consecutive_infra = 0\n", "                    pass\n",
     ["tests/rollout/test_scheduler.py::test_a_success_resets_the_count_of_failures_in_a_row"]),
    ("the corpus keeps sessions whose token sequence broke", "rollout/reports/corpus.py",
     '        elif not r["prefix_consistent"]:', "        elif False:",
     ["tests/rollout/reports/test_corpus.py::test_the_other_filters_each_remove_what_they_name"]),
    ("admission sizes itself by the first engine only", "rollout/admission.py",
     "        self.capacity = sum(s.capacity_tokens for s in states)",
     "        self.capacity = states[0].capacity_tokens",
     ["tests/rollout/test_admission.py::test_the_cache_is_every_engines_together"]),
    ("the trainer's view keeps failed, broken and stale sessions", "rollout/rl/trainer_view.py",
     "    table = table.filter(keep).combine_chunks()",
     "    table = table.combine_chunks()",
     ["tests/rollout/test_record.py::test_the_trainer_view_leaves_out_what_no_trainer_should_see"]),
    ("a failed scoring sandbox scores 0 instead of an infrastructure error", "envs/scoring.py",
     'changes.diff, infra_error=f"scoring sandbox failed: {exc}")', "changes.diff)",
     ["tests/envs/test_tasks.py::test_a_hidden_test_sandbox_that_fails_is_an_infra_error_never_a_zero"]),
    ("pass@k takes the fewest samples of any task", "rollout/reports/report.py",
     "    n_max = max((t.n", "    n_max = min((t.n",
     ["tests/rollout/reports/test_report.py::test_an_unscored_rollout_leaves_k_at_the_samples_per_task"]),
    ("the engines' grammar masks are not narrowed to UTF-8", "serving/engine/plugin.py",
     "        if bool(row.any()):", "        if False:",
     ["tests/serving/toolcall/test_utf8.py::"
      "test_a_grammar_of_characters_refuses_overlong_forms_once_guarded"]),
    ("a turn an update cut short is recorded anyway", "rollout/session.py",
     "            if not cut and sampled_by is not None:", "            if True:",
     ["tests/rollout/test_session.py::"
      "test_a_turn_an_update_cut_is_sampled_again_and_tagged_with_the_new_version"]),
    ("a continued turn keeps what ran across two pauses", "rollout/session.py",
     "            if cut and self.limits.continue_turns and end.pauses <= 1:",
     "            if cut and self.limits.continue_turns:",
     ["tests/rollout/test_session.py::test_a_continued_request_two_pauses_fell_inside_is_"
      "sampled_again_from_the_last_known_point"]),
    ("an uncut request a pause fell inside is tagged with the version it began on",
     "rollout/session.py",
     "                end.after if self.limits.continue_turns and end.pauses == 1 else None)",
     "                (version, checkpoint) if self.limits.continue_turns and end.pauses == 1 "
     "else None)",
     ["tests/rollout/test_session.py::test_a_continued_request_one_pause_fell_inside_uncut_"
      "ran_whole_on_the_new_version"]),
    ("KV arriving during a load is let land on the new weights", "serving/policy.py",
     "            _go_back(controls, loaded, previous, mode, publish)\n            loaded.clear()",
     "            on_all(controls, lambda c: c.settle(mode))",
     ["tests/serving/test_policy.py::"
      "test_an_engine_never_runs_on_new_weights_before_its_cache_is_dropped"]),
    ("a disagg fleet pauses its prefill and decode workers at once", "serving/policy.py",
     "    on_all([c for c in controls if c.hands_off_kv], lambda c: c.pause(mode))\n"
     "    on_all([c for c in controls if not c.hands_off_kv], lambda c: c.pause(mode))\n",
     "    on_all(controls, lambda c: c.pause(mode))\n",
     ["tests/serving/test_policy.py::"
      "test_a_prefill_worker_pauses_before_its_decode_worker_and_resumes_after_it"]),
    ("sessions outlive the policy lag bound", "rollout/session.py",
     "        if lag is not None and version - self.first_version > lag:", "        if False:",
     ["tests/rollout/test_session.py::"
      "test_a_session_past_the_policy_lag_bound_ends_stale_or_is_kept_marked"]),
    ("SIGTERM is an exception asyncio swallows", "rollfleet/cli.py",
     "class Terminated(KeyboardInterrupt):", "class Terminated(BaseException):",
     ["tests/rollfleet/test_cli.py::"
      "test_terminated_raised_inside_a_transport_callback_stops_the_loop"]),
    ("the session's exec server leaves what a command started running", "envs/exec_server.py",
     "    _clear(me)\n", "",
     ["tests/envs/test_sandbox.py::test_what_a_command_leaves_running_ends_with_it[persistent]"]),
    ("a persistent sandbox starts anew for every command", "envs/workspace.py",
     "            if policy.persistent and policy.isolate:", "            if False:",
     ["tests/envs/test_sandbox.py::test_a_persistent_sandbox_starts_once_per_session"]),
    ("the hidden tests run in the session's exec server", "envs/scoring.py",
     "policy=replace(policy, persistent=False), history=False)",
     "policy=policy, history=False)",
     ["tests/envs/test_tasks.py::test_hidden_tests_run_in_a_sandbox_of_their_own"]),
    ("an integer without minimum and maximum is refused", "serving/toolcall/values.py",
     "        frac = 0 if integer else self.caps.frac_digits\n",
     "        if integer and not {\"minimum\", \"maximum\"} & set(schema):\n"
     "            raise UnsupportedSchema(\"integer\", \"without minimum and maximum\")\n"
     "        frac = 0 if integer else self.caps.frac_digits\n",
     ["tests/serving/toolcall/test_values.py::test_an_unbounded_integer_gets_fifteen_digits"]),
    ("serve samples tool calls its own way, beside the shared turn", "serving/serve/proxy.py",
     "from serving.toolcall import CallTooLong, UnsupportedSchema\n",
     "from serving.toolcall import CallTooLong, UnsupportedSchema, parse_glm  # noqa: F401\n",
     ["tests/test_layout.py::test_one_constrained_turn_and_one_schema_checker"]),
    ("serve keeps the run folder as typed, relative (e2e)", "serving/serve/cli.py",
     "    run_dir = Path(cfg.run_dir).absolute()", "    run_dir = Path(cfg.run_dir)",
     ["tests/e2e/test_serve.py::"
      "test_outside_clients_get_chat_streams_and_valid_tool_calls[embedded]"]),
    ("serve dies on SIGTERM without stopping what it started (e2e)", "serving/serve/cli.py",
     "    terminate_on_sigterm()  # unwinds like Ctrl-C: everything is stopped\n", "",
     ["tests/e2e/test_serve.py::"
      "test_outside_clients_get_chat_streams_and_valid_tool_calls[embedded]"]),
    ("a weight update leaves the experts unpacked (e2e)", "serving/engine/plugin.py",
     "        if updating:\n"
     "            self.moe_kernel.fused_experts.process_weights_after_loading(layer)\n", "",
     ["tests/e2e/test_policy_update.py::"
      "test_updates_mid_run_lose_nothing_tag_every_token_and_reuse_no_old_kv[embedded]"]),
    ("a weight update skips dropping the old KV (e2e)", "serving/policy.py",
     '            answer = self._request("POST", "/reset_prefix_cache", params={',
     '            answer = {"success": True} or self._request("POST", "/reset_prefix_cache", '
     'params={',
     ["tests/e2e/test_policy_update.py::"
      "test_updates_mid_run_lose_nothing_tag_every_token_and_reuse_no_old_kv[embedded]",
      "tests/e2e/test_policy_update.py::"
      "test_a_turn_cut_by_an_update_goes_on_under_the_new_weights[embedded]"]),
    ("a CPU engine winds a split prefill's seeded generator back by offset (e2e)",
     "serving/vllm_engine.py", '        env[CPU_SEEDS_ENV] = "1"\n', "",
     ["tests/e2e/test_split_prefill.py::"
      "test_a_seeded_request_draws_the_same_whether_its_prefill_was_split_or_not"]),
    ("a turn cut by an update resumes its grammar from the start (e2e)", "serving/frontdoor.py",
     '        return {"guided_grammar": f"{GRAMMAR_PREFIX_LINE}{len(resume)}\\n{grammar.ebnf}"}',
     '        return {"guided_grammar": grammar.ebnf}',
     ["tests/e2e/test_policy_update.py::"
      "test_a_turn_cut_by_an_update_goes_on_under_the_new_weights[kv_routed_with_tier]"]),
    ("the KV tier's namespace counts the resets an engine saw",
     "serving/engine/kvtier/connector.py",
     "            self.ns = self._policy_namespace()\n", "            self.ns += \"+\"\n",
     ["tests/serving/test_kvtier_connector.py::"
      "test_engines_agree_on_the_namespace_whatever_resets_each_saw"]),
    ("a Dynamo update aborts through a route that needs request ids", "serving/policy.py",
     '                                          "clear_cache": False})\n\n'
     "    def reload(",
     '                                          "clear_cache": False})\n'
     '        if mode == "abort":\n'
     '            self._engine("abort_request", {"abort_all": True})\n\n'
     "    def reload(",
     ["tests/serving/test_policy.py::"
      "test_a_dynamo_update_relies_on_the_pause_and_never_aborts_by_route"]),
    ("a vLLM cache reset answering success false counts as done", "serving/policy.py",
     '            if answer.get("success") is True:', "            if answer:",
     ["tests/serving/test_policy.py::"
      "test_a_vllm_reset_answering_success_false_is_never_taken_as_done"]),
    ("retention deletes the checkpoint an update would roll back to", "serving/checkpoints.py",
     "            if version in (served.version, rollback.version if rollback else None):",
     "            if version == served.version:",
     ["tests/serving/test_checkpoints.py::"
      "test_the_store_never_deletes_a_folder_it_did_not_write"]),
    ("a forced token's recomputed logprob keeps the disallowed mass", "serving/toolcall/replay.py",
     '    logits = logits.masked_fill(~allowed[:, :width], float("-inf")) / temperature',
     "    logits = logits / temperature",
     ["tests/serving/toolcall/test_replay.py::"
      "test_a_forced_token_is_exactly_zero_with_no_gradient_and_greedy_is_a_point_mass",
      "tests/rollout/rl/test_reinforce.py::test_a_forced_token_carries_no_gradient"]),
    ("the engines report the unmasked logprob as the behaviour one", "serving/config.py",
     '    "behaviour": "processed_logprobs",', '    "behaviour": "raw_logprobs",',
     ["tests/serving/test_vllm_engine.py::"
      "test_behaviour_logprobs_are_vllms_processed_ones_with_the_plugins_greedy_fix"]),
    ("a group older than max_off_policy_steps is handed to the trainer", "rollout/rl/loop.py",
     "        if k is not None and group.lag > k:", "        if False:",
     ["tests/rollout/rl/test_loop.py::test_no_group_older_than_k_is_ever_handed_to_the_trainer",
      "tests/rollout/rl/test_loop.py::"
      "test_a_group_exactly_k_versions_old_is_handed_over_and_one_more_is_not"]),
    ("hard session affinity replays every session in every group", "planner/offline.py",
     "                                   if bound[json.loads(line)[\"session_id\"]] == g))\n",
     "                                   ))\n",
     ["tests/planner/test_simulate.py::"
      "test_hard_affinity_keeps_every_session_on_its_prefill_worker_and_its_decoders"]),
    ("serve's relay buffers the cluster's answer", "serving/serve/proxy.py",
     "            async for chunk in resp.content.iter_any():\n"
     "                await out.write(chunk)\n",
     "            await out.write(await resp.read())\n",
     ["tests/serving/serve/test_proxy.py::"
      "test_requests_without_tools_are_relayed_as_they_came_and_stream_back"]),
    ("a failed file call names the host's session folder", "envs/tools.py",
     "            return ToolResult(output=f\"error: {self._as_seen(exc)}\", ok=True, failed=True)",
     "            return ToolResult(output=f\"error: {exc}\", ok=True, failed=True)",
     ["tests/envs/test_tools.py::test_missing_file_is_a_failed_call_not_a_malformed_one"]),
    ("vLLM keeps its temp files in the system temp folder", "serving/vllm_engine.py",
     "        \"TMPDIR\": str(scratch),  # vLLM's ZMQ sockets and file stores go to "
     "tempfile.gettempdir()\n", "",
     ["tests/serving/test_vllm_engine.py::"
      "test_behaviour_logprobs_are_vllms_processed_ones_with_the_plugins_greedy_fix"]),
    ("a dead job's socket folders are kept", "rollfleet/owner.py",
     "    for path in gone:\n        shutil.rmtree(path, ignore_errors=True)\n", "",
     ["tests/rollfleet/test_owner.py::test_a_dead_owners_folders_are_swept_and_a_live_ones_kept",
      "tests/serving/test_process.py::test_a_server_dies_with_a_sigkilled_job"]),
    ("a front door keeps the first event loop's HTTP client", "serving/frontdoor.py",
     "        http = self._http.get(loop)\n",
     "        http = next(iter(self._http.values()), None)\n",
     ["tests/serving/test_frontdoor.py::test_one_door_serves_one_event_loop_after_another"]),
    ("the planner buys a fleet that met the target under one seed",
     "planner/plan_cmd.py", 'ok = len(judged) == len(settings) and all(r["ok"] for r in judged)',
     'ok = any(r["ok"] for r in judged)',
     ["tests/planner/test_simulate.py::"
      "test_a_small_plan_is_the_smallest_fleet_that_simulation_finds_by_brute_force"]),
    ("the sensitivity shows its first seed's figures", "planner/sensitivity.py",
     "            row[f] = sum(values) / len(values)\n", "            row[f] = values[0]\n",
     ["tests/planner/test_simulate.py::"
      "test_the_sensitivity_sweep_moves_one_knob_at_a_time_once_per_value_and_seed"]),
    ("the launcher leaves the hard rlimits open", "envs/launch.c",
     "struct rlimit r = {n, n};", "struct rlimit r = {n, RLIM_INFINITY};",
     ["tests/envs/test_launcher.py::test_it_sets_every_rlimit_it_is_given"]),
    ("the launcher leaves the other sessions' mounts in bwrap's view", "envs/launch.c",
     "        if (umount2(points[i], MNT_DETACH) && errno != EINVAL && errno != ENOENT)",
     "        if (0)",
     ["tests/envs/test_sandbox.py::test_a_sandbox_starts_apart_from_the_other_sessions_mounts"]),
    ("the first session out unmounts every session's files", "envs/lease.py",
     "    return os.stat(mounts).st_nlink <= 2 and not os.listdir(mounts)", "    return True",
     ["tests/envs/test_lease.py::test_the_mounts_folder_goes_with_the_last_session_out"]),
    ("a command is waited for no longer than a glance", "envs/sandbox.py",
     "return bool(poller.poll(None if timeout_s is None else math.ceil(timeout_s * 1000)))",
     "return bool(poller.poll(0))",
     ["tests/envs/test_sandbox.py::test_wait_exit_sees_an_exit_and_stops_at_the_timeout"]),
    ("a forked test run keeps the fork server's root", "envs/unittest_fork_server.py",
     "        os.setresuid(uid, uid, uid)", "        pass",
     ["tests/envs/test_unittest_forks.py::test_a_forked_run_is_confined_like_any_command"]),
    ("a forked test run imports the warm modules where the task ships its own",
     "envs/unittest_forks.py",
     "        return not any(name.partition(\".\")[0] in warm for name in os.listdir(cwd))",
     "        return True",
     ["tests/envs/test_unittest_forks.py::"
      "test_a_module_of_the_task_named_like_a_warm_one_runs_the_execd_interpreter",
      "tests/envs/test_unittest_forks.py::"
      "test_a_folder_holding_a_module_named_like_a_warm_one_is_not_forked"]),
]


def _pytest(tree: Path, tests: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *tests], cwd=tree, text=True, capture_output=True, env=env)


def main() -> int:
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else ""
    mutations = [m for m in MUTATIONS if ("--fast" not in sys.argv or "(e2e)" not in m[0])
                 and only in m[0]]
    survivors = 0
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree),
                        "HEAD"], check=True)
        try:
            (tree / ".cache").mkdir()
            (tree / ".cache" / "models").symlink_to(ROOT / ".cache" / "models")
            everything = sorted({t for m in mutations for t in m[4]})
            baseline = _pytest(tree, everything)
            if baseline.returncode != 0:
                print(f"the unbroken tree fails its own tests:\n{baseline.stdout[-3000:]}")
                return 2
            print(f"unbroken tree: {len(everything)} tests pass")
            for what, path, old, new, tests in mutations:
                subprocess.run(["git", "-C", str(tree), "checkout", "-q", "--", "."], check=True)
                target = tree / path
                text = target.read_text()
                if old not in text:
                    print(f"{what}: the code to break is gone; update this script")
                    return 2
                target.write_text(text.replace(old, new))
                run = _pytest(tree, tests)
                caught = [ln.split(" - ")[0] for ln in run.stdout.splitlines()
                          if ln.startswith("FAILED")]
                survivors += len(tests) - len(caught)
                print(f"{what}: {len(caught)} of {len(tests)} tests fail")
                for line in caught:
                    print(f"    {line}")
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                           check=False)
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
