"""Verdicts worth their cost (issue 23, items 4 and 5): one-seed tables say so and what to run, `plan`
works from one seed, "no difference shown" comes with what was ruled out (minimum detectable effect,
equivalence by two one-sided tests, the correlation of the paired arms), and studies carry a
positive control."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from fixtures_runs import make_run, make_sweep
from statsmodels.stats.power import TTestIndPower, TTestPower
from statsmodels.stats.weightstats import ttost_paired

from dapo_exp import analysis as A
from dapo_exp import fixes
from dapo_exp.analysis import planning as PL
from dapo_exp.analysis import verdicts as V
from dapo_exp.analysis.cli import main

ONE_SEED = [("grpo", 0, 0.62, "finished"), ("clip", 0, 0.55, "finished"), ("clip_ds", 0, 0.40, "finished"),
            ("full", 0, 0.315, "finished")]


def _seeds(n: int) -> str:
    return "seed=" + ",".join(str(i) for i in range(n))


@pytest.fixture(scope="module")
def one_seed(tmp_path_factory):
    root = tmp_path_factory.mktemp("multirun") / "four_presets"
    make_sweep(root, ONE_SEED)
    return root


# --------------------------------------------------------------------------- #
# A. a one-seed table says in its first line that nothing can be concluded     #
# --------------------------------------------------------------------------- #
def test_one_seed_table_first_line_says_nothing_can_be_concluded_and_what_to_run(one_seed, tmp_path, capsys):
    n = V.seed_advice("other").seeds(V.DEFAULT_MARGIN)  # the fixture's regime: neither of the toy's measured ones
    assert n >= 5
    table = A.comparison_table(A.load_runs(one_seed))
    first = A.table_markdown(table).splitlines()[0]
    assert "Nothing can be concluded from one seed per configuration" in first
    assert f"python run.py -m sweep=demo fixes=grpo,clip,clip_ds,full {_seeds(n)}" in first
    assert f"{n} seeds" in first and "plan" in first
    # the file and the terminal print lead with it too
    assert main([str(one_seed), "--out", str(tmp_path / "out"), "--no-figures"]) == 0
    printed = capsys.readouterr().out.splitlines()
    # the terminal's lead is the same paragraph, wrapped to 120 columns with the command on a line of its own
    assert printed[0].startswith("Nothing can be concluded from one seed per configuration")
    assert f"python run.py -m sweep=demo fixes=grpo,clip,clip_ds,full {_seeds(n)}" in printed
    lead = printed[: printed.index("")]
    assert " ".join(lead).replace("`", "").split() == first.replace("**", "").replace("`", "").split()
    assert (tmp_path / "out" / "table.md").read_text().splitlines()[0] == first
    # a one-seed difference is "not measured", never a verdict
    cell = A.format_table(table).set_index("config").loc["full", "Δ verdict"]
    assert cell.startswith("not measured (1 seed)")


def test_one_seed_line_uses_the_runs_own_overrides(tmp_path):
    root = tmp_path / "sweep"
    for p in ("grpo", "clip"):
        make_run(root / f"fixes={p}", p, 0, 0.5, overrides=["experiment=toy_clip", f"fixes={p}", "seed=0",
                                                            "optim.lr=1e-4"])
    first = A.table_markdown(A.comparison_table(A.load_runs(root))).splitlines()[0]
    n = V.seed_advice("other").seeds(V.DEFAULT_MARGIN)
    assert f"python run.py -m experiment=toy_clip fixes=grpo,clip optim.lr=1e-4 {_seeds(n)}" in first


def test_a_suggested_command_keeps_the_launcher_and_the_sweepers_overrides(tmp_path):
    """Hydra records the launcher's and the sweeper's overrides apart from the job's (``.hydra/hydra.yaml``):
    the command that adds seeds keeps them, and every override of the job's own."""
    root = tmp_path / "sweep"
    for p in ("grpo", "clip"):
        run = make_run(root / f"fixes={p}", p, 0, 0.5, overrides=["experiment=toy_clip", f"fixes={p}", "seed=0",
                                                                 "optim.lr=1e-4"])["dir"]
        (run / ".hydra" / "hydra.yaml").write_text(
            "hydra:\n  overrides:\n    hydra:\n    - hydra/launcher=parallel\n    - hydra.launcher.jobs=2\n"
            "    - hydra.mode=MULTIRUN\n    - hydra.sweeper.params.seed=range(0,3)\n    task: []\n")
    runs = A.load_runs(root).included
    assert V.rerun_command(runs, 3) == ("python run.py -m experiment=toy_clip fixes=grpo,clip optim.lr=1e-4 "
                                        "hydra/launcher=parallel hydra.launcher.jobs=2 seed=0,1,2")


