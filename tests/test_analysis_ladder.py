"""Which fix mattered along a ladder: each rung against the one below; irregular sets: Holm-adjusted pairs."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from fixtures_runs import make_run, make_sweep, make_switch_run
from scipy import stats

from dapo_exp import analysis as A
from dapo_exp import rundir
from dapo_exp.analysis import verdicts
from dapo_exp.analysis.design import SWITCHES

# grpo < clip < clip_ds < full: the README's headline sweep, three seeds, distinct per-seed spreads
LADDER = ["grpo", "clip", "clip_ds", "full"]
ACC = {
    "grpo": (0.30, 0.34, 0.31),
    "clip": (0.36, 0.37, 0.35),
    "clip_ds": (0.38, 0.43, 0.39),
    "full": (0.45, 0.44, 0.50),
}
SPEC = [(p, s, ACC[p][s], "finished") for p in LADDER for s in range(3)]


@pytest.fixture(scope="module")
def ladder_sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("multirun") / "ladder"
    runs = make_sweep(root, SPEC)
    return root, runs


def _per_seed(runs, preset):
    """The final accuracy (pp) each run of ``preset`` wrote, by seed."""
    return pd.Series({r["config"]["seed"]: 100 * r["summary"]["final"][rundir.EVAL_ACC]
                      for r in runs if r["config"]["preset"] == preset})


def test_a_ladder_gives_each_rung_against_the_one_below(ladder_sweep):
    root, runs = ladder_sweep
    data = A.load_runs(root)
    assert A.ladder(data) == LADDER
    assert A.contrast_kind(data) == "ladder"
    rungs = A.rung_contrasts(data)
    assert list(rungs["rung"]) == ["clip", "clip_ds", "full"]
    assert list(rungs["vs"]) == ["grpo", "clip", "clip_ds"]
    assert list(rungs["added"]) == ["Clip-Higher", "Dynamic Sampling",
                                    "Token-level Policy Gradient Loss + Soft Overlong Punishment"]
    assert list(rungs["added_short"]) == ["clip", "ds", "tl+sop"]
    for _, r in rungs.iterrows():
        d = (_per_seed(runs, r["rung"]) - _per_seed(runs, r["vs"])).to_numpy()
        n = len(d)
        half = stats.t.ppf(0.975, n - 1) * d.std(ddof=1) / math.sqrt(n)
        assert r["test"] == "paired t" and r["n"] == n == 3
        assert r["diff"] == pytest.approx(d.mean())
        assert r["lo"] == pytest.approx(d.mean() - half) and r["hi"] == pytest.approx(d.mean() + half)
        assert r["mde"] == pytest.approx(verdicts.mde_paired(d.std(ddof=1), n))
        assert r["p"] == pytest.approx(stats.ttest_rel(_per_seed(runs, r["rung"]), _per_seed(runs, r["vs"])).pvalue)
        shown = not (r["lo"] <= 0 <= r["hi"])
        assert r["verdict"] == (verdicts.DIFFERENCE if shown else verdicts.NO_DIFFERENCE)


def test_the_report_prints_the_rungs_before_the_table_and_writes_them(ladder_sweep, tmp_path):
    root, _ = ladder_sweep
    result = A.run_analysis(root, out=tmp_path / "analysis", figures=False)
    text = result.text()
    assert "Rungs (each against the one below" in text
    assert text.index("Rungs (each against the one below") < text.index("Comparison table")
    assert "clip vs grpo (+Clip-Higher): Δ " in text
    assert "full vs clip_ds (+Token-level Policy Gradient Loss + Soft Overlong Punishment)" in text
    assert max(len(ln) for ln in text.splitlines() if str(tmp_path) not in ln) <= 120
    # no single switch's effect is estimable from a ladder: one sentence instead of a page of aliasing
    assert "Effects of single switches: none can be estimated from these configurations" in text
    assert "the rung contrasts above are what" in text and "aliased with" not in text
    md = (tmp_path / "analysis" / "contrasts.md").read_text()
    assert md.startswith("**Rungs") and "| clip_ds" in md
    csv = pd.read_csv(tmp_path / "analysis" / "contrasts.csv")
    assert list(csv["rung"]) == ["clip", "clip_ds", "full"]
    assert tmp_path / "analysis" / "contrasts.md" in result.files
    # the rest of the report as before: the table against the baseline
    assert result.table.attrs["baseline"] == "grpo"


def test_a_two_level_design_keeps_its_effects_and_has_no_rung_block(tmp_path):
    rng = np.random.default_rng(0)
    root = tmp_path / "multirun" / "two_by_two"
    for seed in (0, 1, 2):
        for ch in (False, True):
            for ds in (False, True):
                sw = {s: False for s in SWITCHES} | {"clip_higher": ch, "dynamic_sampling": ds}
                make_switch_run(root / f"ch={int(ch)},ds={int(ds)},seed={seed}", sw, seed,
                                rng.random((20, 4)) < 0.3 + 0.1 * ds)
    data = A.load_runs(root)
    assert A.ladder(data) is None
    assert A.contrast_kind(data) == "two-level"
    assert A.rung_contrasts(data).empty and A.configuration_contrasts(data).empty
    result = A.run_analysis(root, out=tmp_path / "analysis", figures=False)
    assert result.effects is not None
    terms = set(result.effects.table["term"])
    assert {"clip_higher", "dynamic_sampling"} <= terms
    assert "Rungs" not in result.text() and "contrasts" not in result.text()
    assert not (tmp_path / "analysis" / "contrasts.md").exists()


def _holm(p):
    """Holm's step-down adjustment, by hand."""
    p = np.asarray(p, dtype=float)
    m = len(p)
    order = np.argsort(p)
    adj = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adj[i] = running
    return adj


