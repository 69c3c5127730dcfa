"""Seed planning (dapo_exp.analysis.planning): the seed counts deliver the power they promise."""

from __future__ import annotations

import math

import numpy as np
import pytest
from fixtures_runs import make_sweep
from scipy import stats

from dapo_exp import analysis as A
from dapo_exp.analysis import planning as PL

SIMS = 4000


def test_unpaired_seed_count_achieves_power_08_in_simulation():
    sd, delta = 8.0, 5.0
    n = PL.seeds_unpaired(delta, sd)
    assert n > 10  # a count where one seed more or less changes the power by little
    rng = np.random.default_rng(0)
    a = rng.normal(0.0, sd, (SIMS, n))
    b = rng.normal(delta, sd, (SIMS, n))
    power = (stats.ttest_ind(a, b, axis=1).pvalue < 0.05).mean()
    assert abs(power - 0.8) <= 0.05, (n, power)
    # one seed fewer falls short of 0.8 (the planner rounds up, not down)
    power_less = (stats.ttest_ind(a[:, : n - 1], b[:, : n - 1], axis=1).pvalue < 0.05).mean()
    assert power_less < power


def test_paired_seed_count_achieves_power_08_in_simulation():
    sd_d, delta = 6.0, 5.0
    n = PL.seeds_paired(delta, sd_d)
    rng = np.random.default_rng(1)
    # per-seed differences of two configurations that share a seed effect (sd 10) cancelling out
    seed_effect = rng.normal(0, 10.0, (SIMS, n))
    a = seed_effect + rng.normal(0, sd_d / math.sqrt(2), (SIMS, n))
    b = seed_effect + delta + rng.normal(0, sd_d / math.sqrt(2), (SIMS, n))
    power = (stats.ttest_rel(a, b, axis=1).pvalue < 0.05).mean()
    assert abs(power - 0.8) <= 0.05, (n, power)


def test_half_widths_by_hand():
    h = PL.half_widths(sd=4.0, sd_paired=6.0, n=5)
    assert h["mean"] == pytest.approx(stats.t.ppf(0.975, 4) * 4 / math.sqrt(5))
    assert h["paired diff"] == pytest.approx(stats.t.ppf(0.975, 4) * 6 / math.sqrt(5))
    assert h["unpaired diff"] == pytest.approx(stats.t.ppf(0.975, 8) * 4 * math.sqrt(2 / 5))
    assert h["2^(5-1) effect"] == pytest.approx(stats.t.ppf(0.975, 60) * 2 * (6 / math.sqrt(2)) / math.sqrt(80))
    assert math.isnan(PL.half_widths(4.0, 6.0, 1)["mean"])
    assert PL.seeds_unpaired(100.0, 1.0) == 2  # huge effect: the least that gives an interval


def test_variances_from_runs_and_from_their_table_agree(tmp_path):
    spec = [(p, s, acc, "finished") for p, accs in (("grpo", (0.30, 0.36, 0.31)), ("clip", (0.41, 0.40, 0.47)),
                                                    ("full", (0.50, 0.42, 0.45))) for s, acc in enumerate(accs)]
    make_sweep(tmp_path / "pilot", spec)
    data = A.load_runs(tmp_path / "pilot")
    from_runs = PL.pilot_variances(tmp_path / "pilot")
    # by hand: pooled sd of the three configurations, and of the per-seed differences to grpo
    y = {p: np.array([a for q, _, a, _ in spec if q == p]) * 100 for p in ("grpo", "clip", "full")}
    pooled = math.sqrt(np.mean([v.var(ddof=1) for v in y.values()]))
    paired = math.sqrt(np.mean([(y[p] - y["grpo"]).var(ddof=1) for p in ("clip", "full")]))
    assert from_runs.loc["final_acc", "sd"] == pytest.approx(pooled)
    assert from_runs.loc["final_acc", "sd_paired"] == pytest.approx(paired)
    assert from_runs.loc["final_acc", "df"] == 6 and from_runs.loc["final_acc", "df_paired"] == 4
    table = A.comparison_table(data)
    A.write_table(table, tmp_path / "out")
    from_csv = PL.pilot_variances(tmp_path / "out" / "table.csv")
    assert from_csv.loc["final_acc", "sd"] == pytest.approx(pooled)
    assert from_csv.loc["final_acc", "sd_paired"] == pytest.approx(paired)
    assert from_csv.loc["final_acc", "header"] == from_runs.loc["final_acc", "header"] == "final acc (%)"
    import pandas as pd

    last3 = tmp_path / "last3.csv"  # a table of runs that declare the mean of the last 3 evaluations
    pd.read_csv(tmp_path / "out" / "table.csv").assign(endpoint="acc last-3 mean").to_csv(last3, index=False)
    assert PL.pilot_variances(last3).loc["final_acc", "header"] == "acc last-3 mean (%)"
    # an old table.csv without the sd columns: backed out of the t intervals
    old = tmp_path / "old.csv"
    t = pd.read_csv(tmp_path / "out" / "table.csv")
    t.drop(columns=[c for c in t if c.endswith("_sd")] + ["endpoint"]).to_csv(old, index=False)
    backed = PL.pilot_variances(old)
    assert backed.loc["final_acc", "sd"] == pytest.approx(pooled)
    assert backed.loc["final_acc", "sd_paired"] == pytest.approx(paired)
    assert backed.loc["final_acc", "header"] == "final acc (%)"  # no endpoint column: final accuracy