def _regime_config(regime: str) -> tuple[list[str], dict]:
    """A toy sweep's overrides and the resolved values its runs record, in the default or the fast regime."""
    from omegaconf import OmegaConf

    from dapo_exp.config import Config

    schema = OmegaConf.structured(Config)
    values = {key: OmegaConf.select(schema, key) for key in V.REGIME_KEYS}
    if regime == "default":
        return [], {**values, "eval.endpoint": "final"}
    return ["experiment=toy_fast"], {"eval.endpoint": "last_k_mean", "eval.endpoint_k": 3}


@pytest.mark.parametrize("regime", ["default", "fast"])
def test_one_piece_of_seed_advice_everywhere_it_is_printed(regime, tmp_path, capsys):
    """The launch line, a one-seed table's first line and ``plan`` on a one-seed pilot give the same seeds
    for a difference of 5 points, all from :func:`seed_advice` for the sweep's regime and endpoint."""
    from test_sweeps import _multirun_config

    from dapo_exp.analysis.callback import launch_plan

    overrides, values = _regime_config(regime)
    advice = V.seed_advice(regime, values["eval.endpoint"], values.get("eval.endpoint_k", 3))
    n = advice.seeds(5.0)
    assert n == {"default": 5, "fast": 8}[regime]  # the how-to's and the README's figures
    line = launch_plan(_multirun_config(overrides, [*overrides, "fixes=grpo,clip"]))
    said = f"5 seeds per arm detect about {advice.detects(5):.0f} points of {advice.what}"
    assert said in line and (n == 5 or f"({n} seeds detect 5)" in line), line
    root = tmp_path / "sweep"
    for p in ("grpo", "clip"):
        make_run(root / f"fixes={p},seed=0", p, 0, 0.5, config_overrides=values,
                 overrides=[*overrides, f"fixes={p}", "seed=0"])
    first = A.table_markdown(A.comparison_table(A.load_runs(root))).splitlines()[0]
    assert f"{_seeds(n)}` ({n} seeds per configuration detect 5 points of {advice.what}" in first, first
    assert PL.plan(root, 5.0, metrics=["final_acc"]).loc["final_acc", "n_paired"] == n


def test_the_tiny_model_on_another_task_gets_no_toy_seed_advice():
    """The toy's seed advice and run times were measured on its task (arith) with its model: the tiny model on
    task=gsm8k is another regime, and its launch line says nothing of the toy."""
    from test_sweeps import _multirun_config

    from dapo_exp.analysis.callback import launch_plan

    schema = {"task.name": "arith", "model.path": "tiny"}
    assert V.toy_regime(lambda k: {**schema, "task.name": "gsm8k"}.get(k), "toy_fast") == "other"
    assert V.toy_regime(lambda k: {**schema, "model.path": "/m"}.get(k), "toy_fast") == "other"
    assert V.toy_regime(lambda k: schema.get(k), "toy_fast") == "fast"
    line = launch_plan(_multirun_config(["task=gsm8k"], ["task=gsm8k", "fixes=grpo,clip"]), cores=2, load=0.0)
    assert "on the toy" not in line and "seeds per arm detect" not in line, line
    toy = launch_plan(_multirun_config([], ["fixes=grpo,clip"]), cores=2, load=0.0)
    assert "on the toy" in toy, toy  # the toy's own line keeps it


def test_a_sweep_of_which_no_run_finished_suggests_no_seeds(tmp_path):
    """Every job failed (a data error before the preflight checked data): no "add seeds" command, whose
    overrides would come from no run (issue 49 saw `python run.py -m seed=0,...,15`, every override dropped)."""
    make_sweep(tmp_path / "s", [(p, 0, 0.5, "failed") for p in ("grpo", "clip")])
    table = A.comparison_table(A.load_runs(tmp_path / "s"))
    assert table.attrs["one_seed"] == "" and table.attrs["n_excluded"] == 2


def test_tables_with_seeds_do_not_carry_the_one_seed_line(tmp_path):
    make_sweep(tmp_path / "s", [(p, s, 0.3 + 0.01 * s, "finished") for p in ("grpo", "clip") for s in range(3)])
    md = A.table_markdown(A.comparison_table(A.load_runs(tmp_path / "s")))
    assert "Nothing can be concluded" not in md


