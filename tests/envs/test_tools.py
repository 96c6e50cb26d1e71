import json
import time

import pytest

from envs import EnvConfig, load

ENV = load(EnvConfig(tool_timeout_s=2, max_output_chars=300))


@pytest.fixture
def episode():
    with ENV.episode("stats_mean") as ep:
        yield ep


def test_schemas_are_strict():
    for tool in ENV.tools:
        fn = tool["function"]
        assert fn["strict"] is True
        params = fn["parameters"]
        assert params["additionalProperties"] is False
        assert sorted(params["required"]) == sorted(params["properties"])
    assert [t["function"]["name"] for t in ENV.tools] == [
        "bash", "read_file", "write_file", "str_replace", "search", "run_tests", "submit"]


def test_bash_runs_in_the_workspace(episode):
    out = episode.call("bash", json.dumps({"command": "ls; pwd"}))
    assert out.ok and "stats.py" in out.output and str(episode.workspace.path) in out.output


def _read(path, start=None, end=None):
    return {"path": path, "start_line": start, "end_line": end}


def test_read_and_write(episode):
    assert "def mean" in episode.call("read_file", _read("stats.py")).output
    assert episode.call("read_file", _read("stats.py", 4, 5)).output.splitlines() == [
        "     4  def mean(values):", "     5      values = list(values)"]
    episode.call("write_file", {"path": "new/x.txt", "content": "hi"})
    assert (episode.workspace.path / "new" / "x.txt").read_text() == "hi"
    diff = episode.workspace.changes().diff
    assert "diff --git a/new/x.txt b/new/x.txt" in diff and "+hi" in diff


def test_str_replace_and_search(episode):
    fix = {"path": "stats.py", "old_text": "(len(values) - 1)", "new_text": "len(values)"}
    assert episode.call("str_replace", fix).output == "replaced 1 occurrence in stats.py"
    again = episode.call("str_replace", fix)
    assert again.ok and again.failed and "occurs 0 times" in again.output
    assert "stats.py:8:" in episode.call("search", {"text": "sum(values) / len"}).output


def test_missing_file_is_a_failed_call_not_a_malformed_one(episode):
    result = episode.call("read_file", _read("nope.py"))
    assert result.ok and result.failed and result.error is None
    # as the model sees its files: nothing of the host's session folder
    assert result.output == "error: No such file or directory: nope.py"
    result = episode.call("read_file", _read("pkg/../missing/deeper.py"))
    assert result.output == "error: No such file or directory: missing/deeper.py"
    result = episode.call("str_replace", {"path": ".", "old_text": "a", "new_text": "b"})
    assert result.failed and result.output == "error: Is a directory: ."


def test_paths_outside_the_repo_are_refused(episode):
    for name, args in (("read_file", _read("../../etc/passwd")),
                       ("write_file", {"path": "/tmp/escape.txt", "content": "x"})):
        result = episode.call(name, args)
        assert "outside the repository" in result.output


@pytest.mark.parametrize(("name", "args", "error"), [
    ("nope", "{}", "unknown tool"),
    ("bash", "{not json", "not JSON"),
    ("bash", "{}", "'command' is a required property"),
    ("bash", json.dumps({"command": "ls", "extra": 1}), "Additional properties"),
    ("read_file", json.dumps({"path": 3, "start_line": None, "end_line": None}),
     "is not of type 'string'"),
])
def test_malformed_calls_are_data_not_crashes(episode, name, args, error):
    result = episode.call(name, args)
    assert not result.ok and error in result.error


def test_timeout_kills_the_command(episode):
    start = time.monotonic()
    result = episode.call("bash", {"command": "sleep 30 & sleep 30"})
    assert time.monotonic() - start < 10
    assert "timed out" in result.output


def test_output_is_truncated_with_a_marker(episode):
    result = episode.call("bash", {"command": "python3 -c 'print(\"x\" * 5000)'"})
    assert "truncated ...]" in result.output and len(result.output) < 500


def test_run_tests_and_submit(episode):
    assert "Ran 1 test" in episode.call("run_tests", "{}").output
    assert episode.call("submit", "{}").submitted
