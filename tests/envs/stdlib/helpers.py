"""A made-up stdlib folder with one module, and a valid row for it."""

from __future__ import annotations

from pathlib import Path

from envs.stdlib.mutations import Mutation
from envs.stdlib.rows import GENERATOR_VERSION, Row
from envs.stdlib.source import sha256_text

SOURCE = "def clamp(x, hi):\n    if x > hi:\n        return hi\n    return x\n"


def fake_stdlib(root: Path, text: str = SOURCE) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "fakemod.py").write_text(text)
    return root


def fake_row(**changes) -> Row:
    fields = dict(task_id="fakemod.0001", module="fakemod", path="fakemod.py",
                  source_sha256=sha256_text(SOURCE), python="3.11.7",
                  mutation=Mutation("flip_comparison", (2, 9), (2, 10), ">", ">="),
                  test_module="test.test_fakemod", fail_to_pass=("test.test_fakemod.T.test_a",),
                  pass_to_pass=("test.test_fakemod.T.test_b",), statement="clamp is off",
                  difficulty="hard", generator=GENERATOR_VERSION)
    fields.update(changes)
    return Row(**fields)
