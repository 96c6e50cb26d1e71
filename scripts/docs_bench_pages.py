"""Writes the benchmark data pages, docs/benchmarks/data/*.md, from the committed JSON in bench/
and kernels/results/, so a measured figure has one home: its JSON. Each file becomes a section
that says the command, the commit, the machine and the date it came from, as far as the JSON
records them (what it does not record is said, not guessed), and renders every figure in tables.

tests/scripts/test_docs_bench_pages.py fails when a committed page differs from what this
writes now, and when a JSON file has no page.

    python scripts/docs_bench_pages.py          # rewrite the pages
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks" / "data"
# page -> (title, what it holds, the JSON files' globs, relative to the repository root)
PAGES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "rl": ("RL: updates, behaviour logprobs, the example loop",
           "What a weight update costs, how the recorded logprobs match a recompute, and the "
           "example trainer's steps ([RL training](../../guides/rl-training.md)).",
           ("bench/policy_update.json", "bench/policy_update_disagg.json", "bench/behaviour.json",
            "bench/rl_loop_steps.json", "bench/weight_transfer.json")),
    "rollout": ("The rollout engine and the sandbox",
                "The engine's ceiling against mocker engines, the comparison with vf-eval, the "
                "grammar's cost, admission, and the sandbox's costs "
                "([engine benchmark](../engine.md), [environments](../../environments.md)).",
                ("bench/rollout.json", "bench/rollout_ceiling.json",
                 "bench/rollout_driver_rss.json", "bench/rollout_homes/*.json",
                 "bench/actor_cpu_ab/*.json", "bench/launcher_ab/*.json", "bench/sandbox*.json")),
    "toolcalls": ("Tool calls",
                  "The project's grammar against the stock one, and published tool schemas "
                  "through `serving.serve` ([tool calls](../../toolcalls.md)).",
                  ("bench/toolcalls.json", "bench/toolschemas.json")),
    "serving": ("Serving: routing, disaggregation, the KV tier",
                "([Serving topologies and the KV tier](../../guides/serving-topologies.md)).",
                ("bench/routing.json", "bench/disagg.json", "bench/kvtier.json",
                 "bench/kv_layout.json")),
    "planner": ("The capacity planner's simulations",
                "([The capacity planner](../../planner.md)).",
                ("bench/simulate_*.json", "bench/simulate_prefill_workers/*.json",
                 "bench/nixl_descriptor_counts.json")),
    "kernels": ("The kernels on GPUs",
                "Run on the borrowed H100 and H200 machines ([the kernels](../../kernels.md)).",
                ("kernels/results/*.json",)),
}
# plots made from a JSON's run that the JSON does not name
PLOTS = {"bench/rl_loop_steps.json": "rl_loop_reward.png"}
MAX_COLUMNS = 14  # a wider record is split into a table per member
MAX_ROWS = 400  # past it, a table says how many rows it left to the JSON


def _num(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.0f}"
    if isinstance(v, (list, tuple)):
        if all(not isinstance(x, (dict, list)) for x in v) and len(v) <= 12:
            return ", ".join(_num(x) for x in v)
        return f"({len(v)} items)"
    if isinstance(v, dict):
        return f"({len(v)} keys)" if v else "{}"
    return str(v)


def _cell(v: Any) -> str:
    return _num(v).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("\n", " ")


def _scalar(v: Any) -> bool:
    """A value that fits one cell: a number, a string, an empty or a short flat list."""
    if not isinstance(v, (dict, list)) or not v:
        return True
    return isinstance(v, list) and len(v) <= 12 and all(not isinstance(x, (dict, list)) for x in v)


def _flat(d: dict, prefix: str = "") -> dict[str, Any]:
    """A record's figures as dotted columns (a long list stays one cell: its count)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _table(rows: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Rows of (name, figures) as a table, a column per figure."""
    columns = list(dict.fromkeys(c for _, r in rows for c in r))
    out = ["|  | " + " | ".join(_cell(c) for c in columns) + " |",
           "|---" * (len(columns) + 1) + "|"]
    for name, r in rows[:MAX_ROWS]:
        out.append(f"| {_cell(name)} | " + " | ".join(_cell(r.get(c)) for c in columns)
                   + " |")
    if len(rows) > MAX_ROWS:
        out.append(f"\n({len(rows) - MAX_ROWS} more rows in the JSON.)")
    return out


def _records(node: Any) -> list[tuple[str, dict[str, Any]]] | None:
    """A dict of dicts or a list of dicts as (name, flat record) rows, if it reads as a table:
    one row per member, or, for a few members with many figures, one column per member."""
    items = list(node.items()) if isinstance(node, dict) else list(enumerate(node))
    if not items or not all(isinstance(v, dict) for _, v in items):
        return None
    rows = [(str(k), _flat(v)) for k, v in items]
    columns = list(dict.fromkeys(c for _, r in rows for c in r))
    if len(columns) <= MAX_COLUMNS:
        return rows
    if len(rows) <= MAX_COLUMNS:
        return [(c, {name: r.get(c) for name, r in rows}) for c in columns]
    return None


