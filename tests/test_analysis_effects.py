"""Effects of the switches (dapo_exp.analysis.effects) and two-level designs (dapo_exp.analysis.design).

The coverage tests draw per-seed final accuracies from chosen main effects, one two-way
interaction, a seed block and noise, 200 times, and check that the 95% CIs cover the truth at
the stated rate, for the full factorial and for the 2^(5-1) half fraction.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from fixtures_runs import make_switch_run

from dapo_exp.analysis import design as D
from dapo_exp.analysis.design import SWITCHES
from dapo_exp.analysis.effects import effects_markdown, fit_effects, holm, write_effects, write_forest
from dapo_exp.analysis.runs import load_runs

# the truth of the synthetic sweeps (effects in percentage points: mean change off -> on)
MAIN = {"clip_higher": 4.0, "dynamic_sampling": 6.0, "token_level_loss": 0.0, "overlong_punishment": -2.0,
        "overlong_filtering": 1.0}
INTERACTION = ("clip_higher", "dynamic_sampling", 3.0)
TRUTH = {**MAIN, D.term_name(INTERACTION[:2]): INTERACTION[2]}


def synthetic_runs(design: pd.DataFrame, seeds, rng, noise_sd=2.0, block_sd=3.0) -> pd.DataFrame:
    """A runs frame (the columns fit_effects reads): y = 40 + seed block + effects / 2 * x + noise (pp)."""
    x = D.coded(design[list(SWITCHES)])  # (configs, 5) in -1 / +1
    mean = 40 + x @ np.array([MAIN[s] / 2 for s in SWITCHES])
    a, b = SWITCHES.index(INTERACTION[0]), SWITCHES.index(INTERACTION[1])
    mean = mean + INTERACTION[2] / 2 * x[:, a] * x[:, b]
    frames = []
    for s in seeds:
        y = mean + rng.normal(0, block_sd) + rng.normal(0, noise_sd, len(mean))
        frames.append(design.assign(seed=s, included=True, **{"final/eval/acc_avg": y / 100}))
    return pd.concat(frames, ignore_index=True)


def coverage(design: pd.DataFrame, draws: int = 200, seeds=(0, 1)) -> pd.Series:
    rng = np.random.default_rng(20261122)
    hits = []
    for _ in range(draws):
        t = fit_effects(synthetic_runs(design, seeds, rng)).table.set_index("term")
        assert (t["status"] == "estimated").all()
        truth = pd.Series({term: TRUTH.get(term, 0.0) for term in t.index})
        hits.append((t["lo"] <= truth) & (truth <= t["hi"]))
    return pd.DataFrame(hits).mean()


@pytest.mark.parametrize("name", ["full", "fractional"])
def test_effect_cis_cover_the_truth(name):
    design = D.make_design(name)
    cov = coverage(design)
    assert len(cov) == 15  # 5 main effects + 10 two-way interactions, all identified
    # each effect's 95% CI covers its true value in 90-99% of 200 draws; pooled, close to 95%
    assert cov.between(0.90, 0.99).all(), cov.to_dict()
    assert 0.93 <= cov.mean() <= 0.97


def test_point_estimates_recover_the_effects():
    rng = np.random.default_rng(1)
    # many seeds: the estimates sit close to the truth, including the interaction and the zero effects
    t = fit_effects(synthetic_runs(D.fractional_design(), range(24), rng)).table.set_index("term")
    truth = pd.Series({term: TRUTH.get(term, 0.0) for term in t.index})
    assert np.abs(t["effect"] - truth).max() < 0.8
    assert t.loc[D.term_name(INTERACTION[:2]), "p_holm"] < 1e-6
    assert (t.drop(index=[*[k for k, v in TRUTH.items() if v]])["p_holm"] > 0.01).all()


def test_a_design_that_cannot_identify_an_interaction_says_so():
    from pyDOE3 import fracfact

    # 2^(5-2), resolution III (d = ab, e = ac): clip_higher x dynamic_sampling has the column of overlong_punishment
    design = pd.DataFrame(fracfact("a b c ab ac") > 0, columns=list(SWITCHES))
    runs = synthetic_runs(design, (0, 1, 2), np.random.default_rng(2))
    eff = fit_effects(runs)
    t = eff.table.set_index("term")
    ab = t.loc["clip_higher × dynamic_sampling"]
    assert ab["status"] == "aliased with overlong_punishment" and np.isnan(ab["effect"]) and np.isnan(ab["lo"])
    assert (t["status"] != "estimated").all()  # with all 2-way terms nothing is identified
    md = effects_markdown(eff)
    assert re.search(r"\| clip_higher × dynamic_sampling +\| aliased with overlong_punishment +\|", md)
    assert "2^(5-2) fractional factorial, resolution III" in md and "I = abd = ace = bcde" in md
    # main effects only: identified, each carrying its two-way aliases (assumed negligible)
    m = fit_effects(runs, model="main").table.set_index("term")
    assert (m["status"] == "estimated").all() and m["effect"].notna().all()
    assert m.loc["overlong_punishment", "aliases"].startswith("ab = ")


def test_confounded_switches_and_the_seed():
    # two switches always on together (like token-level loss and the soft punishment in the four presets)
    from dapo_exp.hydra_setup import preset_switches

    states = pd.DataFrame([preset_switches(p) for p in ("grpo", "clip", "clip_ds", "full")])
    runs = pd.concat([states.assign(seed=s, included=True, **{"final/eval/acc_avg": 0.3 + 0.01 * s})
                      for s in (0, 1, 2)], ignore_index=True)
    t = fit_effects(runs, model="main").table.set_index("term")
    assert "overlong_filtering" not in t.index  # not varied: not a term
    assert t.loc["token_level_loss", "status"] == "aliased with overlong_punishment"
    assert t.loc["overlong_punishment", "status"] == "aliased with token_level_loss"
    assert t.loc["clip_higher", "status"] == "estimated"
    # a switch varied only between seeds is confounded with the seed block
    runs = pd.DataFrame({**{s: [False] * 4 for s in SWITCHES}, "seed": [0, 0, 1, 1], "included": True,
                         "final/eval/acc_avg": [0.3, 0.31, 0.4, 0.41]})
    runs["clip_higher"] = [False, False, True, True]
    t = fit_effects(runs).table.set_index("term")
    assert t.loc["clip_higher", "status"] == "aliased with the seed"


def test_design_recognition_and_alias_structure_match_pydoe3():
    from pyDOE3 import fracfact_aliasing

    half = D.fractional_design()
    assert len(half) == 16 and len(half.drop_duplicates()) == 16
    info = D.describe_design(pd.concat([half, half]))  # two seeds: duplicates ignored
    assert info.name == "2^(5-1) fractional factorial, resolution V"
    assert info.defining_words == [("abcde", 1)] and info.resolution == 5
    assert "main effects aliased with four-way interactions; two-way interactions aliased with three-way" in info.text()
    ours = {" = ".join(w for w, _ in g) for g in info.alias_groups}
    theirs = set(fracfact_aliasing(D.coded(half))[0]) - {"abcde"}
    assert ours == theirs
    full = D.describe_design(D.full_factorial())
    assert full.name == "2^5 full factorial" and full.defining_words == []
    assert all(len(g) == 1 for g in full.alias_groups)
    # a half fraction with a run missing is no longer regular: partial aliasing is reported
    broken = D.describe_design(half.iloc[1:])
    assert broken.kind == "irregular design" and broken.partial


def test_job_overrides_name_real_options():
    from pathlib import Path

    conf = Path(__file__).resolve().parents[1] / "conf"
    lines = D.job_overrides(D.fractional_design())
    assert len(lines) == 16 and len(set(lines)) == 16
    for line in lines:
        for item in line.split():
            group, option = item.split("=")
            assert group in SWITCHES and (conf / group / f"{option}.yaml").is_file(), item


def test_holm_equals_statsmodels():
    from statsmodels.stats.multitest import multipletests

    p = np.array([0.01, 0.04, 0.03, 0.2, 0.001, 0.5, 0.04])
    np.testing.assert_allclose(holm(p), multipletests(p, method="holm")[1])


def test_effects_from_run_directories_and_files(tmp_path):
    """From run dirs of a half fraction: the table files, the forest plot, and agreement with the runs."""
    rng = np.random.default_rng(3)
    root = tmp_path / "multirun" / "fractional"
    for seed in (0, 1):
        for _, r in D.fractional_design().iterrows():
            sw = {s: bool(r[s]) for s in SWITCHES}
            p = 0.3 + 0.1 * sw["dynamic_sampling"]
            make_switch_run(root / f"{D.word_name([s for s in SWITCHES if sw[s]]) or 'none'},seed={seed}", sw, seed,
                            rng.random((20, 4)) < p)
    data = load_runs(root)
    eff = fit_effects(data)
    assert eff.design.name.startswith("2^(5-1)") and eff.n_runs == 32 and eff.df_resid == 15
    paths = write_effects(eff, tmp_path / "out")
    md = paths["md"].read_text()
    assert md.startswith("**Warning: n = 2 seed(s) (< 3).** With so few seeds the intervals rest on")
    assert "Holm" in md and "I = abcde" in md and re.search(r"\| dynamic_sampling +\| \+", md)
    csv = pd.read_csv(paths["csv"])
    assert list(csv["term"][:5]) == list(SWITCHES) and {"effect", "lo", "hi", "p", "p_holm", "status"} <= set(csv)
    assert r"\begin{tabular}" in paths["tex"].read_text()
    figs = write_forest(eff, tmp_path / "out" / "figures")
    assert all(f.stat().st_size > 5000 for f in figs)
    # the main effect is the difference of the means of the runs with the switch on and off
    runs = data.included
    y = runs["final/eval/acc_avg"] * 100
    diff = y[runs["dynamic_sampling"]].mean() - y[~runs["dynamic_sampling"]].mean()
    assert eff.table.set_index("term").loc["dynamic_sampling", "effect"] == pytest.approx(diff)
