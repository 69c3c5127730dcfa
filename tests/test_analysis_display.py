"""Honest small-n display: clipped intervals, undefined zero-variance differences, the n < 3 warning,
figure bands equal to the table's intervals, y axes with units."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from fixtures_runs import make_sweep

from dapo_exp import analysis as A
from dapo_exp import rundir

SPEC = [
    ("grpo", 0, 0.30, "finished"),
    ("grpo", 1, 0.34, "finished"),
    ("grpo", 2, 0.32, "finished"),
    # the same per-seed difference to grpo on every seed: +2 pp, zero variance
    ("clip", 0, 0.32, "finished"),
    ("clip", 1, 0.36, "finished"),
    ("clip", 2, 0.34, "finished"),
    # near zero: the t interval reaches below 0
    ("full", 0, 0.01, "finished"),
    ("full", 1, 0.09, "finished"),
    ("full", 2, 0.02, "finished"),
    # two seeds only
    ("clip_ds", 0, 0.40, "finished"),
    ("clip_ds", 1, 0.44, "finished"),
]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("multirun") / "small"
    make_sweep(root, SPEC)
    return A.load_runs(root)


@pytest.fixture(scope="module")
def table(data):
    return A.comparison_table(data)


def test_accuracy_interval_is_clipped_to_0_100(table):
    raw = A.t_interval([1.0, 9.0, 2.0])
    assert raw.lo < 0  # what the unclipped interval would print
    assert table.loc["full", "final_acc_lo"] == 0.0
    assert table.loc["full", "final_acc_hi"] == pytest.approx(raw.hi)
    cell = A.format_table(table).set_index("config").loc["full", "final acc (%)"]
    assert cell == f"4.0 [0.0, {raw.hi:.1f}]"
    # symmetric intervals keep the ± form
    assert A.format_table(table).set_index("config").loc["grpo", "final acc (%)"].startswith("32.0 ± ")


def test_zero_variance_paired_difference_is_not_shown_as_certain(table):
    r = table.loc["clip"]
    assert r["d_test"] == "paired t" and r["d_final_acc"] == pytest.approx(2.0)
    assert np.isnan(r["d_final_acc_lo"]) and r["d_note"] == "identical per seed"
    cell = A.format_table(table).set_index("config").loc["clip", "Δ final acc vs grpo (pp)"]
    assert cell == "+2.0 ± n/a (identical per seed)"
    assert "+2.0 ± 0.0" not in A.table_markdown(table)
    iv = A.welch_difference([5.0, 5.0], [3.0, 3.0, 3.0])
    assert np.isnan(iv.lo) and iv.note == "identical values"


def test_warning_line_above_a_table_with_fewer_than_3_seeds(table, data):
    md = A.table_markdown(table)
    first = md.splitlines()[0]
    assert first.startswith("**Warning: fewer than 3 seeds in clip_ds (n=2).**")
    assert md.index("Warning") < md.index("**Comparison table.**")
    three = A.comparison_table(data.runs[data.runs["label"] != "clip_ds"])
    assert "Warning" not in A.table_markdown(three)
    assert "Warning: fewer than 3 seeds" in A.table_latex(table)


def test_figure_band_is_the_tables_interval_and_axes_have_units(data, table):
    cf = A.curve_frame(data, rundir.EVAL_ACC, "step")
    last = cf[cf["x"] == cf["x"].max()].set_index("label")
    for label in ("grpo", "full", "clip_ds"):
        assert last.loc[label, "lo"] * 100 == pytest.approx(table.loc[label, "final_acc_lo"])
        assert last.loc[label, "hi"] * 100 == pytest.approx(table.loc[label, "final_acc_hi"])
    fig = A.plot_curves(data, metrics=[rundir.EVAL_ACC, rundir.ENTROPY, rundir.RESP_LEN], ncols=3)
    ylabels = [ax.get_ylabel() for ax in fig.axes[:3]]
    assert ylabels == ["avg@k accuracy (%)", "entropy (nats / token)", "response length (tokens)"]
    assert "95% t-interval of the mean over seeds (as the table)" in fig._suptitle.get_text()
    # accuracy drawn in percent, as in the table
    grpo = next(l for l in fig.axes[0].get_lines() if l.get_label() == "grpo")
    assert grpo.get_ydata()[-1] == pytest.approx(table.loc["grpo", "final_acc"])
    # the band of the figure is that interval: its polygon spans [lo, hi] at the last step
    band = fig.axes[0].collections[0].get_paths()[0].vertices
    at_last = band[band[:, 0] == cf["x"].max()][:, 1]
    assert at_last.min() == pytest.approx(table.loc["grpo", "final_acc_lo"])
    assert at_last.max() == pytest.approx(table.loc["grpo", "final_acc_hi"])


def test_csv_holds_the_sd_and_the_clipped_bounds(table, tmp_path):
    A.write_table(table, tmp_path)
    csv = pd.read_csv(tmp_path / "table.csv", index_col="config")
    assert csv.loc["full", "final_acc_lo"] == 0.0
    assert csv.loc["grpo", "final_acc_sd"] == pytest.approx(np.std([30, 34, 32], ddof=1))
    assert re.search(r"clipped to the metric's range", (tmp_path / "table.md").read_text())
