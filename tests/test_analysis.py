"""dapo_exp.analysis: frames, the comparison table recomputed by hand, curves, samples, CLI, callback.

The synthetic sweep (tests/fixtures_runs.py, STANDARD_SWEEP) has final accuracies
  grpo 30 34 32 | clip 40 36 (+ seed 2 failed, 0) | clip_ds 41 44 45 | full 50 46 (+ seed 2 killed) | full_no_ds 48
so the expected numbers below are computed from these by hand.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fixtures_runs import LADDER_SWEEP, STANDARD_SWEEP, algo_of, make_sweep
from omegaconf import OmegaConf
from scipy import stats

from dapo_exp import analysis as A
from dapo_exp import rundir

REPO = Path(__file__).resolve().parents[1]
# two-sided 95% Student-t quantiles from a printed table
T975 = {1: 12.7062, 2: 4.3027, 3: 3.1824}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("multirun") / "demo"
    make_sweep(root, STANDARD_SWEEP)
    return root


@pytest.fixture(scope="module")
def data(sweep):
    return A.load_runs(sweep)


@pytest.fixture(scope="module")
def table(data):
    return A.comparison_table(data)


@pytest.fixture(scope="module")
def ladder(tmp_path_factory):
    root = tmp_path_factory.mktemp("multirun") / "ladder"
    make_sweep(root, LADDER_SWEEP)
    return A.load_runs(root)


# --------------------------------------------------------------------------- #
# Frames                                                                        #
# --------------------------------------------------------------------------- #
def test_runs_frame_one_row_per_run_with_status(data):
    runs = data.runs.set_index("run")
    assert len(runs) == len(STANDARD_SWEEP) == 13
    assert runs.loc["fixes=clip,seed=2", "status"] == "failed"
    assert not runs.loc["fixes=clip,seed=2", "included"]
    assert "synthetic failure" in runs.loc["fixes=clip,seed=2", "exclude_reason"]
    # killed: no summary.json, still a row, labelled from .hydra/config.yaml
    killed = runs.loc["fixes=full,seed=2"]
    assert (killed["status"], killed["included"], killed["label"], killed["seed"]) == ("killed", False, "full", 2)
    assert data.n_excluded == 2
    assert data.describe() == "13 runs, 11 included, 2 excluded (1 failed, 1 killed)"
    full0 = runs.loc["fixes=full,seed=0"]
    on = {"clip_higher", "dynamic_sampling", "token_level_loss", "overlong_punishment"}
    assert full0[list(A.SWITCHES)].tolist() == [s in on for s in A.SWITCHES]  # the family's switches off
    assert (full0["model"], full0["task"], full0["preset"]) == ("tiny", "arith", "full")
    assert full0["final/eval/acc_avg"] == pytest.approx(0.50)
    # the wall time stays in the runs frame (runs.csv), beside the machine's load when it started and ended
    assert (full0["wall_time_s"], full0["load_avg_start"], full0["load_avg_end"]) == (100.0, 0.5, 1.5)
    assert (full0["torch_threads"], full0["cpu"]) == (1, "AMD EPYC / AVX512")  # what its numbers depend on
    assert full0["base/eval/acc_avg"] == pytest.approx(0.10)
    # training metrics: last value and average over steps 1..6
    assert full0[f"end/{rundir.ENTROPY}"] == pytest.approx(1.0 - 0.3 + 0.1)
    assert full0[f"avg/{rundir.ZERO_VAR}"] == pytest.approx(0.1 + 0.035)
    assert full0["config.algo.loss_agg"] == "token-mean"


def test_history_frame_is_long(data):
    h = data.history
    assert list(h.columns) == ["run", "label", "seed", "step", "metric", "value"]
    acc = h[(h["run"] == "fixes=grpo,seed=1") & (h["metric"] == rundir.EVAL_ACC)]
    assert acc["step"].tolist() == [0, 3, 6]
    assert acc["value"].tolist() == pytest.approx([0.10, 0.22, 0.34])
    ent = h[(h["run"] == "fixes=grpo,seed=1") & (h["metric"] == rundir.ENTROPY)]
    assert ent["step"].tolist() == [1, 2, 3, 4, 5, 6]


def test_end_window_averages_the_last_values(sweep):
    d = A.load_runs(sweep / "fixes=grpo,seed=0", end_window=3)
    # entropy at steps 4, 5, 6 of grpo seed 0: 0.8, 0.75, 0.7
    assert d.runs.loc[0, f"end/{rundir.ENTROPY}"] == pytest.approx(0.75)


def test_load_runs_accepts_a_list_of_run_dirs(sweep):
    d = A.load_runs([sweep / "fixes=grpo,seed=0", sweep / "fixes=clip,seed=1"])
    assert sorted(d.runs["label"]) == ["clip", "grpo"]
    with pytest.raises(FileNotFoundError):
        A.load_runs(sweep / "nope")


def test_torn_metrics_line_is_skipped(tmp_path):
    from fixtures_runs import make_run

    run = make_run(tmp_path / "r", "grpo", 0, 0.3, "killed")
    with open(run["dir"] / rundir.METRICS, "a") as f:
        f.write('{"step": 9, "actor/entr')
    d = A.load_runs(run["dir"])
    assert d.history["step"].max() == 3


# --------------------------------------------------------------------------- #
# Statistics                                                                    #
# --------------------------------------------------------------------------- #
def test_t_interval_by_hand():
    iv = A.t_interval([30.0, 34.0, 32.0])
    assert (iv.mean, iv.n) == (32.0, 3)
    assert iv.half_width == pytest.approx(T975[2] * 2.0 / math.sqrt(3), abs=1e-3)
    one = A.t_interval([5.0])
    assert one.mean == 5.0 and one.n == 1 and math.isnan(one.lo) and math.isnan(one.hi)
    assert A.t_interval([]).n == 0


def test_paired_and_welch_by_hand():
    a = pd.Series([41.0, 44.0, 45.0], index=[0, 1, 2])
    b = pd.Series([30.0, 34.0, 32.0], index=[2, 0, 1])  # order must not matter: paired by index
    iv = A.difference(a, b)
    d = np.array([41 - 34, 44 - 32, 45 - 30], dtype=float)
    assert iv.test == "paired t" and iv.n == 3
    assert iv.mean == pytest.approx(d.mean())
    assert iv.half_width == pytest.approx(T975[2] * d.std(ddof=1) / math.sqrt(3), abs=1e-3)
    assert iv.p == pytest.approx(stats.ttest_rel(a.sort_index(), b.sort_index()).pvalue)
    w = A.difference(pd.Series([50.0, 46.0], index=[0, 1]), pd.Series([30.0, 34.0, 32.0], index=[0, 1, 2]))
    va, vb = 8.0 / 2, 4.0 / 3
    df = (va + vb) ** 2 / (va**2 / 1 + vb**2 / 2)
    assert w.test == "Welch t" and w.mean == pytest.approx(16.0)
    assert w.half_width == pytest.approx(stats.t.ppf(0.975, df) * math.sqrt(va + vb))
    assert w.p == pytest.approx(stats.ttest_ind([50, 46], [30, 34, 32], equal_var=False).pvalue)
    assert math.isnan(A.difference(pd.Series([48.0], index=[0]), b).lo)


# --------------------------------------------------------------------------- #
# The comparison table                                                          #
# --------------------------------------------------------------------------- #
def test_table_order_and_baseline(table):
    assert list(table.index) == ["grpo", "clip", "clip_ds", "full", "full_no_ds"]
    assert table.attrs["baseline"] == "grpo"
    assert table.attrs["n_excluded"] == 2
    assert {r["run"] for r in table.attrs["excluded"]} == {"fixes=clip,seed=2", "fixes=full,seed=2"}
    both = pd.concat([table, table])  # attrs hold no frames: pandas can compare them
    assert len(both) == 2 * len(table)


def test_table_numbers_by_hand(table):
    t = table
    # final accuracy (%) per configuration, failed and killed runs excluded
    hand = {"grpo": [30, 34, 32], "clip": [40, 36], "clip_ds": [41, 44, 45], "full": [50, 46], "full_no_ds": [48]}
    for label, xs in hand.items():
        xs = np.array(xs, dtype=float)
        assert t.loc[label, "final_acc"] == pytest.approx(xs.mean()), label
        assert t.loc[label, "final_acc_n"] == len(xs) == t.loc[label, "n"]
        if len(xs) > 1:
            h = T975[len(xs) - 1] * xs.std(ddof=1) / math.sqrt(len(xs))
            assert t.loc[label, "final_acc_hi"] - t.loc[label, "final_acc"] == pytest.approx(h, abs=1e-2)
            assert t.loc[label, "final_acc"] - t.loc[label, "final_acc_lo"] == pytest.approx(h, abs=1e-2)
    assert t.loc["clip", "final_acc"] == pytest.approx(38.0)  # not (40 + 36 + 0) / 3: the failed run is out
    assert t.loc["clip", "seeds"] == "0,1" and t.loc["clip", "excluded"] == 1
    assert math.isnan(t.loc["full_no_ds", "final_acc_lo"]) and math.isnan(t.loc["full_no_ds", "final_acc_hi"])
    # other columns: entropy at the last step (grpo: 0.70 0.71 0.72), zero-var average, rollouts per
    # trained (clip_ds: rounds 2,1,2,1,2,1); no wall time
    assert t.loc["grpo", "entropy"] == pytest.approx(0.71)
    assert t.loc["grpo", "zero_var"] == pytest.approx(np.mean([0.135, 0.145, 0.155]))
    assert t.loc["clip_ds", "rollouts_per_trained"] == pytest.approx(1.5)
    assert t.loc["grpo", "rollouts_per_trained"] == pytest.approx(1.0)
    assert "wall_time" not in t  # a wall time measures the machine as much as the configuration
    assert t.loc["grpo", "resp_len"] == pytest.approx(27.0)  # 20 + 6 + seed
    assert t.loc["grpo", "truncated"] == pytest.approx(0.06)
    assert t.loc["clip", "clip_high"] == pytest.approx(0.0005 * 3.5)
    assert t.loc["grpo", "clip_low"] == pytest.approx(0.002 * 3.5)
    assert t.loc["grpo", "best_acc"] == pytest.approx(32.0)


def test_table_difference_to_grpo(table):
    t = table
    assert t.loc["grpo", "d_test"] == "baseline" and math.isnan(t.loc["grpo", "d_final_acc"])
    # clip_ds has seeds 0,1,2 like grpo: paired on per-seed differences 11, 10, 13
    d = np.array([41 - 30, 44 - 34, 45 - 32], dtype=float)
    assert t.loc["clip_ds", "d_test"] == "paired t"
    assert t.loc["clip_ds", "d_final_acc"] == pytest.approx(d.mean())
    h = T975[2] * d.std(ddof=1) / math.sqrt(3)
    assert t.loc["clip_ds", "d_final_acc_hi"] - t.loc["clip_ds", "d_final_acc"] == pytest.approx(h, abs=1e-2)
    # clip and full miss seed 2 (failed / killed): Welch
    for label, xs in (("clip", [40, 36]), ("full", [50, 46])):
        w = stats.ttest_ind(xs, [30, 34, 32], equal_var=False)
        assert t.loc[label, "d_test"] == "Welch t"
        assert t.loc[label, "d_final_acc"] == pytest.approx(np.mean(xs) - 32.0)
        assert t.loc[label, "d_final_acc_p"] == pytest.approx(w.pvalue)
    assert t.loc["full_no_ds", "d_test"] == "Welch t" and math.isnan(t.loc["full_no_ds", "d_final_acc_lo"])


def test_paper_column_only_where_the_paper_has_the_row(table, ladder):
    t = table
    assert t["paper_aime24"].to_dict() == pytest.approx(
        {"grpo": 30.0, "clip": np.nan, "clip_ds": np.nan, "full": 52.0, "full_no_ds": 50.0}, nan_ok=True
    )
    lt = A.comparison_table(ladder)
    assert list(lt.index) == [
        "paper_1_grpo", "paper_2_of", "paper_3_clip", "paper_4_sop", "paper_5_tl", "paper_6_dapo", "grpo", "full",
    ]
    assert lt["paper_aime24"].tolist() == [30.0, 36.0, 38.0, 41.0, 42.0, 50.0, 30.0, 52.0]
    assert lt.attrs["baseline"] == "paper_1_grpo"
    assert lt.loc["paper_2_of", "d_test"] == "paired t"
    # seeds 0,1 with 33, 34 vs 30, 31: +3 pp each
    assert lt.loc["paper_2_of", "d_final_acc"] == pytest.approx(3.0)
    f = A.format_table(t)
    assert not [c for c in f.columns if "paper" in c]  # never beside our numbers
    block = A.paper_block(t)
    assert "naive GRPO 30, + overlong filtering 36, + clip-higher 38, + soft overlong punishment 41, " \
        "+ token-level loss 42, + dynamic sampling (DAPO) 50" in block
    assert "DAPO (released recipe) 52" in block
    assert "grpo ↔ Table 1: naive GRPO (30)" in block and "full ↔ verl re-run: DAPO (released recipe) (52)" in block
    assert "clip ↔" not in block


def test_paper_mapping_labels_are_real_labels():
    """Every key of PAPER_AIME24 is what the run label gives for some switch state."""
    from dapo_exp import fixes
    from dapo_exp.hydra_setup import run_label

    for label in A.PAPER_AIME24:
        if label in fixes.PRESETS:
            continue
        sw = {name: f.short in label.split("+") for name, f in fixes.FIXES.items()}
        cfg = OmegaConf.create({"preset": "custom", "algo": algo_of(sw)})
        assert run_label(cfg) == label


def test_order_labels_default_and_others():
    got = A.order_labels(["clip+sop+of", "unknown", "full_no_tl", "of", "full", "grpo", "clip+of", "clip"])
    assert got == ["grpo", "clip", "full", "full_no_tl", "of", "clip+of", "clip+sop+of", "unknown"]


def test_formatted_cells(table):
    f = A.format_table(table).set_index("config")
    assert f.loc["grpo", "final acc (%)"] == f"32.0 ± {T975[2] * 2 / math.sqrt(3):.1f}"
    assert f.loc["full_no_ds", "final acc (%)"] == "48.0 ± n/a"
    assert f.loc["clip_ds", "Δ test"] == "paired t"
    assert f.loc["clip_ds", "Δ final acc vs grpo (pp)"].startswith("+11.3 ± ")
    assert f.loc["grpo", "Δ final acc vs grpo (pp)"] == "—"


def test_write_table_files(table, tmp_path):
    paths = A.write_table(table, tmp_path)
    md = paths["md"].read_text()
    assert "Student-t" in md and "n/a where n = 1" in md and "Welch" in md
    assert "paper AIME24 avg@32 (Qwen2.5-32B)" in md and "Excluded runs (2)" in md
    assert md.index("**The paper, for orientation") > md.index("| config")  # its own block, after the table
    assert "best acc: the highest held-out accuracy" in md
    csv = pd.read_csv(paths["csv"], index_col="config")
    assert "paper_aime24" not in csv.columns
    assert csv.loc["clip", "final_acc"] == pytest.approx(38.0)
    tex = paths["tex"].read_text()
    assert r"\begin{tabular}" in tex and r"$\pm$" in tex and r"\caption{" in tex and "Student-t" in tex


# --------------------------------------------------------------------------- #
# Curves                                                                        #
# --------------------------------------------------------------------------- #
def test_curve_frame_step_and_compute(data):
    cf = A.curve_frame(data, rundir.EVAL_ACC, "step", band="minmax")
    g = cf[(cf["label"] == "grpo") & (cf["x"] == 6)].iloc[0]
    assert (g["mean"], g["lo"], g["hi"], g["n"]) == pytest.approx((0.32, 0.30, 0.34, 3))
    # the default band is the table's 95% t interval of the mean over seeds
    ci = A.curve_frame(data, rundir.EVAL_ACC, "step")
    g = ci[(ci["label"] == "grpo") & (ci["x"] == 6)].iloc[0]
    iv = A.t_interval([0.30, 0.34, 0.32])
    assert (g["lo"], g["hi"]) == pytest.approx((iv.lo, iv.hi))
    # failed/killed runs are not in the curves: clip has 2 seeds
    assert cf[(cf["label"] == "clip") & (cf["x"] == 6)]["n"].item() == 2
    # eval at step 3 sits at the rollouts generated by step 3: 3 x 64 (grpo: one round per step)
    cr = A.curve_frame(data, rundir.EVAL_ACC, "rollouts", band="sd")
    g = cr[(cr["label"] == "grpo") & (cr["x"] == 192)].iloc[0]
    assert g["mean"] == pytest.approx(0.21)
    assert g["hi"] - g["mean"] == pytest.approx(np.std([0.20, 0.22, 0.21], ddof=1))
    assert cr[(cr["label"] == "grpo")]["x"].min() == 0  # the step-0 eval sits at zero compute


def test_curve_frame_interpolates_seeds_on_a_compute_axis():
    rows = []
    for run, xs, ys in (("a", [10, 20], [1, 2]), ("b", [15, 30], [3, 6])):
        for step, (x, y) in enumerate(zip(xs, ys), start=1):
            rows.append({"run": run, "label": "L", "seed": 0, "step": step, "metric": "m", "value": y})
            rows.append(
                {"run": run, "label": "L", "seed": 0, "step": step, "metric": rundir.CUM_ROLLOUTS, "value": x}
            )
    cf = A.curve_frame(pd.DataFrame(rows), "m", "rollouts", band="minmax")
    # common range [15, 20]: a(15)=1.5 a(20)=2; b(15)=3 b(20)=4
    assert cf["x"].tolist() == [15, 20]
    assert cf["mean"].tolist() == pytest.approx([2.25, 3.0])
    assert cf["lo"].tolist() == pytest.approx([1.5, 2.0]) and cf["hi"].tolist() == pytest.approx([3.0, 4.0])


def test_colours_are_stable_and_distinct():
    assert A.label_color("grpo") == "#7f7f7f"
    assert A.label_color("clip+sop+of") == A.label_color("clip+sop+of")
    labels = ["grpo", "clip", "clip_ds", "full", "clip+of", "ds+tl", "clip+sop+of"]
    assert len(set(A.label_colors(labels).values())) == len(labels)


def test_write_figures(data, tmp_path):
    files = A.write_figures(data, tmp_path, axes=("rollouts",), formats=("png", "svg"))
    assert sorted(p.name for p in files) == ["curves_vs_rollouts.png", "curves_vs_rollouts.svg"]
    assert all(p.stat().st_size > 1000 for p in files)


def test_plot_says_what_the_band_is(data):
    fig = A.plot_curves(data, metrics=[rundir.EVAL_ACC, "not/logged"], x="step", band="sd", ncols=2)
    assert "mean over seeds" in fig._suptitle.get_text() and "1 sd across seeds" in fig._suptitle.get_text()
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["grpo (n=3)", "clip (n=2)", "clip_ds (n=3)", "full (n=2)", "full_no_ds (n=1)"]
    line_colors = {l.get_label(): l.get_color() for l in fig.axes[0].get_lines()}
    assert line_colors["grpo"] == A.label_color("grpo")
    assert any(t.get_text() == "not logged" for t in fig.axes[1].texts)


# --------------------------------------------------------------------------- #
# Samples                                                                       #
# --------------------------------------------------------------------------- #
def test_samples(data):
    s = A.load_samples(data, "eval")
    assert len(s) == 11 * 8  # included runs x 8 samples of their last eval step
    assert set(s["step"]) == {6}
    st = A.sample_stats(s)
    assert list(st.index) == ["grpo", "clip", "clip_ds", "full", "full_no_ds"]
    ex = A.sample_examples(s, n=2)
    assert set(ex["category"]) == {"correct", "wrong", "truncated", "longest"}
    assert ex[ex["category"] == "truncated"]["truncated"].all()
    assert not ex[ex["category"] == "wrong"]["correct"].any()
    longest = ex[(ex["category"] == "longest") & (ex["label"] == "grpo")]["length"]
    assert longest.min() >= s[s["label"] == "grpo"]["length"].nlargest(2).min()
    assert "=== grpo ===" in A.format_examples(ex)
    t = A.load_samples(data, "train", step=None)
    assert set(t["step"]) == set(range(1, 7)) and "reward" in t


# --------------------------------------------------------------------------- #
# Command line, callback, imports                                               #
# --------------------------------------------------------------------------- #
def test_cli(sweep, tmp_path, capsys):
    from dapo_exp.analysis.cli import main

    assert main([str(sweep), "--out", str(tmp_path / "out"), "--no-figures"]) == 0
    out = capsys.readouterr().out
    # the terminal's table (the Markdown one is in table.md)
    assert any(ln.startswith("grpo ") and "±" in ln for ln in out.splitlines())
    assert "excluded from the statistics: 2" in out and "| grpo " in (tmp_path / "out" / "table.md").read_text()
    for f in ("table.md", "table.csv", "table.tex", "runs.csv"):
        assert (tmp_path / "out" / f).is_file()
    assert main([str(tmp_path / "missing")]) == 2


def test_callback_prints_table_and_never_raises(sweep, tmp_path, capsys, monkeypatch):
    from dapo_exp.analysis.callback import AnalysisCallback

    cb = AnalysisCallback(figures=False)
    cb.on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}))
    out = capsys.readouterr().out
    assert any(ln.startswith("clip_ds ") and "±" in ln for ln in out.splitlines())
    assert str(sweep / "analysis" / "figures") not in out
    assert (sweep / "analysis" / "table.md").is_file()
    # an empty sweep dir, a missing one, a broken analysis, a config without hydra: warnings only
    (tmp_path / "empty").mkdir()
    cb.on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "empty")}}}))
    cb.on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "missing")}}}))
    cb.on_multirun_end(OmegaConf.create({}))
    import dapo_exp.analysis.report as report

    monkeypatch.setattr(report, "run_analysis", lambda *a, **k: 1 / 0)
    cb.on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}))
    err = capsys.readouterr().err
    assert err.count("WARNING") == 3 and "ZeroDivisionError" in err


def test_callback_is_instantiated_from_the_root_config():
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from dapo_exp.analysis.callback import AnalysisCallback
    from dapo_exp.hydra_setup import register_resolvers

    register_resolvers()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["sweep=demo"], return_hydra_config=True)
    assert isinstance(instantiate(cfg.hydra.callbacks.analysis), AnalysisCallback)
    assert cfg.hydra.sweep.dir == "multirun/demo"


def test_analysis_imports_neither_torch_nor_the_trainer():
    code = (
        "import sys, dapo_exp.analysis.callback\n"
        "assert 'pandas' not in sys.modules, 'the callback module must stay light'\n"
        "import dapo_exp.analysis as A\n"
        "[getattr(A, n) for n in A.__all__]\n"
        "import dapo_exp.analysis.cli, dapo_exp.analysis.report\n"
        "bad = [m for m in ('torch', 'dapo_exp.train', 'dapo_exp.rollout', 'transformers') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_duplicate_seeds_are_reported_and_not_paired(tmp_path):
    from fixtures_runs import make_sweep as mk

    mk(tmp_path / "a", [("grpo", 0, 0.3, "finished"), ("grpo", 1, 0.3, "finished"), ("full", 0, 0.5, "finished"),
                        ("full", 1, 0.4, "finished")])
    mk(tmp_path / "b", [("full", 0, 0.6, "finished")])
    t = A.comparison_table(A.load_runs([tmp_path / "a", tmp_path / "b"]))
    assert t.loc["full", "n"] == 3 and t.loc["full", "d_test"] == "Welch t"
    assert any(n.startswith("full: seed(s) 0") for n in t.attrs["notes"])
    assert "Note: full: seed(s) 0" in A.table_markdown(t)


def test_no_usable_run(tmp_path):
    from fixtures_runs import make_sweep as mk

    mk(tmp_path / "s", [("grpo", 0, 0.3, "failed"), ("clip", 0, 0.3, "killed")])
    d = A.load_runs(tmp_path / "s")
    t = A.comparison_table(d)
    assert list(t.index) == ["grpo", "clip"] and t["n"].tolist() == [0, 0]
    assert t.attrs["baseline"] is None and t.attrs["n_excluded"] == 2
    assert "| grpo " in A.table_markdown(t)
    (tmp_path / "empty").mkdir()
    e = A.load_runs(tmp_path / "empty")
    assert len(e.runs) == 0 and "(no runs)" in A.table_markdown(A.comparison_table(e))
    from dapo_exp.analysis.report import run_analysis

    with pytest.raises(FileNotFoundError):
        run_analysis(tmp_path / "empty", out=tmp_path / "out")


def test_run_ids_stay_distinct_across_sweeps(tmp_path):
    from fixtures_runs import make_sweep as mk

    mk(tmp_path / "s1", [("full", 0, 0.5, "finished")])
    mk(tmp_path / "s2", [("full", 0, 0.6, "finished")])
    d = A.load_runs([tmp_path / "s1", tmp_path / "s2"])
    assert sorted(d.runs["run"]) == ["s1/fixes=full,seed=0", "s2/fixes=full,seed=0"]
    assert d.history.groupby("run")["metric"].size().nunique() == 1
    one = A.load_runs(tmp_path / "s1")
    assert one.runs["run"].tolist() == ["fixes=full,seed=0"]


def test_killed_run_labelled_from_the_trainers_config_json(tmp_path):
    import json
    import shutil

    from fixtures_runs import make_run, resolved_config

    run = make_run(tmp_path / "r", "grpo", 4, 0.3, "killed")
    shutil.rmtree(run["dir"] / ".hydra")
    (run["dir"] / "config.json").write_text(json.dumps({"config": resolved_config("clip_ds", 4), "git_commit": "x"}))
    r = A.load_runs(run["dir"]).runs.iloc[0]
    assert (r["label"], r["seed"], r["status"], r["included"]) == ("clip_ds", 4, "killed", False)


@pytest.mark.parametrize("damage, what", [
    ('{"step": 5, "actor/entropy": 4.635}', "step 5 logged again with actor/entropy = 4.635"),
    ('{"step": 6, "actor/entropy": Infinity}', "(step 6): actor/entropy = inf"),
    ('{"step": 6, "response_length/mean": 1e308}', "response_length/mean = 1e+308"),
])
def test_a_damaged_history_is_reported_and_left_out_of_the_statistics(tmp_path, damage, what):
    """One appended row (a repeated step with another value, inf, 1e308) is named with its run and row,
    and the run leaves the statistics instead of moving the table's values."""
    make_sweep(tmp_path, STANDARD_SWEEP)
    victim = tmp_path / "fixes=grpo,seed=1"
    clean = A.load_runs(tmp_path)
    with open(victim / rundir.METRICS, "a") as f:
        f.write(damage + "\n")
    with pytest.warns(UserWarning, match="damaged metrics") as caught:
        data = A.load_runs(tmp_path)
    assert any(str(victim) in str(w.message) for w in caught)
    row = data.runs.set_index("run").loc["fixes=grpo,seed=1"]
    assert not row["included"] and "damaged metrics" in row["exclude_reason"] and what in row["exclude_reason"]
    assert len(data.included) == len(clean.included) - 1
    assert np.isfinite(data.history["value"]).all() and data.history["value"].abs().max() < 1e100


