"""The documentation: the README stays short and points into the docs, the generated reference
pages are current, every link of the README resolves, and the tutorial's commands run.

The site itself is built by ``.ci/test`` (``mkdocs build --strict``: broken links and pages
missing from the nav fail it); these tests need no MkDocs.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from dapo_exp import docs_reference

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
TUTORIAL = DOCS / "tutorial.md"


def _links(text: str) -> list[str]:
    return [m.group(1).split("#", 1)[0] for m in re.finditer(r"\]\(([^)\s]+)\)", text)
            if not m.group(1).startswith(("http://", "https://", "#", "mailto:"))]


def test_the_readme_is_short_and_its_first_screen_points_to_what_a_newcomer_needs():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines (at most 250: move the rest into docs/)"
    first_screen = "\n".join(lines[:60])
    for needed in ("bash .ci/install && bin/python run.py", "python run.py -m fixes=grpo,clip,clip_ds,full",
                   "docs/tutorial.md", "docs/how-to/gpu.md", "docs/reference/config.md"):
        assert needed in first_screen, f"README's first 60 lines lack {needed!r}"
    assert "## License" in README.read_text()


def test_every_relative_link_of_the_readme_resolves():
    missing = [link for link in _links(README.read_text()) if not (ROOT / link).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_every_page_of_the_nav_exists():
    nav = re.findall(r":\s*([\w./-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), flags=re.MULTILINE)
    assert nav, "no pages found in mkdocs.yml's nav"
    missing = [p for p in nav if not ((DOCS / p).is_file() or (p.startswith("sweeps/") and (ROOT / p).is_file()))]
    assert not missing, f"mkdocs.yml's nav names missing pages: {missing}"


@pytest.mark.parametrize("name", ["config", "presets", "verl"])
def test_the_generated_reference_page_is_current(name):
    """A key added to the schema (or a preset, a switch, a config group) without regenerating fails here."""
    ((rel, text),) = docs_reference.pages((name,)).items()
    assert (ROOT / rel).is_file() and (ROOT / rel).read_text() == text, \
        f"{rel} is stale: run `python -m dapo_exp.docs_reference`"


@pytest.mark.slow
def test_the_generated_cli_help_page_is_current():
    ((rel, text),) = docs_reference.pages(("cli",)).items()
    assert (ROOT / rel).read_text() == text, f"{rel} is stale: run `python -m dapo_exp.docs_reference`"


def test_a_site_file_in_conf_local_changes_no_generated_page():
    """Following the cluster how-to writes a git-ignored conf/local/<site>.yaml: the generated pages never
    read it (docs_reference.PRIVATE_GROUPS), so the staleness tests above pass with one present."""
    before = docs_reference.pages(("config", "presets"))
    local = ROOT / "conf" / "local"
    made = not local.exists()
    site = local / f"test_site_{uuid.uuid4().hex[:8]}.yaml"
    try:
        local.mkdir(exist_ok=True)
        site.write_text("# @package _global_\n# a site's SLURM settings\nbackend:\n  slurm:\n    partition: gpu\n")
        assert docs_reference.pages(("config", "presets")) == before
        run_help = docs_reference._help("run.py")  # Hydra lists the group (local: <site>); the page does not
        assert f"```text\n{run_help}\n```" in (ROOT / docs_reference.PAGES["cli"]).read_text()
    finally:
        site.unlink(missing_ok=True)
        if made:
            with contextlib.suppress(OSError):  # only if nothing else was put there meanwhile
                local.rmdir()
    assert docs_reference.without_private_groups("a: x\nlocal: site\nlogger: none") == "a: x\nlogger: none"


def test_the_config_reference_has_every_key_of_the_schema_with_its_meaning():
    page = (ROOT / docs_reference.PAGES["config"]).read_text()
    rows = docs_reference.schema_rows()
    assert len(rows) > 100
    for row in rows:
        assert f"| `{row['key']}` |" in page, row["key"]
    undocumented = [r["key"] for r in rows if not r["meaning"]]
    assert not undocumented, f"keys with no comment in dapo_exp/config.py: {undocumented}"


# --------------------------------------------------------------------------- #
# the tutorial's commands                                                       #
# --------------------------------------------------------------------------- #
# Commands of the tutorial that the test does not run, each with the reason.
NOT_RUN = {
    "bash .ci/install": "the install itself (tests run inside the installed environment)",
    "source .venv/bin/activate": "the test runs the environment's interpreter directly",
    'pip install -e ".[notebook]"': "an install; the notebooks are executed by tests/test_notebooks.py",
    'pip install -e ".[gguf]"': "an install; the test environment has the gguf extra (the dev extra lists it)",
    "python run.py experiment=smollm2_add2 fixes=grpo": "the real model: tests/test_real_model.py runs this command "
                                                        "at two steps (the toy's reduced sizes do not apply to it)",
}
NOT_RUN_PREFIXES = ("jupyter lab ",)  # opens a browser: the notebook itself runs in tests/test_notebooks.py


def tutorial_commands() -> list[str]:
    """The shell commands of the tutorial's ```bash blocks, in order, comments removed."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", TUTORIAL.read_text(), flags=re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line:
                commands.append(line)
    return commands


def test_the_tutorial_is_the_ablation_of_the_readme():
    commands = tutorial_commands()
    assert "python run.py -m hydra/launcher=parallel fixes=grpo,clip,clip_ds,full" in commands  # the README's, on all cores
    assert commands[0] == "bash .ci/install"


@pytest.mark.slow
def test_the_tutorials_commands_run_at_reduced_size(tmp_path, warm_cache):
    """Every command of the tutorial, in order, in a scratch checkout, with the runs shrunk
    (helpers.SMALL): each exits 0 and the files the tutorial shows are there."""
    from helpers import SMALL

    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("run.py", "conf", "notebooks"):
        (repo / name).symlink_to(ROOT / name)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # `python` is this interpreter
    (bindir / "python").chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "OMP_NUM_THREADS": "1",
           "WANDB_MODE": "offline", "WANDB_SILENT": "true", "MPLBACKEND": "Agg"}
    # the sweep at two seeds per configuration (hydra.sweeper.params: the folder's name is the tutorial's), one
    # step: 8 runs, not 20 at two steps (sweep ~107 -> ~73 CPU-s at load ~10); the default five seeds are asserted
    # by tests/test_notebooks.py::test_the_headline_sweep_then_both_notebooks_with_no_variable_set
    small = " ".join(shlex.quote(o) for o in [*SMALL, f"model.cache_dir={warm_cache}", "train.steps=1",
                                              "hydra.sweeper.params.seed='range(0,2)'"])
    ran = []
    for command in tutorial_commands():
        if command in NOT_RUN or command.startswith(NOT_RUN_PREFIXES):
            continue
        if command.startswith("python run.py"):
            command = f"{command} {small}"
        out = subprocess.run(["bash", "-c", command], cwd=repo, env=env, capture_output=True, text=True,
                             timeout=1200, check=False)
        assert out.returncode == 0, (command, out.stdout[-2000:], out.stderr[-3000:])
        ran.append(command)
    assert any(c.startswith("python run.py -m") for c in ran) and any("dapo_exp.analysis plan" in c for c in ran)
    sweep = repo / "multirun" / "fixes=grpo,clip,clip_ds,full"
    runs = len(list(sweep.glob("*/summary.json")))  # 4 configurations x 2 seeds
    assert runs == 8, runs
    assert (sweep / "analysis" / "table.md").is_file()
    assert (sweep / "analysis" / "figures" / "curves_vs_step.png").is_file()
