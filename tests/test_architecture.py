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
    # 0: the bottom: pure functions, the schema, run files; the fixes (their registry and modules,
    # which reach only the objective, the config error and the run files' metric names)
    {"dapo_exp.errors", "dapo_exp.objective", "dapo_exp.config", "dapo_exp.fixes*", "dapo_exp.rundir", "dapo_exp.evaluation",
     "dapo_exp.batching", "dapo_exp.logprobs", "dapo_exp.tracking", "dapo_exp.checkpoint", "dapo_exp.models",
     "dapo_exp.console", "dapo_exp.keyed", "dapo_exp.quiet", "dapo_exp.packaged_models"},
    # 1: registries and what they choose from: tasks, rollout; the composition of the fixes' hooks;
    # Hydra glue and the checks before launch; analysis
    {"dapo_exp.registry", "dapo_exp.compose", "dapo_exp.hydra_setup", "dapo_exp.cli_errors", "dapo_exp.tasks*",
     "dapo_exp.preflight",
     "dapo_exp.rollout*",
     "dapo_exp.analysis*"},
    # 2: the named steps of the loop; a run's pieces and its lifecycle; other engines a job can run on
    {"dapo_exp.steps", "dapo_exp.build", "dapo_exp.runner", "dapo_exp.backends*"},
    # 3: the loop
    {"dapo_exp.train"},
    # 4: programs on top (the benchmarks; the generator of the docs' reference pages)
    {"dapo_exp.benchmarks*", "dapo_exp.docs_reference"},
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


@pytest.mark.parametrize("module", ["dapo_exp.errors", "dapo_exp.objective", "dapo_exp.rundir"])
def test_the_bottom_imports_nothing_of_the_project(module):
    assert GRAPH[module] == set()


def test_the_schema_reaches_only_the_fixes_and_the_error():
    """The ``algo`` section is assembled from the fixes' declarations: the schema imports them and nothing else."""
    fixes_pkg = {m for m in MODULES if m.startswith("dapo_exp.fixes")}
    assert GRAPH["dapo_exp.config"] <= fixes_pkg | {"dapo_exp.errors"}, sorted(GRAPH["dapo_exp.config"])


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("dapo_exp.fixes")))
def test_a_fix_reaches_only_the_objective_and_the_registry(module):
    allowed = {"dapo_exp.objective", "dapo_exp.errors", "dapo_exp.rundir"} | {
        m for m in MODULES if m.startswith("dapo_exp.fixes")}
    assert GRAPH[module] <= allowed, sorted(GRAPH[module] - allowed)


