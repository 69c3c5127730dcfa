"""A fix from outside the package, as a user adds one: a Python file named in ``DAPO_EXP_FIXES``, or a module
of an installed distribution's ``dapo_exp.fixes`` entry point, trained by ``python run.py`` and by a
``hydra/launcher=parallel`` sweep in processes of their own (nothing registered in this test's process), with
its key typed like the package's own (``algo.adv_clip``, not ``algo.ext``) and its config group given as code
(``Fix.configs``, Hydra's ConfigStore: no YAML file, no search path)."""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import SMALL

from dapo_exp import rundir
from dapo_exp.fixes import base

REPO = Path(__file__).resolve().parents[1]

# The how-to's own example (docs/how-to/extend.md, "A fix outside the package"): an advantage-clipping fix, one
# typed key, the advantage slot, a metric of its own, its group as code. The tests train that text as written.
EXTEND = REPO / "docs" / "how-to" / "extend.md"


def _example() -> str:
    text = EXTEND.read_text()
    at = text.index("- **A fix outside the package**")
    block = re.search(r"```python\n(.*?)```", text[at:], re.S).group(1)
    return textwrap.dedent(block)


ADV_CLIP = _example()
# helpers.SMALL with the evaluations no assertion here reads shrunk: no evaluation of the base policy, the final one
# on 1 sample per problem (SMALL's 8 x 8 was about half of a 2-step run's compute); the final evaluation still runs.
SMALL_RUN = [*SMALL, "eval.before_training=false", "eval.final_samples=1"]


def _run_py(args, *, cwd, env_extra, timeout=600):
    env = {k: v for k, v in os.environ.items() if k != base.MODULES_ENV}
    env.update({"OMP_NUM_THREADS": "1", **env_extra})
    return subprocess.run([sys.executable, str(REPO / "run.py"), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _trained_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run_dir / rundir.METRICS).read_text().splitlines()]
    return [r for r in rows if "reward/mean" in r]


def _check_clipped_run(run_dir: Path) -> None:
    summary = json.loads((run_dir / rundir.SUMMARY).read_text())
    assert summary["status"] == "finished" and summary["label"] == "advclip"
    assert summary["switches"]["adv_clip"] is True
    assert summary["config"]["algo"]["adv_clip"] == 0.5 and not summary["config"]["algo"]["ext"]
    rows = _trained_rows(run_dir)
    assert len(rows) == 2 and all(0 <= r["actor/adv_clipped_frac"] <= 1 for r in rows)
    # GRPO's advantages of 4 responses reach beyond +-0.5 wherever a group is mixed: the hook clipped some
    assert any(r["actor/adv_clipped_frac"] > 0 for r in rows), rows


@pytest.mark.slow
def test_a_fix_in_a_users_file_trains_through_run_py_with_its_key_typed(tmp_path, warm_cache):
    (tmp_path / "adv_clip.py").write_text(ADV_CLIP)
    env = {base.MODULES_ENV: "adv_clip.py"}  # relative to the user's directory, as typed
    common = ["fixes=grpo", *SMALL_RUN, f"model.cache_dir={warm_cache}"]
    out = _run_py(["+adv_clip=enabled", f"hydra.run.dir={tmp_path / 'run'}", *common], cwd=tmp_path, env_extra=env)
    assert out.returncode == 0, out.stderr[-3000:]
    _check_clipped_run(tmp_path / "run")
    # typed like the package's own keys: a bad value is refused before any compute, naming the key
    bad = _run_py(["+adv_clip=enabled", "algo.adv_clip=wide", f"hydra.run.dir={tmp_path / 'bad'}", *common],
                  cwd=tmp_path, env_extra=env)
    assert bad.returncode != 0 and "adv_clip" in bad.stderr and not (tmp_path / "bad" / rundir.METRICS).exists()
    neg = _run_py(["+adv_clip=enabled", "algo.adv_clip=-1", f"hydra.run.dir={tmp_path / 'neg'}", *common],
                  cwd=tmp_path, env_extra=env)
    assert neg.returncode != 0 and "algo.adv_clip" in neg.stderr, neg.stderr[-2000:]


