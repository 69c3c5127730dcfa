"""The shape of the package: layered imports with no cycle, short functions, one owner per list."""

import ast
import graphlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "dapo_exp"


def _module(p: Path) -> str:
    parts = list(p.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in PKG.rglob("*.py")}


def _imports(path: Path) -> set[str]:
    """Project modules imported anywhere in the file (module level and inside functions)."""
    deps = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dapo_exp"):
            deps.add(node.module)
            deps.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in MODULES)
        elif isinstance(node, ast.Import):
            deps.update(a.name for a in node.names if a.name.startswith("dapo_exp"))
    return {d for d in deps if d in MODULES and d != "dapo_exp"}


GRAPH = {m: _imports(p) - {m} for m, p in MODULES.items()}

# The layers, bottom first: a module may import only from its own layer or below.
LAYERS = [
    # 0: import nothing of the project
    {"dapo_exp.objective", "dapo_exp.config", "dapo_exp.fixes", "dapo_exp.rundir", "dapo_exp.evaluation",
     "dapo_exp.batching", "dapo_exp.logprobs", "dapo_exp.tracking", "dapo_exp.checkpoint", "dapo_exp.models",
     "dapo_exp.console"},
    # 1: registries and what they choose from: tasks, rollout, algorithms; Hydra glue; analysis
    {"dapo_exp.registry", "dapo_exp.algorithms", "dapo_exp.hydra_setup", "dapo_exp.cli_errors", "dapo_exp.tasks*",
     "dapo_exp.rollout*",
     "dapo_exp.analysis*"},
    # 2: the named steps of the loop; other engines a job can run on (translated configs, launchers)
    {"dapo_exp.steps", "dapo_exp.backends*"},
    # 3: the loop
    {"dapo_exp.train"},
    # 4: programs on top
    {"dapo_exp.benchmarks*"},
]


def _layer(m: str) -> int:
    for i, layer in enumerate(LAYERS):
        if m in layer or any(p.endswith("*") and (m == p[:-1] or m.startswith(p[:-1] + ".")) for p in layer):
            return i
    raise AssertionError(f"{m} is in no layer of tests/test_architecture.py: place it")


def test_no_import_cycle():
    graphlib.TopologicalSorter(GRAPH).prepare()  # raises CycleError naming the cycle


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "dapo_exp"))
def test_imports_go_down_the_layers(module):
    up = {d for d in GRAPH[module] if _layer(d) > _layer(module)}
    assert not up, f"{module} (layer {_layer(module)}) imports from above: {sorted(up)}"


@pytest.mark.parametrize("module", ["dapo_exp.objective", "dapo_exp.config", "dapo_exp.fixes", "dapo_exp.rundir"])
def test_the_bottom_imports_nothing_of_the_project(module):
    assert GRAPH[module] == set()


def test_analysis_never_imports_the_trainer_or_rollouts():
    forbidden = {"dapo_exp.train", "dapo_exp.steps", "dapo_exp.algorithms", "dapo_exp.logprobs", "dapo_exp.models"}
    for m in (m for m in MODULES if m.startswith("dapo_exp.analysis")):
        bad = {d for d in GRAPH[m] if d in forbidden or d.startswith("dapo_exp.rollout")}
        assert not bad, f"{m} imports {sorted(bad)}"


def test_no_function_over_80_lines():
    long = []
    for m, p in MODULES.items():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 80:
                long.append(f"{m}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not long, long


def test_switch_names_are_written_in_one_place():
    """The five switch names appear as a literal list only in the registry (dapo_exp/fixes.py)."""
    from dapo_exp import fixes

    names = list(fixes.FIXES)
    pattern = re.compile(r"[\"']" + r"[\"'],\s*[\"']".join(names[:3]))
    offenders = [m for m, p in MODULES.items() if m != "dapo_exp.fixes" and pattern.search(p.read_text())]
    assert not offenders, f"a second list of the switch names in {offenders}"
