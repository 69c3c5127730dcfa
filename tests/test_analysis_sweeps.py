"""The committed sweep recipes (sweeps/*.sh) expand to the runs their headers promise.

Each recipe's `"$PY" run.py -m ...` line is expanded with Hydra's own override
parser and the basic sweeper's product (`dapo_exp.hydra_setup.sweep_jobs`, as the dry run
`run.py -m --cfg job` does; tests/test_hydra_setup.py holds it to Hydra's own), and every
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
    "family.sh": {"grpo", "full", "dr_grpo", "gspo", "cispo", "gmpo", "clip_cov", "kl_cov", "rloo", "reinforce_pp",
                  "sapo", "gpg", "dro"},
    "toy_dapo_ladder.sh": {"paper_1_grpo", "paper_2_of", "paper_3_clip", "paper_4_sop", "paper_5_tl", "paper_6_dapo"},
    "cross_engine.sh": "loop",  # two `run.py -m` calls, one per engine (native, then verl)
    "sequential_toy.sh": "loop",  # three sequential sweeps (hydra/sweeper=sequential), one per comparison
    "smollm2_clip.sh": {"grpo", "clip"},  # the real model: GRPO against Clip-Higher
    "smollm2_cross_engine.sh": "loop",  # the same two arms on verl, then the comparison with the native sweep
    "top_entropy.sh": {"grpo", "ent"},  # top-entropy tokens against GRPO on all tokens
}
LOOPED = {k for k, v in EXPECTED_LABELS.items() if v == "loop"}
RUN = '"$PY" run.py -m'  # the recipes run the project's interpreter (PY: .ci/venv's choice)


def _expanded(line: str, text: str) -> list[str]:
    """The words of a recipe's ``run.py -m`` line with its variables' defaults (SEEDS, ARMS) filled in."""
    line = line.replace('"$SEEDS"', re.search(r'SEEDS="\$\{SEEDS:-([^}]*)\}"', text).group(1))
    if arms := re.search(r'ARMS="\$\{ARMS:-([^}]*)\}"', text):  # a recipe whose arms a variable may narrow
        line = line.replace('"$ARMS"', arms.group(1))
    return shlex.split(line.replace('"$@"', ""))


def _command(script: Path) -> tuple[list[str], int]:
    text = script.read_text()
    runs = int(re.search(r"^# Runs:\s+(\d+)", text, re.M).group(1))
    joined = text.replace("\\\n", " ")
    line = next(l for l in joined.splitlines() if l.strip().startswith(RUN))
    args = _expanded(line, text)
    assert args[:3] == ["$PY", "run.py", "-m"]
    return args[3:], runs


def test_every_recipe_is_checked():
    assert sorted(p.name for p in SWEEPS.glob("*.sh")) == sorted(EXPECTED_LABELS)


@pytest.mark.parametrize("name", sorted(set(EXPECTED_LABELS) - LOOPED))
def test_recipe_expands_and_composes(name):
    from hydra import compose, initialize_config_dir

    from dapo_exp.fixes import switches as fix_switches
    from dapo_exp.hydra_setup import register_resolvers, run_label, sweep_jobs

    script = SWEEPS / name
    text = script.read_text()
    for field in ("# Question:", "# Runs:", "# Cost:", "# SLURM:", "hydra/launcher=slurm", "estimate"):
        assert field in text, f"{name}: header lacks {field!r}"
    assert text.rstrip().endswith('"$@"'), f"{name}: extra overrides must pass through"
    overrides, runs = _command(script)
    jobs = sweep_jobs(overrides)
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
    assert 'mapfile -t CONFIGS < <("$PY" -m dapo_exp.analysis design fractional)' in text
    line = next(l.strip() for l in text.splitlines() if l.strip().startswith(RUN))
    assert line == (
        '"$PY" run.py -m hydra/launcher=parallel sweep=fractional fixes=grpo $config seed="$SEEDS" '
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

    from dapo_exp.analysis.studies import STUDIES
    from dapo_exp.fixes import switches as fix_switches
    from dapo_exp.hydra_setup import register_resolvers, sweep_jobs

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
        jobs = sweep_jobs(args[3:])
        assert len(jobs) == 2 * len(seeds.split(","))
        states = set()
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            for job in {tuple(o for o in j if not o.startswith("seed=")) for j in jobs}:
                states.add(tuple(sorted(fix_switches(compose("config", overrides=list(job)).algo).items())))
        differ = {k for k, v in dict(min(states)).items() if dict(max(states))[k] != v}
        assert len(states) == 2 and differ == {study.fix}, f"{name}: arms differ in {differ}"


def test_cross_engine_recipe_runs_the_same_study_on_both_engines():
    """sweeps/cross_engine.sh: one study (GRPO against + Soft Overlong Punishment on toy_overlong, 2 arms x
    the seeds) run by the native trainer and by verl with the same overrides, the verl half translating to
    verl's CPU mode, then sweeps/checks/cross_engine.py on the two sweeps."""
    from hydra import compose, initialize_config_dir

    from dapo_exp.backends import verl as vb
    from dapo_exp.fixes.verl_rules import OB
    from dapo_exp.hydra_setup import register_resolvers, run_label, sweep_jobs

    text = (SWEEPS / "cross_engine.sh").read_text()
    for field in ("# Question:", "# Runs:", "# Cost:", "# SLURM:", "hydra/launcher=slurm", "estimate"):
        assert field in text, f"cross_engine.sh: header lacks {field!r}"
    assert text.rstrip().endswith("multirun/cross_engine_native multirun/cross_engine_verl multirun/cross_engine")
    study = shlex.split(re.search(r"^STUDY=\((.*)\)$", text, re.M).group(1))
    seeds = re.search(r'SEEDS="\$\{SEEDS:-([^}]*)\}"', text).group(1)
    joined = text.replace("\\\n", " ")
    lines = [l.strip() for l in joined.splitlines() if l.strip().startswith(RUN)]
    assert len(lines) == 2
    register_resolvers()
    total, per_engine = int(re.search(r"^# Runs:\s+(\d+)", text, re.M).group(1)), {}
    for line, engine in zip(lines, ("native", "verl")):
        args = shlex.split(line.replace('"${STUDY[@]}"', shlex.join(study)).replace('"$SEEDS"', seeds)
                           .replace('"$@"', ""))
        assert f"sweep=cross_engine_{engine}" in args and ("backend=verl" in args) == (engine == "verl")
        jobs = sweep_jobs(args[3:])
        arms = sorted({tuple(o for o in job if not o.startswith(("seed=", "hydra/"))) for job in jobs})
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            cfgs = {arm: compose("config", overrides=[*arm, "seed=0"]) for arm in arms}
        per_engine[engine] = {(run_label(cfgs[tuple(o for o in job if not o.startswith(("seed=", "hydra/")))]),
                               next(o for o in job if o.startswith("seed="))) for job in jobs}
        if engine == "verl":
            for c in cfgs.values():  # each arm: verl's CPU mode, the overlong buffer on in the fix's arm only
                values = vb.translate(c).values
                assert values["trainer.device"] == "cpu"
                assert values[OB + "enable"] == (run_label(c) == "sop")
    assert per_engine["native"] == per_engine["verl"]
    assert {label for label, _ in per_engine["native"]} == {"grpo", "sop"}
    assert len(per_engine["native"]) * 2 == total == 2 * 2 * len(seeds.split(","))