IRREGULAR = {  # three configurations, none of whose switch sets contains another's
    "full_no_clip": (0.40, 0.45, 0.42, 0.47),
    "full_no_ds": (0.44, 0.46, 0.47, 0.52),
    "full_no_tl": (0.30, 0.41, 0.36, 0.40),
}


def test_an_irregular_set_gives_all_pairs_with_holm_adjusted_p(tmp_path):
    root = tmp_path / "multirun" / "irregular"
    runs = make_sweep(root, [(p, s, a[s], "finished") for p, a in IRREGULAR.items() for s in range(4)])
    data = A.load_runs(root)
    assert A.ladder(data) is None and A.contrast_kind(data) == "irregular"
    assert A.rung_contrasts(data).empty
    pairs = A.pairwise_contrasts(data)
    assert len(pairs) == 3
    assert {(r["config"], r["vs"]) for _, r in pairs.iterrows()} == {
        ("full_no_ds", "full_no_clip"), ("full_no_tl", "full_no_clip"), ("full_no_tl", "full_no_ds")}
    raw = [stats.ttest_rel(_per_seed(runs, r["config"]), _per_seed(runs, r["vs"])).pvalue for _, r in pairs.iterrows()]
    assert list(pairs["p"]) == pytest.approx(raw)
    assert list(pairs["p_holm"]) == pytest.approx(list(_holm(raw)))
    for _, r in pairs.iterrows():
        d = (_per_seed(runs, r["config"]) - _per_seed(runs, r["vs"])).to_numpy()
        assert r["diff"] == pytest.approx(d.mean()) and r["test"] == "paired t" and r["n"] == 4
        assert r["verdict"] == (verdicts.DIFFERENCE if r["p_holm"] < 0.05 else verdicts.NO_DIFFERENCE)
    first = pairs.set_index(["config", "vs"]).loc[("full_no_ds", "full_no_clip")]
    assert first["added"] == "Clip-Higher" and first["removed"] == "Dynamic Sampling"
    assert A.configuration_contrasts(data).equals(pairs)
    result = A.run_analysis(root, out=tmp_path / "analysis", figures=False)
    csv = pd.read_csv(tmp_path / "analysis" / "contrasts.csv")
    assert list(csv["p_holm"]) == pytest.approx(list(pairs["p_holm"]))
    assert "Holm" in (tmp_path / "analysis" / "contrasts.md").read_text()
    assert "Rungs" not in result.text()


def test_same_switches_with_other_keys_are_not_a_ladder(tmp_path):
    root = tmp_path / "multirun" / "steps"
    for s in (0, 1):
        make_run(root / f"fixes=grpo,seed={s}", "grpo", s, 0.3 + 0.01 * s)
        make_run(root / f"fixes=clip,seed={s}", "clip", s, 0.35 + 0.02 * s)
        make_run(root / f"fixes=clip,steps=4,seed={s}", "clip", s, 0.33 + 0.03 * s, steps=4,
                 config_overrides={"train.steps": 4})
    data = A.load_runs(root)
    assert len(set(data.included["label"])) == 3  # the loader splits clip by train.steps
    assert A.ladder(data) is None
    assert A.contrast_kind(data) == "irregular"
    assert len(A.pairwise_contrasts(data)) == 3
