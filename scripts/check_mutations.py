"""Break five promises on purpose in a scratch copy of the tree and show the tests that catch it.

    python scripts/check_mutations.py

Each mutation is applied to a fresh `git worktree` of HEAD (the working tree is never touched),
the named tests run there, and the script exits 1 if any of them still passes (tests/README.md,
"Shown failing on a deliberately broken build").
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
     '    if c.logprobs == "raw":  # see serving/engine/plugin.py\n'
     '        env[UNMASKED_LOGPROBS_ENV] = "1"\n', "",
     ["tests/serving/test_vllm_engine.py::"
      "test_raw_logprobs_are_asked_for_and_unmasked_by_the_plugin"]),
    ("the sink buffers records instead of writing each", "rollout/sink.py",
     "        _write_durably(pa.Table.from_pylist([row], schema=self.schema), path)\n",
     "        self.__dict__.setdefault('buffer', []).append(row)\n",
     ["tests/rollout/test_record.py::test_each_record_is_on_disk_when_write_returns",
      "tests/rollout/test_record.py::test_records_written_before_a_sigkill_survive"]),
    ("the scheduler records infrastructure errors instead of retrying", "rollout/scheduler.py",
     "                    if job.attempt < self.max_retries:", "                    if False:",
     ["tests/rollout/test_scheduler.py::test_infra_errors_are_retried_with_backoff_then_recorded"]),
    ("a missing metric reads as 0.0", "serving/metrics.py",
     "    if name not in metrics:\n"
     "        raise MetricsError(f\"{url or 'metrics'} reports no {name}\")\n", "",
     ["tests/serving/test_metrics.py::test_a_missing_metric_is_an_error_not_zero"]),
]


def main() -> int:
    survivors = 0
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree),
                        "HEAD"], check=True)
        try:
            (tree / ".cache").mkdir()
            (tree / ".cache" / "models").symlink_to(ROOT / ".cache" / "models")
            for what, path, old, new, tests in MUTATIONS:
                subprocess.run(["git", "-C", str(tree), "checkout", "-q", "--", "."], check=True)
                target = tree / path
                text = target.read_text()
                if old not in text:
                    print(f"{what}: the code to break is gone; update this script")
                    return 2
                target.write_text(text.replace(old, new))
                env = {**os.environ, "PYTHONPATH": str(tree)}
                run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p",
                                      "no:cacheprovider", *tests], cwd=tree, text=True,
                                     capture_output=True, env=env)
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
