"""The rollout record: one schema that RL, evals and corpora all read.

Token ids and logprobs are stored per turn exactly as the server returned them. When every turn's
prompt extends the previous prompt + completion (the chat template is prefix-stable), the record
also carries the whole conversation as one sequence with a loss mask, ready for a trainer.
"""

from __future__ import annotations

from typing import Any

from datasets import Features, List, Value

from serving import ISSUE_KINDS

TOOL_CALL = {
    "id": Value("string"),
    "name": Value("string"),
    "arguments": Value("string"),
    "valid": Value("bool"),  # well-formed: a known tool, arguments match its schema
    "error": Value("string"),
    "failed": Value("bool"),  # well-formed, but the tool itself failed
    "issues": List(Value("string")),  # malformed, unknown_tool, missing_argument, ...
    "output": Value("string"),
}

TURN = {
    "index": Value("int32"),
    "prompt_token_ids": List(Value("int32")),
    "completion_token_ids": List(Value("int32")),
    "completion_logprobs": List(Value("float32")),
    "finish_reason": Value("string"),
    "content": Value("string"),
    "tool_calls": List(TOOL_CALL),
    "constraint": Value("string"),  # the grammar the turn was sampled under
    "issues": List(Value("string")),  # turn-level: cut_off, subtoken_markup
    "dropped_calls": Value("int32"),  # calls in the sampled text the server's parser dropped
    "prompt_tokens": Value("int32"),
    "completion_tokens": Value("int32"),
    "cached_tokens": Value("int32"),
    "engine_id": Value("string"),  # the engine that decoded the turn
    "prefill_engine_id": Value("string"),  # disaggregated serving: the engine that prefilled it
    "seed": Value("int64"),
    "latency_s": Value("float32"),
    "tool_s": Value("float32"),
}

MESSAGE = {
    "role": Value("string"),
    "content": Value("string"),
    "tool_calls": Value("string"),  # JSON list, as sent back to the server
    "tool_call_id": Value("string"),
}

FEATURES = Features({
    "rollout_id": Value("string"),
    "run_id": Value("string"),
    "task_id": Value("string"),
    "group_id": Value("string"),
    "sample_index": Value("int32"),
    "attempt": Value("int32"),
    "status": Value("string"),  # ok | truncated | infra_error
    "stop_reason": Value("string"),  # submitted | max_turns | max_tokens | context_length | error
    "error": Value("string"),
    "reward": Value("float32"),
    "reward_info": {
        "tests_total": Value("int32"),
        "tests_failed": Value("int32"),
        "output": Value("string"),
    },
    "final_diff": Value("string"),  # what the session changed, as a unified diff
    "messages": List(MESSAGE),
    "turns": List(TURN),
    "num_turns": Value("int32"),
    "num_tool_calls": Value("int32"),
    "num_invalid_tool_calls": Value("int32"),
    "tool_call_issues": {k: Value("int32") for k in (*ISSUE_KINDS, "dropped", "failed")},
    "prompt_tokens": Value("int32"),
    "completion_tokens": Value("int32"),
    "cached_tokens": Value("int32"),
    "prefix_consistent": Value("bool"),
    "token_ids": List(Value("int32")),
    "loss_mask": List(Value("int8")),
    "logprobs": List(Value("float32")),
    "timings": {
        "wall_s": Value("float32"),
        "model_s": Value("float32"),
        "tool_s": Value("float32"),
        "score_s": Value("float32"),
    },
    "provenance": {
        "model": Value("string"),
        "model_path": Value("string"),
        "config_hash": Value("string"),
        "seed": Value("int64"),
        "versions": Value("string"),  # JSON object of package versions
        "created_at": Value("string"),
    },
})


def flatten_turns(turns: list[dict[str, Any]]) -> tuple[bool, list[int], list[int], list[float]]:
    """Join turns into one sequence if each prompt extends the previous prompt + completion.

    Returns (consistent, token_ids, loss_mask, logprobs); prompt positions get mask 0 and
    logprob 0.0, sampled positions mask 1 and the server's logprob. An inconsistent history
    (a re-rendered prompt that differs from what was sampled) returns empty sequences.
    """
    tokens: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    for turn in turns:
        prompt, completion = turn["prompt_token_ids"], turn["completion_token_ids"]
        if not prompt or prompt[: len(tokens)] != tokens:
            return False, [], [], []
        new = prompt[len(tokens):]
        tokens += new + completion
        mask += [0] * len(new) + [1] * len(completion)
        logprobs += [0.0] * len(new) + list(turn["completion_logprobs"])
    return bool(turns), tokens, mask, logprobs