# --------------------------------------------------------------------------- #
# B. plan from one seed                                                          #
# --------------------------------------------------------------------------- #
def test_plan_on_one_seed_sweep_says_how_many_seeds_to_add(one_seed, capsys):
    assert main(["plan", str(one_seed), "--delta", "5"]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out.lower()
    sd = V.seed_advice("other").sd
    n_p = PL.seeds_paired(5.0, sd)
    n_u = PL.seeds_unpaired(5.0, sd / math.sqrt(2))  # r = 0: sd per arm = sd_paired / sqrt(2)
    assert f"paired {n_p}" in out and f"unpaired {n_u}" in out
    assert f"add {n_p - 1} seeds" in out
    assert f"python run.py -m sweep=demo fixes=grpo,clip,clip_ds,full {_seeds(n_p)}" in out


def test_plan_takes_a_measured_paired_sd_and_a_correlation(one_seed, capsys):
    p = PL.plan(one_seed, 5.0, metrics=["final_acc"], paired_sd=4.4)
    r = p.loc["final_acc"]
    assert r["n_paired"] == PL.seeds_paired(5.0, 4.4) and r["sd_paired_from"] == "--paired-sd"
    assert r["n_unpaired"] == PL.seeds_unpaired(5.0, 4.4 / math.sqrt(2))
    # with a correlation r between the arms: sd_arm = sd_paired / sqrt(2 (1 - r)); sd_diff_unpaired = sqrt(2) sd_arm
    p5 = PL.plan(one_seed, 5.0, metrics=["final_acc"], paired_sd=4.4, correlation=0.5)
    assert p5.loc["final_acc", "sd_arm"] == pytest.approx(4.4)
    assert p5.loc["final_acc", "n_unpaired"] == PL.seeds_unpaired(5.0, 4.4)
    assert p5.loc["final_acc", "n_unpaired"] > p5.loc["final_acc", "n_paired"]
    assert main(["plan", str(one_seed), "--delta", "5", "--paired-sd", "4.4", "--metrics", "final_acc"]) == 0
    out = capsys.readouterr().out
    assert f"paired {PL.seeds_paired(5.0, 4.4)}" in out and "4.40" in out and "nan" not in out.lower()


def test_plan_with_a_pilot_keeps_its_measured_spread(tmp_path):
    spec = [(p, s, acc, "finished") for p, accs in (("grpo", (0.30, 0.36, 0.31)), ("clip", (0.41, 0.40, 0.47)))
            for s, acc in enumerate(accs)]
    make_sweep(tmp_path / "pilot", spec)
    p = PL.plan(tmp_path / "pilot", 5.0, metrics=["final_acc"])
    r = p.loc["final_acc"]
    assert r["sd_paired_from"] == "pilot" and r["n_paired"] == PL.seeds_paired(5.0, r["sd_paired"])
    assert r["n_unpaired"] == PL.seeds_unpaired(5.0, r["sd"])
    given = PL.plan(tmp_path / "pilot", 5.0, metrics=["final_acc"], paired_sd=2.0).loc["final_acc"]
    assert given["n_paired"] == PL.seeds_paired(5.0, 2.0)


# --------------------------------------------------------------------------- #
# C. what "no difference shown" ruled out                                        #
# --------------------------------------------------------------------------- #
def _mde_paired(sd, n):
    return TTestPower().solve_power(effect_size=None, nobs=n, alpha=0.05, power=0.8) * sd


def test_paired_verdict_by_hand():
    a = pd.Series([50.0, 60.0, 55.0, 70.0, 65.0, 58.0])
    b = pd.Series([49.0, 61.5, 54.0, 71.0, 63.0, 58.5])
    v = V.compare(a, b, margin=5.0)
    d = a - b
    assert v["test"] == "paired t"
    assert v["r"] == pytest.approx(np.corrcoef(a, b)[0, 1])
    assert v["mde"] == pytest.approx(_mde_paired(d.std(ddof=1), 6))
    assert v["tost_p"] == pytest.approx(ttost_paired(a.to_numpy(), b.to_numpy(), -5.0, 5.0)[0])
    assert v["equivalence"] == "equivalent within ±5"
    narrow = V.compare(a, b, margin=0.5)
    assert narrow["equivalence"] == "not shown equivalent within ±0.5"
    # unpaired (other seeds): MDE of the two-sample t test at the pooled sd
    u = V.compare(a, pd.Series([40.0, 45.0, 50.0], index=[10, 11, 12]), margin=5.0)
    assert u["test"] == "Welch t" and math.isnan(u["r"])
    sd = math.sqrt((5 * a.var() + 2 * 25.0) / 7)
    es = TTestIndPower().solve_power(effect_size=None, nobs1=6, ratio=0.5, alpha=0.05, power=0.8)
    assert u["mde"] == pytest.approx(es * sd)


def _study_rows(n=5, off_acc=None, on_acc=None, ctrl=None):
    rows = []
    rng = np.random.default_rng(3)
    for seed in range(n):
        for arm in ("off", "on") + (("ctrl",) if ctrl is not None else ()):
            r = {k: False for k in fixes.switch_names()}
            on = arm == "on"
            acc = {"off": 0.60 + 0.02 * seed, "on": 0.60 + 0.02 * seed + (0.01, -0.01, 0.005, -0.004, 0.0)[seed],
                   "ctrl": 0.20 + (0.0, 0.03, 0.01, 0.02, 0.0)[seed]}[arm]
            r.update({"clip_higher": on, "seed": seed, "included": True, "label": "clip" if on else "grpo",
                      "avg/diag/style_step": 0.1 + 0.01 * seed + rng.normal(0, 0.01),
                      "avg/actor/entropy": 0.3, "avg/actor/pg_clipfrac_higher": 0.01,
                      "avg/diag/marker_mangled": 0.2, "final/eval/acc_avg": acc,
                      "config.train.steps": 0 if arm == "ctrl" else 30})
            rows.append(r)
    return pd.DataFrame(rows)


def test_study_reports_mde_equivalence_and_correlation():
    from dapo_exp.analysis.studies import STUDIES, study_markdown, study_table

    s = STUDIES["clip_higher"]
    frame = _study_rows()
    t = study_table(frame, s, margin=5.0, margins={"avg/diag/style_step": 0.05}).set_index("metric")
    acc = t.loc["endpoint/eval/acc_avg"]
    on = frame[frame.clip_higher].set_index("seed")["final/eval/acc_avg"] * 100
    off = frame[~frame.clip_higher].set_index("seed")["final/eval/acc_avg"] * 100
    assert acc["r"] == pytest.approx(np.corrcoef(on, off)[0, 1])
    assert acc["mde"] == pytest.approx(_mde_paired((on - off).std(ddof=1), 5))
    assert acc["tost_p"] == pytest.approx(ttost_paired(on.to_numpy(), off.to_numpy(), -5.0, 5.0)[0])
    assert acc["equivalence"] == "equivalent within ±5"
    assert t.loc["avg/diag/style_step", "verdict"] == "no difference shown"
    assert t.loc["avg/diag/style_step", "margin"] == 0.05
    assert t.loc["avg/diag/style_step", "equivalence"].endswith("within ±0.05")
    # a metric without a margin says how to give one
    assert t.loc["avg/diag/marker_mangled", "equivalence"].startswith("no margin")
    md = study_markdown(study_table(frame, s, margin=5.0), s)
    assert "MDE" in md and "equivalent within ±5" in md and "r (arms)" in md
    tight = study_table(frame, s, margin=0.1).set_index("metric")
    assert tight.loc["endpoint/eval/acc_avg", "equivalence"] == "not shown equivalent within ±0.1"


def test_table_effects_vs_baseline_say_what_was_ruled_out(tmp_path):
    spec = [("grpo", s, a, "finished") for s, a in enumerate((0.50, 0.60, 0.55, 0.70, 0.65))]
    spec += [("clip", s, a, "finished") for s, a in enumerate((0.51, 0.59, 0.56, 0.69, 0.66))]
    spec += [("full", s, a, "finished") for s, a in enumerate((0.70, 0.81, 0.74, 0.90, 0.86))]
    make_sweep(tmp_path / "s", spec)
    data = A.load_runs(tmp_path / "s")
    table = A.comparison_table(data)
    r = table.loc["clip"]
    a = np.array([51, 59, 56, 69, 66.0])
    b = np.array([50, 60, 55, 70, 65.0])
    assert r["d_final_acc_r"] == pytest.approx(np.corrcoef(a, b)[0, 1])
    assert r["d_final_acc_mde"] == pytest.approx(_mde_paired((a - b).std(ddof=1), 5))
    assert r["d_final_acc_tost_p"] == pytest.approx(ttost_paired(a, b, -5.0, 5.0)[0])
    f = A.format_table(table).set_index("config")
    assert f.loc["clip", "Δ verdict"].startswith("no difference shown")
    assert "MDE" in f.loc["clip", "Δ verdict"] and "equivalent within ±5" in f.loc["clip", "Δ verdict"]
    assert f.loc["full", "Δ verdict"] == "difference shown"
    assert "r (arms)" in f.columns
    assert "not shown equivalent within ±0.2" in A.format_table(
        A.comparison_table(data, margin=0.2)).set_index("config").loc["clip", "Δ verdict"]
    # the CLI takes the margin
    assert main([str(tmp_path / "s"), "--out", str(tmp_path / "o"), "--no-figures", "--margin", "0.2"]) == 0
    assert "not shown equivalent within ±0.2" in (tmp_path / "o" / "table.md").read_text()


# --------------------------------------------------------------------------- #
# D. positive control                                                            #
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("name", sorted(__import__("dapo_exp.analysis.studies", fromlist=["STUDIES"]).STUDIES))
def test_every_study_names_a_positive_control_that_is_a_real_override(name):
    from pathlib import Path

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from dapo_exp.analysis.studies import STUDIES
    from dapo_exp.config import validate
    from dapo_exp.hydra_setup import register_resolvers

    s = STUDIES[name]
    pc = s.positive_control
    assert pc is not None and "=" in pc.override
    register_resolvers()
    conf = Path(__file__).resolve().parents[1] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        base = compose("config", overrides=[f"experiment={s.experiment}", "fixes=grpo", f"{s.fix}={s.arms[0]}"])
        cfg = compose("config", overrides=[f"experiment={s.experiment}", "fixes=grpo", f"{s.fix}={s.arms[0]}",
                                           pc.override])
    validate(cfg)
    assert OmegaConf.select(cfg, pc.key) != OmegaConf.select(base, pc.key)  # it changes something
    assert pc.override in s.control_command("0,1") and f"{s.fix}={s.arms[0]}" in s.control_command("0,1")


def test_study_reports_the_positive_control_when_present_and_says_when_absent():
    from dapo_exp.analysis.studies import STUDIES, study_markdown, study_table

    s = STUDIES["clip_higher"]
    assert s.positive_control.override == "train.steps=0"
    with_ctrl = _study_rows(ctrl=True)
    t = study_table(with_ctrl, s)
    assert t.set_index("metric").loc["endpoint/eval/acc_avg", "n_pairs"] == 5  # the control runs are not an arm
    pc = t.attrs["positive_control"]
    off = with_ctrl[(~with_ctrl.clip_higher) & (with_ctrl["config.train.steps"] == 30)].set_index("seed")
    ctrl = with_ctrl[with_ctrl["config.train.steps"] == 0].set_index("seed")
    expect = (ctrl["final/eval/acc_avg"] * 100 - off["final/eval/acc_avg"] * 100).mean()
    assert pc["present"] and pc["n_pairs"] == 5 and pc["diff"] == pytest.approx(expect)
    assert pc["lo"] < pc["diff"] < pc["hi"] < 0 and pc["detected"]
    md = study_markdown(t, s)
    assert "Positive control" in md and "train.steps=0" in md and "detected" in md
    t0 = study_table(_study_rows(), s)
    assert not t0.attrs["positive_control"]["present"]
    md0 = study_markdown(t0, s)
    assert "no runs with `train.steps=0`" in md0 and s.control_command("0,1,2,3,4") in md0


def test_study_cli_with_positive_control_runs(tmp_path, capsys, monkeypatch):
    """A study over the fixtures' metrics: arms grpo/clip, control grpo with train.steps=0, --margin options."""
    from dapo_exp.analysis import studies as ST

    s = ST.Study("clip_higher", "clip_higher", "toy_clip",
                 (ST.StudyMetric("avg/actor/pg_loss", +1, "loss (the same in both arms)"), ST.FINAL_ACC),
                 positive_control=ST.PositiveControl("train.steps=0", -1, "no RL training"))
    monkeypatch.setitem(ST.STUDIES, "clip_higher", s)
    root = tmp_path / "study"
    for seed in range(3):
        make_run(root / f"off,seed={seed}", "grpo", seed, 0.60 + 0.01 * seed)
        make_run(root / f"on,seed={seed}", "clip", seed, 0.60 + 0.01 * seed + (0.01, -0.012, 0.004)[seed])
        make_run(root / f"ctrl,seed={seed}", "grpo", seed, 0.12 + (0.0, 0.03, 0.01)[seed],
                 config_overrides={"train.steps": 0})
    assert main(["study", str(root), "--study", "clip_higher", "--out", str(tmp_path / "o"), "--margin", "3",
                 "--margin-for", "avg/actor/pg_loss=0.2"]) == 0
    out = capsys.readouterr().out
    assert "Positive control" in out and "detected" in out
    assert "within ±3" in out and "within ±0.2" in out
    csv = pd.read_csv(tmp_path / "o" / "study.csv").set_index("metric")
    assert csv.loc["endpoint/eval/acc_avg", "n_pairs"] == 3 and csv.loc["endpoint/eval/acc_avg", "margin"] == 3