@pytest.mark.parametrize("damage, what", [
    ({"final": "0.5"}, "final is a str, not an object"),
    ({"config": []}, "config is a list, not an object"),
    ({"final": {"eval/acc_avg": "high"}}, 'final.eval/acc_avg is "high", not a number'),
    ({"seed": "one"}, 'seed is "one", not a number'),
])
def test_a_malformed_summary_is_reported_and_left_out_of_the_statistics(tmp_path, damage, what):
    """Issue 34: a wrongly typed summary.json raised AttributeError in every analysis of its sweep."""
    import json

    make_sweep(tmp_path, STANDARD_SWEEP)
    victim = tmp_path / "fixes=grpo,seed=1"
    clean = A.load_runs(tmp_path)
    summary = json.loads((victim / rundir.SUMMARY).read_text())
    (victim / rundir.SUMMARY).write_text(json.dumps(summary | damage))
    with pytest.warns(UserWarning, match="malformed summary.json") as caught:
        data = A.load_runs(tmp_path)
    assert any(str(victim) in str(w.message) for w in caught)
    row = data.runs.set_index("run").loc["fixes=grpo,seed=1"]
    assert not row["included"] and row["exclude_reason"] == f"malformed summary.json: {what}"
    assert len(data.included) == len(clean.included) - 1
    A.comparison_table(data)  # the table is still made from the others


