"""The folder layout is the architecture (docs/architecture.md): who may import whom, read from
the source itself, and what an actor loads when it imports serving's client face."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rollfleet.paths import ROOT

PROJECT = ("rollfleet", "kernels", "envs", "serving", "planner", "rollout")
MAY_IMPORT = {  # package -> the project's packages it may import
    "rollfleet": set(),
    "kernels": set(),
    "envs": {"rollfleet"},
    "serving": {"rollfleet", "kernels"},  # design.md: serving may use kernels
    "planner": {"rollfleet", "kernels", "serving"},
    "rollout": {"rollfleet", "envs", "serving"},
}
ACTOR_FILES = ("rollout/worker.py", "rollout/session.py", "rollout/model_client.py")


def imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
    return out


def imported_names(path: Path) -> set[str]:
    """`module.name` for every `from module import name` in the file."""
    return {f"{node.module}.{alias.name}"
            for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.ImportFrom) and node.module for alias in node.names}


def sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", PROJECT)
def test_each_package_imports_only_what_the_layout_allows(package):
    bad = [f"{path.relative_to(ROOT)}: {name}" for path in sources(package)
           for name in imports(path)
           if (top := name.split(".")[0]) in PROJECT and top != package
           and top not in MAY_IMPORT[package]]
    assert bad == []


def test_kernels_depend_on_torch_and_triton_only():
    allowed = {"torch", "triton", "numpy", "kernels"}
    bad = [f"{path.relative_to(ROOT)}: {name}" for path in sources("kernels")
           for name in imports(path)
           if name.split(".")[0] not in allowed | set(sys.stdlib_module_names)]
    assert bad == []


def test_actors_use_servings_client_face_only():
    bad = [f"{f}: {name}" for f in ACTOR_FILES for name in imports(ROOT / f)
           if name.startswith("serving.")]
    assert bad == []


FACE_NAMES = 15  # what rollout imports of serving's face (docs/architecture.md names them)


def test_rollout_sees_serving_through_a_dozen_names_of_its_face_none_of_them_the_cluster():
    deep = [f"{path.relative_to(ROOT)}: {name}" for path in sources("rollout")
            for name in imports(path) if name.startswith("serving.")]
    names = {name for path in sources("rollout") for name in imported_names(path)
             if name.startswith("serving.")}
    assert deep == []
    assert len(names) <= FACE_NAMES, sorted(names)
    assert "serving.Cluster" not in names


def test_the_standalone_apps_are_imported_by_nothing_else():
    bad = [f"{path.relative_to(ROOT)}: {name}" for package in PROJECT
           for path in sources(package) for name in imports(path)
           for app in ("serving.serve", "planner")
           if name.startswith(app) and not path.is_relative_to(ROOT / app.replace(".", "/"))]
    assert bad == []


def test_the_planner_uses_serving_through_its_face_alone():
    """`from serving import ...` only: serving's config, errors and cluster, as it exports
    them, never a module below it."""
    deep = [f"{path.relative_to(ROOT)}: {name}" for path in sources("planner")
            for name in imports(path) if name.startswith("serving.")]
    assert deep == []


def test_the_client_face_loads_no_cluster_dynamo_kv_tier_or_weight_updates():
    """(The topologies' registry, a table of names, is part of the config; no topology.)"""
    probe = ("import sys, serving, rollout.worker; "
             "print(sorted(m for m in sys.modules if m.startswith(('serving.cluster', "
             "'serving.topologies.', 'serving.dynamo', 'serving.kvtier', 'serving.policy', "
             "'serving.checkpoints', 'dynamo', 'mooncake'))))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_one_constrained_turn_and_one_schema_checker():
    """Grammar, sampling, parsing and checking a tool call are serving/tool_turn.py's, used by
    the rollout client and by `serving.serve` alike; a call's arguments are checked against
    their schema in one place (rollfleet/toolschema.py), by the parser and by the tools."""
    files = [path for package in PROJECT for path in sources(package)]
    turn_parts = {f"serving.toolcall.{n}" for n in ("build_grammar", "parse_glm", "check_call")}
    assembling = [str(p.relative_to(ROOT)) for p in files if imported_names(p) & turn_parts
                  and not p.is_relative_to(ROOT / "serving/toolcall")]
    assert assembling == ["serving/tool_turn.py"]
    assert "serving.ToolCallSampler" in imported_names(ROOT / "rollout/model_client.py")
    assert "serving.tool_turn.ToolCallSampler" in imported_names(ROOT / "serving/serve/proxy.py")
    checkers = [str(p.relative_to(ROOT)) for p in files if "jsonschema" in imports(p)]
    assert checkers == ["rollfleet/toolschema.py"]
    checks = {f"rollfleet.toolschema.{n}" for n in ("schema_problems", "problem_kinds")}
    users = {str(p.relative_to(ROOT)) for p in files if imported_names(p) & checks}
    assert users == {"envs/tools.py", "serving/toolcall/parser.py"}, users


FLEET_PARTS = ("running_cluster", "ray.init", "Scheduler", "RecordSink", "Provenance",
               "remote_worker", "remote_board", "KvBudget", "FixedWindow")


def _called(path: Path) -> set[str]:
    """The dotted names of everything called in a file."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            func, parts = node.func, []
            while isinstance(func, ast.Attribute):
                parts.append(func.attr)
                func = func.value
            if isinstance(func, ast.Name):
                out.add(".".join([func.id, *reversed(parts)]))
    return out


def test_one_place_builds_the_fleet_the_job_and_the_rl_loop_share():
    """rollout/fleet.py starts the cluster, Ray, the workers, admission, the scheduler and the
    sink; the job's command line and the RL loop take a Fleet and build none of it."""
    builders = {part: sorted(str(path.relative_to(ROOT)) for path in sources("rollout")
                             if part in _called(path)) for part in FLEET_PARTS}
    # a trainer's client joins the service's Ray (it starts none)
    attach = {"ray.init": ["rollout/fleet.py", "rollout/rl/service.py"]}
    assert builders == {**dict.fromkeys(FLEET_PARTS, ["rollout/fleet.py"]), **attach}
    for user in ("rollout/run.py", "rollout/rl/loop.py"):
        assert "Fleet" in _called(ROOT / user), user


def test_rollout_types_the_cluster_by_a_protocol_never_any():
    loop = (ROOT / "rollout" / "rl" / "loop.py").read_text()
    assert "self.cluster: ServingCluster" in loop and "cluster: Any" not in loop
    assert not [p for p in sources("rollout") if "cluster: Any" in p.read_text()]


RUN_FOLDER_NAMES = ("data", "dataset", "trainer", "corpus", "logs", "policy", "checkpoints",
                    "dynamo", "discovery", "kvtier", "summary.json", ".hydra", "served.json")


def test_no_run_folder_path_is_typed_by_hand_outside_run_dir():
    """Every path inside a run folder comes from rollfleet/run_dir.py (RunDir)."""
    pattern = re.compile(r'/\s*"(' + "|".join(map(re.escape, RUN_FOLDER_NAMES)) + r')"')
    typed = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for package in (*PROJECT, "scripts") for path in sources(package)
             if path != ROOT / "rollfleet" / "run_dir.py"
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if pattern.search(line) and "ROOT /" not in line]
    assert typed == []


def test_run_dir_names_every_folder_it_has_in_its_docstring():
    from rollfleet import run_dir

    doc = run_dir.__doc__
    folders = [name for name, value in vars(run_dir.RunDir).items()
               if isinstance(value, property)]
    missing = [name for name in folders
               if getattr(run_dir.RunDir(Path("/r")), name).relative_to("/r").parts[0]
               not in doc]
    assert missing == []