def test_the_real_models_cross_engine_recipe_runs_the_native_studys_arms_on_verls_cpu_mode():
    """sweeps/smollm2_cross_engine.sh: smollm2_clip.sh's two arms (grpo, clip on experiment=smollm2_add2) on
    backend=verl train.device=cpu, the converted model directory as verl's model, then the comparison with the
    native sweep on those two arms."""
    from hydra import compose, initialize_config_dir

    from dapo_exp.backends import verl as vb
    from dapo_exp.hydra_setup import register_resolvers, run_label, sweep_jobs
    from dapo_exp.packaged_models import SMOLLM2_135M

    text = (SWEEPS / "smollm2_cross_engine.sh").read_text()
    for field in ("# Question:", "# Runs:", "# Cost:", "# SLURM:", "# Needs:"):
        assert field in text, f"smollm2_cross_engine.sh: header lacks {field!r}"
    assert text.rstrip().endswith('--arms grpo,clip --title "GRPO vs + Clip-Higher on SmolLM2-135M-Instruct '
                                  '(experiment=smollm2_add2)"')
    assert "multirun/smollm2_clip multirun/smollm2_clip_verl multirun/smollm2_cross_engine" in text
    joined = text.replace("\\\n", " ")
    line = next(l.strip() for l in joined.splitlines() if l.strip().startswith(RUN))
    args = _expanded(line, text)
    jobs = sweep_jobs(args[3:])
    assert len(jobs) == int(re.search(r"^# Runs:\s+(\d+)", text, re.M).group(1))
    register_resolvers()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfgs = [compose("config", overrides=[o for o in job if not o.startswith("hydra/")]) for job in jobs]
    assert {run_label(c) for c in cfgs} == {"grpo", "clip"}
    for c in cfgs:
        values = vb.translate(c).values
        assert values["trainer.device"] == "cpu"
        assert values["actor_rollout_ref.model.path"].endswith(SMOLLM2_135M.directory("/x").name)
        assert values["actor_rollout_ref.actor.clip_ratio_high"] == (0.28 if run_label(c) == "clip" else 0.2)
        # verl pads every prompt to the cap: add2's longest prompt (161 tokens, tests/test_chat_tasks.py) fits it
        assert 161 <= values["data.max_prompt_length"] == c.task.max_prompt_len < 288