@pytest.mark.parametrize("damage, what", [
    (lambda s: s | {"label": "x" * 1_000_000}, "label is 1000000 characters, over the 500 read"),
    (lambda s: s | {"error": "y" * 30_000}, "error is 30000 characters, over the 20000 read"),
    (lambda s: s | {"notes": "z" * (4 * 2**20 + 1)}, "bytes, over the 4194304 read"),
    (lambda s: "[" * 200_000 + "]" * 200_000, "nested deeper than the JSON parser reads"),
    (lambda s: json.dumps(s)[:-40], "not valid JSON (torn?)"),
])
def test_a_summary_over_its_bounds_is_refused_for_that_run_naming_why_and_the_rest_analysed(tmp_path, damage, what):
    """A field or file over its stated size (a 1 MB label, copied into every history row, ran the figures for
    minutes; 50 MB took 16 GB), too deep to parse, or torn: that run is left out naming the reason, never read as
    killed, and the table is made from the others."""
    make_sweep(tmp_path, STANDARD_SWEEP)
    victim = tmp_path / "fixes=grpo,seed=1"
    clean = A.load_runs(tmp_path)
    summary = json.loads((victim / rundir.SUMMARY).read_text())
    text = damage(summary)
    (victim / rundir.SUMMARY).write_text(text if isinstance(text, str) else json.dumps(text))
    with pytest.warns(UserWarning, match="malformed summary.json") as caught:
        data = A.load_runs(tmp_path)
    assert any(str(victim) in str(w.message) and what in str(w.message) for w in caught), [str(w.message) for w in caught]
    row = data.runs.set_index("run").loc["fixes=grpo,seed=1"]
    assert not row["included"] and what in row["exclude_reason"] and "killed" not in row["exclude_reason"]
    assert len(data.included) == len(clean.included) - 1
    assert data.runs["label"].map(len).max() <= 500 and data.history["label"].map(len).max() <= 500
    A.comparison_table(data)