def test_plan_cli_prints_seed_counts(tmp_path, capsys):
    from dapo_exp.analysis.cli import main

    spec = [(p, s, 0.3 + 0.05 * s + (0.1 if p == "full" else 0) + 0.02 * (s == 1 and p == "full"), "finished")
            for p in ("grpo", "full") for s in range(3)]
    make_sweep(tmp_path / "pilot", spec)
    assert main(["plan", str(tmp_path / "pilot"), "--delta", "5"]) == 0
    out = capsys.readouterr().out
    v = PL.pilot_variances(tmp_path / "pilot")
    n = PL.seeds_unpaired(5.0, v.loc["final_acc", "sd"])
    assert f"seeds per configuration for power 0.8: unpaired {n}," in out
    assert "95% half-width with N seeds" in out and "2^(5-1) effect" in out
    assert main(["plan", str(tmp_path / "nope"), "--delta", "5"]) == 2


def test_plan_gives_the_sequential_designs_expected_cost(tmp_path, capsys):
    """Beside the fixed count: a sequential sweep's expected and 90th-percentile seeds at the stated
    difference, simulated at the sd used, the same on every call (dapo_exp.analysis.sequential)."""
    from dapo_exp.analysis import sequential as S
    from dapo_exp.analysis.cli import main

    spec = [(p, s, 0.3 + 0.05 * s + (0.1 if p == "full" else 0) + 0.02 * (s == 1 and p == "full"), "finished")
            for p in ("grpo", "full") for s in range(3)]
    make_sweep(tmp_path / "pilot", spec)
    p = PL.plan(tmp_path / "pilot", 5.0, metrics=["final_acc"], paired_sd=2.19)
    r = p.loc["final_acc"]
    st = S.simulate(5.0, 2.19, sims=PL.SEQ_SIMS, margin=PL.DEFAULT_MARGIN, seed=PL.SEQ_SEED)
    assert r["seq_mean"] == pytest.approx(st.n.mean())
    assert r["seq_p90"] == np.quantile(st.n, 0.9, method="inverted_cdf")
    assert r["seq_different"] == pytest.approx(np.mean(st.state == S.DIFFERENT)) and r["seq_different"] > 0.99
    assert S.DEFAULT_FIRST <= r["seq_mean"] <= r["seq_p90"] <= S.DEFAULT_BUDGET and r["seq_margin"] == 5.0
    assert PL.plan(tmp_path / "pilot", 5.0, metrics=["final_acc"], paired_sd=2.19).loc["final_acc", "seq_mean"] \
        == r["seq_mean"]  # a fixed random seed
    for col in ("n_paired", "n_unpaired", "seeds_to_add", "hw paired diff @5"):  # the fixed plan is still there
        assert col in p
    bigger = PL.plan(tmp_path / "pilot", 10.0, metrics=["final_acc"], paired_sd=2.19).loc["final_acc"]
    noisier = PL.plan(tmp_path / "pilot", 5.0, metrics=["final_acc"], paired_sd=8.0).loc["final_acc"]
    assert bigger["seq_mean"] < r["seq_mean"] < noisier["seq_mean"] and noisier["seq_undecided"] > 0.2
    assert main(["plan", str(tmp_path / "pilot"), "--delta", "5", "--paired-sd", "2.19", "--metrics", "final_acc"]) == 0
    out = capsys.readouterr().out
    assert (f"at a difference of 5, {r['seq_mean']:.1f} seeds per configuration expected, 90% of sweeps within "
            f"{int(r['seq_p90'])}; P(different) {r['seq_different']:.2f}") in out
    assert "until different or equivalent within ±5, at most 20" in out
