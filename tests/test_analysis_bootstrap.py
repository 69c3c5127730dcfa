"""Hierarchical bootstrap over seeds, problems and samples (dapo_exp.analysis.bootstrap)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from fixtures_runs import make_switch_run

from dapo_exp import analysis as A
from dapo_exp.analysis import bootstrap as boot
from dapo_exp.analysis.design import SWITCHES


def cube_from(correct: np.ndarray, configs=("x",)) -> boot.SampleCube:
    """correct: (G, S, P, k) booleans -> a SampleCube."""
    G, S, P, k = correct.shape
    return boot.SampleCube(list(configs), list(range(S)), [f"p{i}" for i in range(P)],
                           correct.sum(axis=3).astype(float), np.full((G, S, P), float(k)))


def varied_cube(rng, S=4, P=64, k=4, G=1, seed_sd=0.4) -> np.ndarray:
    """Problems of varied difficulty, seeds shifting the logit, Bernoulli samples: every level varies."""
    difficulty = rng.normal(0, 1.5, P)
    shift = rng.normal(0, seed_sd, (G, S))
    p = 1 / (1 + np.exp(-(difficulty[None, None, :] + shift[:, :, None])))
    return rng.random((G, S, P, k)) < p[..., None]


def half_width(ci: pd.DataFrame, col="acc") -> float:
    return float((ci[f"{col}_hi"] - ci[f"{col}_lo"]).iloc[0] / 2)


def test_interval_widens_as_problems_are_removed():
    rng = np.random.default_rng(0)
    cube = cube_from(varied_cube(rng, P=64))
    widths = []
    for n in (64, 32, 16, 8):
        sub = cube.subset_problems(cube.problems[:n])
        widths.append(half_width(boot.config_intervals(sub, B=2000, seed=1)))
    assert all(a < b for a, b in zip(widths, widths[1:])), widths
    assert widths[-1] > 1.5 * widths[0]
    # the seed-only t interval does not see the problems: its width stays put when they are removed
    acc = cube.run_acc()[0] * 100
    sub_acc = cube.subset_problems(cube.problems[:8]).run_acc()[0] * 100
    t64, t8 = A.t_interval(acc), A.t_interval(sub_acc)
    assert widths[-1] > t8.half_width and widths[0] > t64.half_width


def test_matches_the_t_interval_when_seeds_are_the_only_source_of_variance():
    # 2000 problems evenly spread in difficulty, all k samples of a problem agree (no sample noise):
    # a run with seed s solves exactly the problems easier than its accuracy a_s
    a = np.array([0.20, 0.35, 0.50, 0.30, 0.45])
    P, k = 2000, 4
    u = (np.arange(P) + 0.5) / P
    correct = np.repeat((u[None, :] < a[:, None])[None, :, :, None], k, axis=3)
    cube = cube_from(correct)
    t = A.t_interval(a * 100)
    ci = boot.config_intervals(cube, B=4000, seed=2)
    assert ci["acc"].iloc[0] == pytest.approx(t.mean)
    assert half_width(ci) == pytest.approx(t.half_width, rel=0.06)
    # seeds alone: the same up to Monte Carlo error
    seeds_only = boot.config_intervals(cube, B=4000, seed=2, levels=("seed",))
    assert half_width(seeds_only) == pytest.approx(t.half_width, rel=0.04)
    # many seeds: the percentile interval agrees too
    many = np.random.default_rng(3).uniform(0.2, 0.5, 40)
    cube40 = cube_from(np.repeat((u[None, :400] < many[:, None])[None, :, :, None], 2, axis=3))
    t40 = A.t_interval(cube40.run_acc()[0] * 100)
    pct = boot.config_intervals(cube40, B=4000, seed=4, levels=("seed",), kind="percentile")
    assert half_width(pct) == pytest.approx(t40.half_width, rel=0.08)


def test_paired_difference_uses_the_same_seeds_and_problems():
    rng = np.random.default_rng(5)
    base = varied_cube(rng, S=4, P=40, k=4, seed_sd=1.0)
    # configuration "b" = "a" on every seed and problem, plus the first 4 problems always right
    better = base.copy()
    better[:, :, :4, :] = True
    cube = cube_from(np.concatenate([base, better]), configs=("a", "b"))
    ci = boot.config_intervals(cube, B=1000, seed=0, baseline="a")
    assert ci.loc["b", "d_test"] == "paired bootstrap"
    # the same runs with b's seeds renamed: no longer paired, seeds drawn independently
    G, S, P = cube.correct.shape
    z = np.zeros((1, S, P))
    unpaired = boot.SampleCube(["a", "b"], list(range(2 * S)), cube.problems,
                               np.concatenate([np.concatenate([cube.correct[:1], z], 1),
                                               np.concatenate([z, cube.correct[1:]], 1)]),
                               np.concatenate([np.concatenate([cube.total[:1], z], 1),
                                               np.concatenate([z, cube.total[1:]], 1)]))
    cu = boot.config_intervals(unpaired, B=1000, seed=0, baseline="a")
    assert cu.loc["b", "d_test"] == "unpaired bootstrap"
    assert cu.loc["b", "d_acc"] == pytest.approx(ci.loc["b", "d_acc"])
    assert ci.loc["b", "d_acc_se"] < 0.7 * cu.loc["b", "d_acc_se"]
    # same seed -> same replicates; another seed -> other replicates
    r1 = boot.replicate_means(cube, B=50, seed=7)
    np.testing.assert_array_equal(r1, boot.replicate_means(cube, B=50, seed=7))
    assert not np.array_equal(r1, boot.replicate_means(cube, B=50, seed=8))


def test_one_seed_has_no_interval_and_bad_levels_fail():
    cube = cube_from(varied_cube(np.random.default_rng(6), S=1))
    ci = boot.config_intervals(cube, B=200)
    assert np.isnan(ci["acc_lo"].iloc[0])
    with pytest.raises(ValueError, match="choose from seed, problem, sample"):
        boot.replicate_means(cube, B=10, levels=("seeds",))


def test_crossed_components_split_the_variance():
    rng = np.random.default_rng(8)
    S, P = 6, 400
    parts = []
    for _ in range(300):
        v = rng.normal(0, 2.0, (S, 1)) + rng.normal(0, 3.0, (1, P)) + rng.normal(0, 1.0, (S, P))
        parts.append(boot.crossed_components(v))
    est = pd.DataFrame(parts).mean()
    # truth: 4 / S, 9 / P, 1 / (S P)
    assert est["seed_part"] == pytest.approx(4 / S, rel=0.15)
    assert est["problem_part"] == pytest.approx(9 / P, rel=0.15)
    assert est["residual_part"] == pytest.approx(1 / (S * P), rel=0.05)


def _design_sweep(root, rng, seeds=(0, 1, 2), P=24, k=4):
    difficulty = rng.normal(0, 1.0, P)
    for sd in seeds:
        for ch in (False, True):
            for ds in (False, True):
                sw = {s: False for s in SWITCHES} | {"clip_higher": ch, "dynamic_sampling": ds}
                p = 1 / (1 + np.exp(-(difficulty - 0.3 + 0.5 * ds + rng.normal(0, 0.2))))
                make_switch_run(root / f"ch={int(ch)},ds={int(ds)},seed={sd}", sw, sd, rng.random((P, k)) < p[:, None])


def test_table_and_effects_with_bootstrap(tmp_path):
    _design_sweep(tmp_path / "s", np.random.default_rng(9))
    data = A.load_runs(tmp_path / "s")
    t = A.comparison_table(data)
    tb = A.comparison_table(data, ci="bootstrap", bootstrap={"B": 500})
    # the same point estimates; the samples reproduce the summaries exactly
    pd.testing.assert_series_equal(t["final_acc"], tb["final_acc"])
    assert tb.attrs["bootstrap"]["max_gap_to_summary_pp"] < 1e-9
    assert tb.loc["clip", "d_test"] == "paired bootstrap" and t.loc["clip", "d_test"] == "paired t"
    md = A.table_markdown(tb)
    assert "hierarchical bootstrap" in md and "500 replicates" in md
    from dapo_exp.analysis.effects import fit_effects

    et, eb = fit_effects(data), fit_effects(data, ci="bootstrap", B=500)
    np.testing.assert_allclose(et.table["effect"], eb.table["effect"])
    assert (eb.table["hi"] > eb.table["lo"]).all()
    with pytest.raises(ValueError, match="final accuracy"):
        fit_effects(data, "entropy", ci="bootstrap")


def test_report_writes_the_problem_share(tmp_path):
    from dapo_exp.analysis.report import run_analysis

    _design_sweep(tmp_path / "s", np.random.default_rng(10))
    res = run_analysis(tmp_path / "s", out=tmp_path / "out", ci="bootstrap", bootstrap={"B": 300}, figures=False)
    share = pd.read_csv(tmp_path / "out" / "problem_share.csv")
    assert {"se_all", "se_no_problems", "boot_problem_share", "anova_problem_share"} <= set(share)
    assert (share["se_all"] >= share["se_no_problems"] * 0.9).all()
    assert any(q.startswith("effect: dynamic_sampling") for q in share["quantity"])
    assert "problem sample" in (tmp_path / "out" / "problem_share.md").read_text()
    assert res.effects is not None


def test_bootstrap_needs_the_samples(tmp_path):
    _design_sweep(tmp_path / "s", np.random.default_rng(11), seeds=(0,))
    next((tmp_path / "s").glob("*/eval_samples.jsonl")).unlink()
    with pytest.raises(ValueError, match="eval_samples.jsonl"):
        A.comparison_table(A.load_runs(tmp_path / "s"), ci="bootstrap")


def test_bootstrap_refuses_runs_that_report_another_endpoint(tmp_path):
    """The bootstrap resamples the final evaluation: a sweep reporting the mean of the last
    evaluations (eval.endpoint=last_k_mean) gets a clear refusal, not a column that mixes the two."""
    from dapo_exp.analysis.effects import fit_effects

    _design_sweep(tmp_path / "s", np.random.default_rng(12), seeds=(0, 1))
    data = A.load_runs(tmp_path / "s")
    data.runs["config.eval.endpoint"], data.runs["config.eval.endpoint_k"] = "last_k_mean", 3
    data.runs["endpoint/n_evals"] = 3
    with pytest.raises(ValueError, match="acc last-3 mean .*use --ci t"):
        A.comparison_table(data, ci="bootstrap")
    with pytest.raises(ValueError, match="acc last-3 mean .*use --ci t"):
        fit_effects(data, ci="bootstrap")
    assert A.comparison_table(data).attrs["acc_name"] == "acc last-3 mean"  # the t intervals still work