def test_the_registry_base_is_torch_free():
    """The analysis reads the registry: importing it must not import torch."""
    code = "import sys, dapo_exp.fixes; assert 'torch' not in sys.modules, 'torch imported'"
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def _string_module_names(path: Path) -> set[str]:
    """Project modules named in string constants ("dapo_exp.x.y" or "dapo_exp.x.y:Name"): string imports.
    A dotted name that is no module names its longest prefix that is one."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            m = re.fullmatch(r"(dapo_exp(?:\.\w+)+)(?::[\w.]+)?", node.value)
            if m:
                parts = m.group(1).split(".")
                prefixes = (".".join(parts[:i]) for i in range(len(parts), 1, -1))
                names.add(next((p for p in prefixes if p in MODULES), m.group(1)))
    return names


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "dapo_exp"))
def test_no_string_import_of_a_higher_layer(module):
    """A module may not reach a higher layer by naming it in a string (importlib, a "module:Class" tag):
    the owner registers itself with the lower module instead."""
    up = {d for d in _string_module_names(MODULES[module]) if d in MODULES and _layer(d) > _layer(module)}
    assert not up, f"{module} (layer {_layer(module)}) names higher modules in strings: {sorted(up)}"


def test_the_string_import_rule_can_fail(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('import importlib\nimportlib.import_module("dapo_exp.train")\nTAG = "dapo_exp.rollout.groups:Group"\n')
    assert _string_module_names(bad) == {"dapo_exp.train", "dapo_exp.rollout.groups"}


# Below the composition layer (dapo_exp.compose, dapo_exp.build, dapo_exp.train) no function takes a
# config object: the steps, the rollout's groups and group filter, the objective and the fixes'
# slots get plain values and bound callables.
BELOW_COMPOSITION = ["dapo_exp.objective", "dapo_exp.steps", "dapo_exp.rollout.groups",
                     "dapo_exp.rollout.dynamic_sampling", "dapo_exp.rollout.engine", "dapo_exp.batching",
                     "dapo_exp.logprobs", "dapo_exp.evaluation", "dapo_exp.checkpoint"]
CONFIG_NAMES = {"cfg", "config", "algo", "conf", "a_cfg"}
CONFIG_TYPES = {"DictConfig", "Config", "AlgoConfig", "OmegaConf"}


def _config_parameters(path: Path) -> list[str]:
    bad = []
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.ImportFrom, ast.Import)):
            mods = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            bad += [f"imports {m}" for m in mods if m.startswith(("omegaconf", "hydra", "dapo_exp.config"))]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            for a in args:
                ann = ast.unparse(a.annotation) if a.annotation is not None else ""
                if a.arg in CONFIG_NAMES or any(t in ann for t in CONFIG_TYPES):
                    bad.append(f"{node.name}({a.arg}: {ann or '?'})")
    return bad


@pytest.mark.parametrize("module", BELOW_COMPOSITION)
def test_no_config_object_below_the_composition_layer(module):
    assert not _config_parameters(MODULES[module]), _config_parameters(MODULES[module])


def test_the_config_rule_can_fail(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from omegaconf import DictConfig\ndef f(x, *, algo): ...\ndef g(c: DictConfig): ...\n")
    assert _config_parameters(bad) == ["imports omegaconf", "f(algo: ?)", "g(c: DictConfig)"]


def test_analysis_never_imports_the_trainer_or_rollouts():
    forbidden = {"dapo_exp.train", "dapo_exp.steps", "dapo_exp.compose", "dapo_exp.build", "dapo_exp.runner",
                 "dapo_exp.logprobs", "dapo_exp.models"}
    for m in (m for m in MODULES if m.startswith("dapo_exp.analysis")):
        bad = {d for d in GRAPH[m] if d in forbidden or d.startswith("dapo_exp.rollout")}
        assert not bad, f"{m} imports {sorted(bad)}"


def logic_lines(node: ast.AST, lines: list[str]) -> int:
    """The lines of a function that hold code: its span less its docstring, blank lines and comment-only lines
    (a cap on them is a cap on logic, never met by cutting a comment or a docstring)."""
    body = node.body
    doc = set()
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        doc = set(range(body[0].lineno, body[0].end_lineno + 1))
    return sum(1 for i in range(node.lineno, node.end_lineno + 1)
               if i not in doc and lines[i - 1].strip() and not lines[i - 1].strip().startswith("#"))


def test_logic_lines_count_code_only():
    src = 'def f(x):\n    """Doc.\n\n    More doc.\n    """\n    # a comment\n\n    y = x + 1\n    return y\n'
    assert logic_lines(ast.parse(src).body[0], src.splitlines()) == 3


def test_no_function_over_60_lines_of_logic():
    long = []
    for m, p in MODULES.items():
        text = p.read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and logic_lines(node, text.splitlines()) > 60:
                long.append(f"{m}.{node.name}: {logic_lines(node, text.splitlines())} lines of logic")
    assert not long, long


def test_switch_names_are_written_in_one_place():
    """The five switch names appear as a literal list only in the registry (dapo_exp/fixes.py)."""
    from dapo_exp import fixes

    names = list(fixes.FIXES)
    pattern = re.compile(r"[\"']" + r"[\"'],\s*[\"']".join(names[:3]))
    offenders = [m for m, p in MODULES.items() if m != "dapo_exp.fixes" and pattern.search(p.read_text())]
    assert not offenders, f"a second list of the switch names in {offenders}"


def test_train_is_short_with_its_loop_near_the_top():
    """train.py holds the composition and a loop that reads top to bottom: under 300 lines, and
    the loop is the second function of the file (after train(), the entry point)."""
    src = MODULES["dapo_exp.train"].read_text()
    assert len(src.splitlines()) < 300
    funcs = [n.name for n in ast.parse(src).body if isinstance(n, ast.FunctionDef)]
    assert funcs[:2] == ["train", "loop"], funcs


def test_the_documented_layer_table_is_the_tested_one():
    """docs/explanation/architecture.md's table names every module or package of LAYERS, each in its layer."""
    table = {}
    for line in (ROOT / "docs/explanation/architecture.md").read_text().splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) == 3 and cells[0] in {"0", "1", "2", "3", "top"}:
            for name in re.findall(r"`([^`]+)`", cells[1]):
                if name.startswith("hydra_plugins/") or name == "run.py":
                    continue
                mod = "dapo_exp." + name.removeprefix("dapo_exp/").removesuffix("/").removesuffix(".py").replace("/", ".")
                table[mod] = len(LAYERS) - 1 if cells[0] == "top" else int(cells[0])
    wrong = {m: (layer, _layer(m)) for m, layer in table.items() if _layer(m) != layer}
    assert not wrong, f"documented layer vs tested layer: {wrong}"
    listed = {p.rstrip("*") for layer in LAYERS for p in layer}
    assert listed <= set(table), f"in LAYERS, not in the documented table: {sorted(listed - set(table))}"
