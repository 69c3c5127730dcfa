"""The committed sweep recipes (sweeps/*.sh) expand to the runs their headers promise.

Each recipe's `python run.py -m ...` line is expanded with Hydra's own override
parser and basic sweeper (as the dry run `run.py -m --cfg job` does), and every
distinct configuration is composed, so a renamed preset or group breaks this test
instead of a sweep on a cluster.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SWEEPS = REPO / "sweeps"
EXPECTED_LABELS = {
    "four_presets.sh": {"grpo", "clip", "clip_ds", "full"},
    "paper_ladder.sh": {"paper_1_grpo", "paper_2_of", "paper_3_clip", "paper_4_sop", "paper_5_tl", "paper_6_dapo"},
    "leave_one_out.sh": {"full", "full_no_clip", "full_no_ds", "full_no_tl", "full_no_sop"},
    "factorial.sh": None,  # 32 distinct switch states
    "fractional.sh": "loop",  # 16 `run.py -m` calls, one per configuration of the 2^(5-1) design
    "toy_studies.sh": "loop",  # one `run.py -m` per regime study (dapo_exp.analysis.studies.STUDIES)
    "family.sh": {"grpo", "full", "dr_grpo", "gspo", "cispo", "gmpo", "clip_cov", "kl_cov"},
    "toy_dapo_ladder.sh": {"paper_1_grpo", "paper_2_of", "paper_3_clip", "paper_4_sop", "paper_5_tl", "paper_6_dapo"},
}
LOOPED = {k for k, v in EXPECTED_LABELS.items() if v == "loop"}


def _command(script: Path) -> tuple[list[str], int]:
    text = script.read_text()
    runs = int(re.search(r"^# Runs:\s+(\d+)", text, re.M).group(1))
    joined = text.replace("\\\n", " ")
    line = next(l for l in joined.splitlines() if l.strip().startswith("python run.py -m"))
    seeds = re.search(r'SEEDS="\$\{SEEDS:-([^}]*)\}"', text).group(1)
    args = shlex.split(line.replace('"$SEEDS"', seeds).replace('"$@"', ""))
    assert args[:3] == ["python", "run.py", "-m"]
    return args[3:], runs


def test_every_recipe_is_checked():
    assert sorted(p.name for p in SWEEPS.glob("*.sh")) == sorted(EXPECTED_LABELS)


@pytest.mark.parametrize("name", sorted(set(EXPECTED_LABELS) - LOOPED))
def test_recipe_expands_and_composes(name):
    from hydra import compose, initialize_config_dir
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from dapo_exp.fixes import switches as fix_switches
    from dapo_exp.hydra_setup import register_resolvers, run_label

    script = SWEEPS / name
    text = script.read_text()
    for field in ("# Question:", "# Runs:", "# Cost:", "# SLURM:", "hydra/launcher=slurm", "estimate"):
        assert field in text, f"{name}: header lacks {field!r}"
    assert text.rstrip().endswith('"$@"'), f"{name}: extra overrides must pass through"
    overrides, runs = _command(script)
    jobs = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(overrides), None)[0]
    assert len(jobs) == runs, f"{name}: header says {runs} runs, the command expands to {len(jobs)}"
    sweep = next(o for o in overrides if o.startswith("sweep="))
    assert sweep == f"sweep={name[:-3]}"
    distinct = {tuple(o for o in job if not o.startswith("seed=")) for job in jobs}
    register_resolvers()
    labels, states = set(), set()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        for job in sorted(distinct):
            cfg = compose("config", overrides=list(job))
            labels.add(run_label(cfg))
            states.add(tuple(sorted(fix_switches(cfg.algo).items())))
    assert len(states) == len(distinct), f"{name}: two configurations of the sweep are the same"
    if EXPECTED_LABELS[name] is None:
        assert len(states) == 32
    else:
        assert labels == EXPECTED_LABELS[name]


def test_fractional_recipe_runs_the_half_fraction(capsys):
    """sweeps/fractional.sh loops over the 16 lines of `python -m dapo_exp.analysis design fractional`;
    each line, composed as the script passes it, gives the switch states of a row of pyDOE3's design."""
    from hydra import compose, initialize_config_dir

    from dapo_exp.analysis.cli import main
    from dapo_exp.analysis.design import SWITCHES, fractional_design
    from dapo_exp.fixes import switches as fix_switches
    from dapo_exp.hydra_setup import register_resolvers

    text = (SWEEPS / "fractional.sh").read_text()
    for field in ("# Question:", "# Runs:", "# Cost:", "# SLURM:", "# Seeds:", "hydra/launcher=slurm", "estimate"):
        assert field in text, f"fractional.sh: header lacks {field!r}"
    assert "mapfile -t CONFIGS < <(python -m dapo_exp.analysis design fractional)" in text
    line = next(l.strip() for l in text.splitlines() if l.strip().startswith("python run.py -m"))
    assert line == (
        "python run.py -m hydra/launcher=parallel sweep=fractional fixes=grpo $config seed=\"$SEEDS\" "
        "'~hydra.callbacks.analysis' \"$@\""
    )
    seeds = re.search(r'SEEDS="\$\{SEEDS:-([^}]*)\}"', text).group(1).split(",")
    assert int(re.search(r"^# Runs:\s+(\d+)", text, re.M).group(1)) == 16 * len(seeds)
    assert main(["design", "fractional"]) == 0
    configs = capsys.readouterr().out.splitlines()
    assert len(configs) == 16
    register_resolvers()
    states = set()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        for config in configs:
            cfg = compose("config", overrides=["sweep=fractional", "fixes=grpo", *config.split(), "seed=0"])
            states.add(tuple(fix_switches(cfg.algo)[s] for s in SWITCHES))
    assert states == {tuple(bool(v) for v in row) for row in fractional_design()[list(SWITCHES)].to_numpy()}


def test_toy_studies_recipe_runs_each_study_as_its_sweep():
    """sweeps/toy_studies.sh runs, per study, the command of dapo_exp.analysis.studies.STUDIES: 2 arms
    x the seeds, composing, differing in the study's switch alone, then the study's analysis."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from dapo_exp.analysis.studies import STUDIES
    from dapo_exp.fixes import switches as fix_switches
    from dapo_exp.hydra_setup import register_resolvers

    text = (SWEEPS / "toy_studies.sh").read_text()
    for field in ("# Question:", "# Runs:", "# Cost:", "# Usage:"):
        assert field in text, f"toy_studies.sh: header lacks {field!r}"
    assert "s.command(sys.argv[2])" in text and 'study "multirun/$sweep"' in text
    seeds = re.search(r'SEEDS="\$\{SEEDS:-([^}]*)\}"', text).group(1)
    assert int(re.search(r"^# Runs:\s+(\d+) per study", text, re.M).group(1)) == 2 * len(seeds.split(","))
    register_resolvers()
    for name, study in STUDIES.items():
        args = shlex.split(study.command(seeds))
        assert args[:3] == ["python", "run.py", "-m"] and f"sweep={study.sweep}" in args
        assert study.sweep == f"{study.experiment}_{study.fix}"
        jobs = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(args[3:]), None)[0]
        assert len(jobs) == 2 * len(seeds.split(","))
        states = set()
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            for job in {tuple(o for o in j if not o.startswith("seed=")) for j in jobs}:
                states.add(tuple(sorted(fix_switches(compose("config", overrides=list(job)).algo).items())))
        differ = {k for k, v in dict(min(states)).items() if dict(max(states))[k] != v}
        assert len(states) == 2 and differ == {study.fix}, f"{name}: arms differ in {differ}"
