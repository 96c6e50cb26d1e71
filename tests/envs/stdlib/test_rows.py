"""Task rows: validation names the task, and a bad row is refused or skipped, never a crash."""

from __future__ import annotations

import json

import pytest

from envs.stdlib.rows import TaskRowError, parse_row, write_rows
from envs.stdlib.suite import load_rows
from tests.envs.stdlib.helpers import fake_row


def test_json_round_trip_groups_test_ids_by_class(tmp_path):
    p2p = ("test.test_fakemod.A.B.test_c", "test.test_fakemod.T.test_b",
           "test.test_fakemod.T.test_c", "test.test_fakemod.test_function")
    row = fake_row(pass_to_pass=p2p)
    obj = row.to_json()
    assert obj["fail_to_pass"] == {"T": ["test_a"]}
    assert obj["pass_to_pass"] == {"A.B": ["test_c"], "T": ["test_b", "test_c"],
                                   "": ["test_function"]}
    assert parse_row(json.loads(json.dumps(obj)), "here") == row
    write_rows([row], tmp_path / "t.jsonl")
    assert load_rows(tmp_path / "t.jsonl", check_source=False) == [row]


@pytest.mark.parametrize("change, why", [
    ({"statement": None}, "missing fields \\['statement'\\]"),
    ({"difficulty": "brutal"}, "difficulty 'brutal'"),
    ({"fail_to_pass": {}}, "fail_to_pass is empty"),
    ({"path": "../evil.py"}, "want a top-level"),
    ({"mutation": {"op": "x"}}, "bad mutation"),
    ({"pass_to_pass": ["T.test_b"]}, "map test classes to lists of test names"),
    ({"pass_to_pass": {"T": []}}, "map test classes"),
])
def test_bad_fields_are_reported_with_the_task_id(change, why):
    obj = {**fake_row().to_json(), **change}
    obj = {k: v for k, v in obj.items() if v is not None}
    with pytest.raises(TaskRowError, match=f"^task fakemod.0001: .*{why}"):
        parse_row(obj, "tasks.jsonl line 3")


def test_a_row_without_id_is_named_by_its_line():
    obj = fake_row().to_json()
    del obj["task_id"]
    with pytest.raises(TaskRowError, match="^tasks.jsonl line 3: missing fields"):
        parse_row(obj, "tasks.jsonl line 3")


def _file(tmp_path, lines):
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_load_skips_bad_rows_and_reports_each_by_id(tmp_path):
    good = fake_row().to_json()
    missing = {k: v for k, v in fake_row(task_id="fakemod.0002").to_json().items()
               if k != "statement"}
    path = _file(tmp_path, [json.dumps(good), "{not json", json.dumps(missing),
                            json.dumps(good)])
    reports: list[str] = []
    rows = load_rows(path, on_bad="skip", check_source=False,
                     report=lambda exc: reports.append(str(exc)))
    assert [r.task_id for r in rows] == ["fakemod.0001"]
    assert reports[0].startswith("tasks.jsonl line 2: not JSON")
    assert reports[1].startswith("task fakemod.0002: missing fields ['statement']")
    assert reports[2].startswith("task fakemod.0001: duplicate id")


def test_load_refuses_the_first_bad_row_when_configured(tmp_path):
    path = _file(tmp_path, [json.dumps(fake_row(difficulty="x").to_json())])
    with pytest.raises(TaskRowError, match="^task fakemod.0001: difficulty"):
        load_rows(path, on_bad="fail", check_source=False)


def test_load_checks_the_installed_source_by_default(tmp_path):
    """fakemod is not a stdlib module: with check_source the row is reported, not loaded."""
    path = _file(tmp_path, [json.dumps(fake_row().to_json())])
    reports: list[str] = []
    assert load_rows(path, on_bad="skip", report=lambda exc: reports.append(str(exc))) == []
    assert reports[0].startswith("task fakemod.0001: module fakemod not found")
