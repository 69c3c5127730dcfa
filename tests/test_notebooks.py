"""The notebooks run headlessly on a synthetic sweep (so they cannot rot) and are committed without outputs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from fixtures_runs import STANDARD_SWEEP, make_sweep

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
# the headless commands as the docs print them, run in the repository root (`jupyter lab` in place of
# `jupyter execute` opens the same notebook with the same parameter cell)
NOTEBOOK_COMMANDS = [
    "DAPO_SWEEP_DIR=multirun/demo jupyter execute notebooks/ablation_analysis.ipynb",
    "DAPO_SWEEP_DIR=multirun/demo jupyter execute notebooks/rollout_inspection.ipynb",
]


@pytest.fixture(scope="module")
def kernel() -> str:
    """The ``python3`` kernel; installed for this interpreter (``ipykernel install --user``) if missing."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        subprocess.run([sys.executable, "-m", "ipykernel", "install", "--user"], check=True)
    return "python3"


def test_both_notebooks_exist():
    assert [p.name for p in NOTEBOOKS] == ["ablation_analysis.ipynb", "rollout_inspection.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stripped_and_only_calls_the_library(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: outputs not stripped"
            no_code = "def " not in cell.source and "class " not in cell.source
            assert no_code, "analysis code belongs in dapo_exp.analysis, not in a notebook"
    assert any("parameters" in c.metadata.get("tags", []) for c in nb.cells), "a parameters cell is expected"


def _repo_copy(tmp_path: Path) -> Path:
    """A repository root: run.py and conf/ linked, the notebooks copied (so that running them leaves
    the real ones untouched)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("run.py", "conf"):
        (repo / name).symlink_to(REPO / name)
    (repo / "notebooks").mkdir()
    for nb in NOTEBOOKS:
        (repo / "notebooks" / nb.name).write_bytes(nb.read_bytes())
    return repo


@pytest.fixture(scope="module")
def documented(kernel, tmp_path_factory):
    """``documented(command)``: one of NOTEBOOK_COMMANDS run as written, once per module (a notebook's two
    tests below read the one execution), in the root of a repository copy holding the synthetic sweep at
    multirun/demo -> (the process, the executed notebook, the repository copy, its DAPO_ANALYSIS_OUT).
    The executed notebook is kept beside the copy (``NbClientApp.output_base``, what ``jupyter execute
    --output`` sets, from a Jupyter config file: the command stays as documented). The environment holds no
    DAPO_* variable but DAPO_ANALYSIS_OUT, an absolute directory the ablation notebook writes its table to
    (the default, the sweep's analysis/, is checked with no variable set in
    test_the_headline_sweep_then_both_notebooks_with_no_variable_set)."""
    base = tmp_path_factory.mktemp("documented")
    repo = _repo_copy(base)
    make_sweep(repo / "multirun" / "demo", STANDARD_SWEEP)
    config = base / "jupyter_config"
    config.mkdir()
    (config / "jupyter_execute_config.json").write_text(
        json.dumps({"NbClientApp": {"output_base": "{notebook_name}_executed"}}))
    out_dir = base / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAPO_")}
    # `jupyter` of this environment first on the PATH, as after `pip install -e '.[notebook]'` in it
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", MPLBACKEND="Agg",
               OMP_NUM_THREADS="1", JUPYTER_CONFIG_PATH=str(config), DAPO_ANALYSIS_OUT=str(out_dir))
    ran: dict[str, tuple] = {}

    def run(command: str):
        if command not in ran:
            out = subprocess.run(["bash", "-c", command], cwd=repo, env=env, capture_output=True, text=True,
                                 timeout=600)
            executed = repo / "notebooks" / f"{Path(command.split()[-1]).stem}_executed.ipynb"
            nb = nbformat.read(executed, as_version=4) if executed.is_file() else None
            ran[command] = (out, nb, repo, out_dir)
        return ran[command]

    return run


def _command_of(path: Path) -> str:
    (command,) = [c for c in NOTEBOOK_COMMANDS if c.endswith(f"notebooks/{path.name}")]
    return command


def _text(nb) -> str:
    return "\n".join(str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", ""))
                     for c in nb.cells if c.cell_type == "code" for o in c.outputs)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path, documented):
    """What the notebook shows on the synthetic sweep (read from its documented command's execution)."""
    before = path.read_bytes()
    out, nb, repo, out_dir = documented(_command_of(path))
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert nb is not None, f"no executed copy of {path.name}: {(out.stdout + out.stderr)[-2000:]}"
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert outputs and not [o for o in outputs if o.output_type == "error"]
    text = _text(nb)
    if path.stem == "ablation_analysis":
        images = [o for o in outputs if "image/png" in o.get("data", {})]
        assert len(images) == 4, "three curve figures (step, rollouts, tokens) and the effects' forest plot"
        md = "\n".join(o.get("data", {}).get("text/markdown", "") for o in outputs)
        assert "paired t" in md and "Welch t" in md and "Student-t" in md
        assert "**Effects.**" in md and "aliased with" in md
        assert (out_dir / "table.md").is_file()
        assert f"wrote {out_dir / 'table.md'}" in text  # said, not silent (the sweep's own by default)
        assert not (repo / "multirun" / "demo" / "analysis").exists()  # DAPO_ANALYSIS_OUT's, not the default
    else:
        assert "=== grpo ===" in text and "[truncated]" in text and "[longest]" in text
    # the notebooks are untouched: the real one, and the copy the command ran (outputs went to the file beside)
    assert path.read_bytes() == before
    copy = nbformat.read(repo / "notebooks" / path.name, as_version=4)
    assert all(c.get("outputs", []) == [] for c in copy.cells if c.cell_type == "code")


@pytest.mark.slow
@pytest.mark.parametrize("command", NOTEBOOK_COMMANDS, ids=lambda c: c.split("/")[-1])
def test_the_documented_notebook_command_runs_from_the_repository_root(command, documented):
    """The sweep path is relative to the repository root, though the kernel starts in notebooks/: the
    notebook read multirun/demo (the synthetic sweep's labels are in its outputs) and wrote nothing under
    notebooks/."""
    out, nb, repo, _ = documented(command)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert nb is not None, (out.stdout + out.stderr)[-2000:]
    text = _text(nb)
    assert all(label in text for label in ("grpo", "clip")), text[-2000:]
    assert not (repo / "notebooks" / "multirun").exists()


@pytest.mark.slow
def test_the_headline_sweep_then_both_notebooks_with_no_variable_set(kernel, tmp_path, monkeypatch, warm_cache):
    """README's headline command, then the notebooks as a user opens them: no DAPO_* variable, the
    default path (the newest sweep under multirun/)."""
    from helpers import NO_FIGURES, SMALL
    from nbclient import NotebookClient

    repo = _repo_copy(tmp_path)
    headline = ["-m", "fixes=grpo,clip,clip_ds,full"]  # README, "The ablation"; docs/tutorial.md
    # the sweep's own figures are not drawn: the notebooks below draw theirs from its runs
    out = subprocess.run([sys.executable, "run.py", *headline, *SMALL, "train.steps=1", f"model.cache_dir={warm_cache}",
                          NO_FIGURES],
                         cwd=repo, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    sweep = repo / "multirun" / "fixes=grpo,clip,clip_ds,full"
    # no seed= given: the default five seeds per configuration, so the table's cells carry intervals
    assert "[sweep] 20 runs: 4 configuration(s) x 5 seed(s) (seed= not given" in out.stdout
    summaries = [json.loads(p.read_text()) for p in sweep.glob("*/summary.json")]
    assert sorted((s["label"], s["seed"]) for s in summaries) == sorted(
        (label, seed) for label in ("grpo", "clip", "clip_ds", "full") for seed in range(5))
    rows = [ln.split("|") for ln in (sweep / "analysis" / "table.md").read_text().splitlines()
            if ln.startswith("| ") and ln.split("|")[1].strip() in ("grpo", "clip", "clip_ds", "full")]
    assert len(rows) == 4 and all(r[2].strip() == "5" for r in rows)
    assert all(re.fullmatch(r"\s*\d+\.\d ± \d+\.\d\s*", r[3]) for r in rows), rows  # final acc: mean ± half-width
    # the sweep's end analysis wrote it; the ablation notebook writes it again there (its default OUT_DIR)
    (sweep / "analysis" / "table.md").unlink()
    for var in ("DAPO_SWEEP_DIR", "DAPO_ANALYSIS_OUT", "DAPO_WANDB"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    for nb_path in sorted((repo / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(nb_path, as_version=4)
        NotebookClient(nb, kernel_name=kernel, timeout=300,
                       resources={"metadata": {"path": str(repo / "notebooks")}}).execute()
        errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
        assert not errors, (nb_path.name, errors)
    assert (sweep / "analysis" / "table.md").is_file()  # the notebook's, with no variable set
