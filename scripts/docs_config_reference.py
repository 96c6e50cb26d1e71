"""Writes docs/reference/config.md from the code, so the configuration reference cannot drift:
every Hydra group under conf/, what each of its option files sets, and every key of the
dataclass the group is typed by, with its type, default and meaning.

A key's meaning is the comment its dataclass carries on the field (a trailing comment, else
the comment lines right above it): the code's own one-line explanation, read with `tokenize`,
so the config code stays as it is and a key without one is a failing test
(tests/scripts/test_docs_config_reference.py), not a blank cell.

    python scripts/docs_config_reference.py          # rewrite the page
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import sys
import tokenize
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from envs.sandbox import SandboxPolicy  # noqa: E402
from planner.config import SimulateConfig  # noqa: E402
from rollfleet.paths import CONF  # noqa: E402
from rollout.config import SCHEMAS  # noqa: E402
from serving.serve.cli import ServeConfig  # noqa: E402

PAGE = ROOT / "docs" / "reference" / "config.md"
# group -> its schema; the job's (rollout/config.py), `python -m serving.serve`'s, the planner's
GROUPS: dict[str, type] = {**SCHEMAS, "serve": ServeConfig, "simulate": SimulateConfig}
# a dict-typed key whose entries are another dataclass's fields (envs: `SandboxPolicy(**sandbox)`)
NESTED: dict[str, type] = {"env.sandbox": SandboxPolicy}
# the root configs: which command composes each
ROOTS = {"config.yaml": "`python -m rollout.run`", "serve.yaml": "`python -m serving.serve`"}
LONGEST_DEFAULT = 60


@dataclasses.dataclass(frozen=True)
class Key:
    name: str
    type: str
    default: str
    meaning: str


def _comments(path: Path) -> dict[int, str]:
    """Line number -> the comment on that line, for a Python source file."""
    found = {}
    with path.open("rb") as f:
        for tok in tokenize.tokenize(f.readline):
            if tok.type == tokenize.COMMENT:
                found[tok.start[0]] = tok.string.lstrip("#").strip()
    return found


def _meaning(stmt: ast.AnnAssign, comments: dict[int, str], lines: list[str]) -> str:
    """A trailing comment on the field's lines, else the comment block right above it."""
    trailing = [comments[n] for n in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)
                if n in comments]
    if trailing:
        return " ".join(trailing)
    above, n = [], stmt.lineno - 1
    while n in comments and lines[n - 1].strip().startswith("#"):
        above.insert(0, comments[n])
        n -= 1
    return " ".join(above)


def _default(f: dataclasses.Field, stmt: ast.AnnAssign) -> str:
    """The default as the code computes it; a factory that reads the machine (paths, the
    interpreter) is shown as the call it is, so the page is the same on every machine."""
    if f.default is not dataclasses.MISSING:
        value = f.default
    else:
        call = stmt.value
        factory = next(k.value for k in call.keywords if k.arg == "default_factory")
        if isinstance(factory, ast.Name) and factory.id in ("list", "dict", "tuple"):
            value = f.default_factory()
        else:
            body = factory.body if isinstance(factory, ast.Lambda) else factory
            try:
                value = ast.literal_eval(body)
            except ValueError:
                return f"computed: `{ast.unparse(body)}`"
    text = _inline(value)
    if len(text) > LONGEST_DEFAULT:
        text = text[:LONGEST_DEFAULT] + " ..."
    return f"`{text}`"


def _inline(value: Any) -> str:
    """A value as one line of YAML, as an override would type it."""
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip() \
        .removesuffix("...").strip()