@pytest.mark.slow
def test_a_fix_from_an_installed_distributions_entry_point_trains_in_a_parallel_sweep(tmp_path, warm_cache):
    """The distribution is a package and its ``.dist-info`` (what pip installs) on PYTHONPATH: its entry point
    is found by importlib.metadata in run.py and in each of the launcher's worker processes."""
    site = tmp_path / "site"
    (site / "my_fixes").mkdir(parents=True)
    (site / "my_fixes" / "__init__.py").write_text("")
    (site / "my_fixes" / "adv_clip.py").write_text(ADV_CLIP)
    info = site / "my_fixes-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-fixes\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[dapo_exp.fixes]\nadv_clip = my_fixes.adv_clip\n")
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    sweep = tmp_path / "sweep"
    out = _run_py(["-m", "hydra/launcher=parallel", "hydra.launcher.jobs=2", "+adv_clip=disabled,enabled", "seed=0",
                   "fixes=grpo", f"hydra.sweep.dir={sweep}", "~hydra.callbacks.analysis", *SMALL_RUN,
                   f"model.cache_dir={warm_cache}"], cwd=tmp_path, env_extra=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    jobs = {p.name: p for p in sweep.iterdir() if (p / rundir.SUMMARY).is_file()}
    assert len(jobs) == 2, sorted(jobs)
    on = next(p for name, p in jobs.items() if "adv_clip=enabled" in name)
    off = next(p for name, p in jobs.items() if "adv_clip=disabled" in name)
    _check_clipped_run(on)
    summary = json.loads((off / rundir.SUMMARY).read_text())
    assert summary["status"] == "finished" and summary["label"] == "grpo" and summary["switches"]["adv_clip"] is False
    assert all("actor/adv_clipped_frac" not in r for r in _trained_rows(off))


def test_a_module_that_cannot_be_imported_is_named_with_where_it_was_named(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != base.MODULES_ENV}
    for value, named in ((str(tmp_path / "nowhere.py"), "nowhere.py"), ("no_such_fix_module", "no_such_fix_module")):
        out = subprocess.run([sys.executable, "-c", "import dapo_exp.config"], cwd=tmp_path, capture_output=True,
                             text=True, env={**env, base.MODULES_ENV: value}, timeout=300)
        assert out.returncode != 0
        last = out.stderr.strip().splitlines()[-1]
        assert last.startswith("dapo_exp.fixes.base.ExtensionError:") and named in last and base.MODULES_ENV in last


def test_run_py_refuses_an_outside_module_that_cannot_be_imported_in_one_line(tmp_path):
    """python run.py (a single run and a sweep) with a fix file that fails to import: one line on stderr naming
    the file, where it was named and the import's error, exit 2, before any job or directory."""
    (tmp_path / "broken_fix.py").write_text("import no_such_module_of_anyones\n")
    for args in (["train.steps=1"], ["-m", "seed=0,1", "hydra/launcher=parallel"]):
        out = _run_py(args, cwd=tmp_path, env_extra={base.MODULES_ENV: "broken_fix.py"}, timeout=120)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
        assert lines[0].startswith("error: the fix module") and "broken_fix.py" in lines[0]
        assert base.MODULES_ENV in lines[0] and "no_such_module_of_anyones" in lines[0]
    # no outputs/, no multirun/ (the file's bytecode, where Python writes it, is all that may appear beside it)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "__pycache__") == ["broken_fix.py"]


def test_configs_must_be_options_of_the_fix():
    with pytest.raises(ValueError, match="not among its options"):
        base.register_fix(base.Fix(name="odd_one", short="odd", title="", paper="", is_on=lambda a: False,
                                   slots=(), bind=lambda a, r: {}, configs={"on": {}}))
    assert "odd_one" not in base.FIXES


def test_the_how_tos_commands_with_an_outside_fix_pass_the_launch_check(tmp_path):
    """Each documented command that names ``DAPO_EXP_FIXES`` (tests/test_commands.py leaves them to this test), run
    with the how-to's file written where it names it, printing its jobs' configs (``--cfg job``) instead of
    training: composed, its keys typed, and launch-checked in a process of its own."""
    from test_commands import doc_commands, outside_fix_command

    commands = [c for c in doc_commands() if outside_fix_command(c)]
    assert len(commands) >= 2 and any("-m" in c.words for c in commands), commands
    for cmd in commands:
        env = dict(a.split("=", 1) for a in cmd.env)
        for item in env[base.MODULES_ENV].split(","):
            (tmp_path / item).write_text(ADV_CLIP)
        out = _run_py([*cmd.words[1:], "--cfg", "job"], cwd=tmp_path, env_extra=env)
        assert out.returncode == 0, f"{cmd.where}: `{cmd.text}`: {out.stderr[-2000:]}"
        assert "adv_clip: 0.5" in out.stdout, (cmd.where, out.stdout[-2000:])