def test_cross_engine_comparison_pairs_arms_within_an_engine_and_not_across(tmp_path):
    """sweeps/checks/cross_engine.py: the fix's effect on each engine is the paired (by seed) difference of
    the arms; an arm across engines is Welch's difference of the two engines' means."""
    import importlib.util

    from fixtures_runs import make_run

    from dapo_exp.analysis.stats import paired_difference, welch_difference

    acc = {("native", "grpo"): [0.40, 0.50, 0.45], ("native", "sop"): [0.44, 0.52, 0.50],
           ("verl", "grpo"): [0.30, 0.35, 0.33], ("verl", "sop"): [0.31, 0.40, 0.32]}
    for (engine, arm), values in acc.items():
        for seed, a in enumerate(values):
            over = {"algo.overlong_punishment": "soft"} if arm == "sop" else {}
            make_run(tmp_path / engine / f"{arm},seed={seed}", "grpo", seed, a, config_overrides=over)
    spec = importlib.util.spec_from_file_location("cross_engine", SWEEPS / "checks" / "cross_engine.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "No artists with labels" when a panel holds no line, say
        assert mod.main([str(tmp_path / "native"), str(tmp_path / "verl"), str(tmp_path / "out")]) == 0
    runs, _ = mod.load(str(tmp_path / "native"), str(tmp_path / "verl"))
    assert sorted(set(runs.label)) == ["grpo", "sop"]
    col = "final/eval/acc_avg"
    eff = {e: paired_difference(mod._values(runs, e, "sop", col), mod._values(runs, e, "grpo", col))
           for e in ("native", "verl")}
    import pandas as pd
    expect_native = pd.Series(acc[("native", "sop")]) * 100 - pd.Series(acc[("native", "grpo")]) * 100
    assert abs(eff["native"].mean - expect_native.mean()) < 1e-9
    effects = (tmp_path / "out" / "effects.md").read_text()
    assert mod._ci(eff["native"]) in effects and mod._ci(eff["verl"]) in effects
    across = welch_difference(pd.Series(acc[("verl", "grpo")]) * 100, pd.Series(acc[("native", "grpo")]) * 100)
    assert mod._ci(across) in (tmp_path / "out" / "engines.md").read_text()
    assert (tmp_path / "out" / "curves.png").stat().st_size > 10_000


def test_the_clean_smollm2_cross_engine_result_is_what_its_command_computes_from_the_recorded_runs(tmp_path):
    """sweeps/results/2026-11-29-smollm2_cross_engine_clean: cross_engine.py on the two committed results'
    runs.csv (the native re-run at a clean commit, the cross-engine result's verl rows) writes exactly the
    committed tables, every run from a clean commit; a file lacking an arm is refused by name."""
    import importlib.util

    import pandas as pd

    results = SWEEPS / "results"
    committed = results / "2026-11-29-smollm2_cross_engine_clean"
    spec = importlib.util.spec_from_file_location("cross_engine", SWEEPS / "checks" / "cross_engine.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    native = str(results / "2026-11-29-smollm2_clip" / "runs.csv")
    verl = str(results / "2026-11-29-smollm2_cross_engine" / "runs.csv")
    assert mod.main([native, verl, str(tmp_path / "out"), "--arms", "grpo,clip"]) == 0
    for name in ("arms.md", "effects.md", "engines.md"):
        assert (tmp_path / "out" / name).read_text() == (committed / name).read_text(), name
    assert not (tmp_path / "out" / "curves.png").exists()  # no per-step histories in a runs.csv
    runs = pd.read_csv(tmp_path / "out" / "runs.csv")
    assert runs.groupby("engine").size().to_dict() == {"native": 10, "verl": 4}
    assert runs.git_commit.str.fullmatch(r"[0-9a-f]{40}").all()
    assert pd.read_csv(committed / "runs.csv").equals(runs)
    grpo_only = tmp_path / "grpo_only.csv"
    runs[runs.label == "grpo"].to_csv(grpo_only, index=False)
    with pytest.raises(SystemExit, match=r"grpo_only.csv holds no verl run of the arm\(s\) \['clip'\]"):
        mod.main([native, str(grpo_only), str(tmp_path / "bad"), "--arms", "grpo,clip"])