def test_skipped_lines_of_metrics_jsonl_are_reported_with_their_run_and_reason(tmp_path):
    """A torn last line, a line that is not an object and a step that is not an int are left out of the history,
    each reported with the run, the line and the reason; the rows around them are kept."""
    make_sweep(tmp_path, STANDARD_SWEEP)
    victim = tmp_path / "fixes=grpo,seed=1"
    clean = A.load_runs(tmp_path)
    with open(victim / rundir.METRICS, "a") as f:
        f.write('[1, 2]\n{"step": "7", "actor/entropy": 1.0}\n{"step": 8, "actor/ent')
    with pytest.warns(UserWarning, match="skipped") as caught:
        data = A.load_runs(tmp_path)
    (message,) = [str(w.message) for w in caught if str(victim) in str(w.message)]
    assert "not an object" in message and "not an int" in message and "torn" in message, message
    assert len(data.history) == len(clean.history)


def test_a_value_that_is_not_a_number_is_reported_naming_the_run_line_and_key_and_left_out(tmp_path):
    """Issue 48: a list where a metric number belongs was dropped without a word. Each value of metrics.jsonl
    that is not a number (a list, a string, an object, null) is reported with its run, line, key and what it is,
    and left out; the numbers of its row are kept, and no row of its own is made of it."""
    make_sweep(tmp_path, STANDARD_SWEEP)
    victim = tmp_path / "fixes=grpo,seed=1"
    clean = A.load_runs(tmp_path)
    with open(victim / rundir.METRICS, "a") as f:  # lines 10-12
        f.write('{"step": 7, "actor/entropy": [1.0, 2.0], "actor/kl": 0.01}\n{"step": 8, "eval/acc_avg": "0.5"}\n'
                '{"step": 9, "actor/entropy": {"mean": 1.0}, "actor/kl": null}\n')
    with pytest.warns(UserWarning, match="not numbers") as caught:
        data = A.load_runs(tmp_path)
    (message,) = [str(w.message) for w in caught if "not numbers" in str(w.message)]
    assert str(victim) in message and "4 value(s)" in message, message
    for said in ("line 10: actor/entropy is a list", "line 11: eval/acc_avg is a string",
                 "line 12: actor/entropy is an object", "line 12: actor/kl is null"):
        assert said in message, (said, message)
    added = data.history.merge(clean.history, how="left", indicator=True)  # what the damaged lines added
    added = added[added["_merge"] == "left_only"]
    assert added[["run", "step", "metric", "value"]].values.tolist() == [["fixes=grpo,seed=1", 7, "actor/kl", 0.01]]
    assert len(data.runs) == len(clean.runs) and data.runs.set_index("run").loc["fixes=grpo,seed=1", "included"]


def test_a_summary_nested_too_deep_to_parse_never_stops_the_analysis(tmp_path):
    """Issue 34: 200,000 nested brackets raised RecursionError in every analysis and every re-run."""
    make_sweep(tmp_path, STANDARD_SWEEP)
    victim = tmp_path / "fixes=grpo,seed=1"
    clean = A.load_runs(tmp_path)
    (victim / rundir.SUMMARY).write_text("[" * 200_000 + "]" * 200_000)
    assert rundir.read_summary(victim) is None
    data = A.load_runs(tmp_path)
    assert not data.runs.set_index("run").loc["fixes=grpo,seed=1", "included"]
    assert len(data.included) == len(clean.included) - 1