def render_node(node: Any, title: str, level: int) -> list[str]:
    """A JSON value under a heading: a table where it reads as one, else its members in turn."""
    heading = ["#" * min(level, 6) + f" {title}", ""]
    if _scalar(node):
        return heading + [f"`{_cell(node)}`", ""]
    rows = _records(node)
    if rows is not None:
        out = heading + _table(rows) + [""]
        for name, row in rows:  # a long list in a cell: its own table after this one
            for column, v in row.items():
                if not _scalar(v):
                    out += render_node(v, f"{title} / {name} / {column}", level + 1)
        return out
    if isinstance(node, list):
        if all(_scalar(x) for x in node):
            return heading + _table([(str(i), {"value": x}) for i, x in enumerate(node)]) + [""]
        return heading + [line for i, x in enumerate(node)
                          for line in render_node(x, f"{title} [{i}]", level + 1)]
    out = list(heading)
    scalars = {k: v for k, v in node.items() if _scalar(v)}
    if scalars:
        out += _table([(k, {"value": v}) for k, v in scalars.items()]) + [""]
    for k, v in node.items():
        if k not in scalars:
            out += render_node(v, f"{title} / {k}", level + 1)
    return out


def provenance(path: str, data: Any) -> list[str]:
    """Command, commit, machine and date, as the JSON records them."""
    d = data if isinstance(data, dict) else {}
    machine = d.get("machine") or d.get("gpu") or d.get("gpus")
    if isinstance(machine, (dict, list)):
        machine = json.dumps(machine)
    command = d.get("command")
    if command and not str(command).startswith(("python", "bash")):
        command = f"{command} (the subcommand, as the JSON records it)"
    said = [("command", f"`{command}`" if command else "not recorded in the JSON"),
            ("commit", f"`{d['commit']}`" if d.get("commit") else "not recorded in the JSON"),
            ("machine", f"`{machine}`" if machine else "not recorded in the JSON"),
            ("date", f"`{d['date']}`" if d.get("date") else "not recorded in the JSON")]
    if isinstance(d.get("versions"), dict):
        said.append(("versions", ", ".join(f"{k} {v}" for k, v in d["versions"].items())))
    cited = citing_pages(path)
    said.append(("cited on", ", ".join(f"[{p}](../../{p})" for p in cited) if cited else
                 "no written page names it"))
    return [f"- {k}: {v}" for k, v in said]


def citing_pages(path: str) -> list[str]:
    """The written pages that name this JSON: where its command, commit and reading are told."""
    docs = ROOT / "docs"
    # a file in a folder of runs (bench/launcher_ab/...) is cited by its folder
    name = Path(path).name if Path(path).parent.name in ("bench", "results") else \
        f"{Path(path).parent}/"
    # a whole name: bench/disagg.json is not cited by a page naming policy_update_disagg.json
    named = re.compile(rf"(?<![\w.-]){re.escape(name)}")
    return sorted(str(p.relative_to(docs)) for p in docs.rglob("*.md")
                  if OUT not in p.parents and named.search(_with_snippets(p.read_text())))


def _with_snippets(text: str) -> str:
    """A page's text with the files it includes (`--8<-- "path"`, as docs/kernels.md does)."""
    included = [line.split('"')[1] for line in text.splitlines() if line.startswith('--8<-- "')]
    return "\n".join([text, *((ROOT / f).read_text() for f in included)])


def render_file(path: str) -> list[str]:
    data = json.loads((ROOT / path).read_text())
    out = [f"## `{path}`", "", *provenance(path, data), ""]
    for plot in sorted(set(_plots(data)) | ({PLOTS[path]} if path in PLOTS else set())):
        out += [f"![{Path(plot).stem}](../../{plot})", ""]
    skip = {"date", "machine", "gpu", "gpus", "command", "commit", "versions"}
    body = {k: v for k, v in data.items() if k not in skip} if isinstance(data, dict) else data
    if isinstance(body, dict):
        scalars = {k: v for k, v in body.items() if _scalar(v)}
        if scalars:
            out += _table([(k, {"value": v}) for k, v in scalars.items()]) + [""]
        for k, v in body.items():
            if k not in scalars:
                out += render_node(v, k, 3)
    else:
        out += render_node(body, "records", 3)
    return out


def _plots(node: Any) -> list[str]:
    """The plots a run wrote into docs/ (a path the JSON records, as `simulate.plot`)."""
    if isinstance(node, dict):
        return [p for v in node.values() for p in _plots(v)]
    if isinstance(node, list):
        return [p for v in node for p in _plots(v)]
    if isinstance(node, str) and node.startswith("docs/") and node.endswith(".png") \
            and (ROOT / node).is_file():
        return [node.removeprefix("docs/")]
    return []


def files(globs: tuple[str, ...]) -> list[str]:
    return sorted({str(p.relative_to(ROOT)) for g in globs for p in ROOT.glob(g)})


def render() -> dict[str, str]:
    """Every page: file name -> text."""
    pages = {}
    for name, (title, what, globs) in PAGES.items():
        out = [f"# {title}", "",
               f"Generated by `python scripts/docs_bench_pages.py` from the committed JSON; do "
               f"not edit by hand. {what} Floats are shown to 4 significant digits; the JSON "
               f"holds them whole.", ""]
        for path in files(globs):
            out += render_file(path)
        pages[f"{name}.md"] = "\n".join(out).rstrip() + "\n"
    return pages


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in render().items():
        (OUT / name).write_text(text)
        print(f"wrote {(OUT / name).relative_to(ROOT)} ({len(text) // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