def keys(cls: type, prefix: str) -> list[Key]:
    """Every field of the dataclass `cls` as a documented key under `prefix`."""
    path = Path(inspect.getsourcefile(cls))
    source = path.read_text()
    lines, comments = source.splitlines(), _comments(path)
    node = next(n for n in ast.walk(ast.parse(source))
                if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    stmts = {s.target.id: s for s in node.body
             if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    out = []
    for f in dataclasses.fields(cls):
        stmt = stmts[f.name]
        kind = f"`{ast.unparse(stmt.annotation)}`"
        if "choices" in f.metadata:
            kind += ", one of " + ", ".join(f"`{c}`" for c in f.metadata["choices"])
        out.append(Key(f"{prefix}.{f.name}", kind, _default(f, stmt),
                       _meaning(stmt, comments, lines)))
        if f"{prefix}.{f.name}" in NESTED:
            out += keys(NESTED[f"{prefix}.{f.name}"], f"{prefix}.{f.name}")
    return out


def _yaml_header(path: Path) -> str:
    """The comment lines a YAML file opens with, minus Hydra's package directive."""
    head = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        if not line.startswith("# @package"):
            head.append(line.lstrip("#").strip())
    return " ".join(head)


def _flat(data: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(data, dict) and data:
        return [kv for k, v in data.items() for kv in _flat(v, f"{prefix}{k}.")]
    return [(prefix[:-1], data)]


def _sets(path: Path) -> str:
    """What an option file sets, as the overrides one would type."""
    data = yaml.safe_load(path.read_text()) or {}
    data.pop("defaults", None)
    pairs = _flat(data) if data else []
    if not pairs:
        return "nothing beyond the schema's defaults"
    return ", ".join(f"`{k}={_inline(v)}`" for k, v in pairs)


def root_keys(path: Path) -> list[Key]:
    """The top-level keys a root config sets itself (not its groups', not hydra's), each with
    its trailing comment or the comment lines right above it."""
    lines = path.read_text().splitlines()
    groups = set(GROUPS) | {"hydra", "defaults"}
    out = []
    for i, line in enumerate(lines):
        if not line or line[0] in " #-" or ":" not in line:
            continue
        name, _, rest = line.partition(":")
        if name in groups:
            continue
        value, _, comment = rest.partition("#")
        meaning, n = comment.strip(), i - 1
        while not meaning and n >= 0 and lines[n].startswith("#"):
            n -= 1
        if not meaning:
            meaning = " ".join(x.lstrip("#").strip() for x in lines[n + 1:i])
        out.append(Key(name, "", f"`{value.strip()}`", meaning))
    return out


def _table(rows: list[Key], with_type: bool = True) -> list[str]:
    head = ["| key | type | default | meaning |", "|---|---|---|---|"] if with_type else \
        ["| key | default | meaning |", "|---|---|---|"]
    cell = [(f"`{k.name}`", k.type, k.default, k.meaning) if with_type else
            (f"`{k.name}`", k.default, k.meaning) for k in rows]
    return head + ["| " + " | ".join(_cell(c) for c in row) + " |" for row in cell]


def _cell(text: str) -> str:
    """A table cell: outside code a pipe is escaped and `<...>` is text, not HTML (inside code
    mkdocs' tables read both as they are)."""
    parts = text.split("`")
    return "`".join(p if i % 2 else p.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
                    for i, p in enumerate(parts))


def render() -> str:
    """The whole page."""
    out = ["# Configuration reference", "",
           "Generated by `python scripts/docs_config_reference.py` from the config dataclasses "
           "and `conf/`; do not edit by hand (`tests/scripts/test_docs_config_reference.py` "
           "fails when this page and the code differ). A key's meaning is the comment its "
           "dataclass carries on the field. How the groups compose, and what bad input does: "
           "[Configuration](../configuration.md).", ""]
    for name, command in ROOTS.items():
        out += [f"## Root keys of `conf/{name}` ({command})", "",
                *_table(root_keys(CONF / name), with_type=False), ""]
    for group in sorted(set(GROUPS) | {p.name for p in CONF.iterdir() if p.is_dir()}):
        out += [f"## `{group}`", ""]
        if group in GROUPS:
            cls = GROUPS[group]
            out += [f"Typed by `{cls.__module__}.{cls.__qualname__}`.", ""]
        options = sorted((CONF / group).glob("*.yaml")) if (CONF / group).is_dir() else []
        if options:
            out += ["| option | what | sets |", "|---|---|---|"]
            out += [f"| `{group}={p.stem}` | {_yaml_header(p)} | {_sets(p)} |".replace("\n", " ")
                    for p in options]
            out.append("")
        if group in GROUPS:
            out += [*_table(keys(GROUPS[group], group)), ""]
    return "\n".join(out).rstrip() + "\n"


def main() -> int:
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(render())
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
