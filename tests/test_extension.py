"""Extending dapo-exp from outside the package: a sixth fix and a new advantage estimator,
registered from this file alone, train on the toy and reach the run label and the analysis."""

import json

import pytest
import torch

from dapo_exp import algorithms, fixes, rundir
from dapo_exp.train import train

BONUS = 0.5


@pytest.fixture
def bonus_fix():
    """A toy sixth fix: a constant reward bonus, on when ``algo.ext.const_bonus`` is set."""
    fix = fixes.register_fix(fixes.Fix(
        name="const_bonus", short="bonus", title="Constant bonus", paper="(test)",
        keys=("ext.const_bonus",), is_on=lambda a: bool(a.ext.get("const_bonus", 0)),
        objective=(), metrics=("reward/const_bonus_mean",),
    ))
    algorithms.REWARD_SHAPING.register("const_bonus", algorithms.ShapingTerm(
        metric="reward/const_bonus_mean", enabled=fix.is_on,
        compute=lambda *, lengths, correct, max_len, algo: torch.full_like(lengths, float(algo.ext.const_bonus)),
    ))
    yield fix
    fixes.unregister_fix("const_bonus")
    algorithms.REWARD_SHAPING.pop("const_bonus")


@pytest.fixture
def rank_estimator():
    """A toy advantage estimator: the centred rank of each reward in its group."""
    calls = []

    def rank(rewards, *, algo):
        calls.append(tuple(rewards.shape))
        ranks = rewards.argsort(dim=1).argsort(dim=1).float()
        return ranks - ranks.mean(dim=1, keepdim=True)

    algorithms.ADVANTAGE_ESTIMATORS.register("rank", rank)
    yield calls
    algorithms.ADVANTAGE_ESTIMATORS.pop("rank")


def _rows(run_dir):
    return [json.loads(x) for x in (run_dir / rundir.METRICS).read_text().splitlines()]


@pytest.mark.slow
def test_a_sixth_fix_from_outside_the_package(tmp_path, small_cfg, bonus_fix):
    from dapo_exp import analysis as A

    s = train(small_cfg(tmp_path / "bonus", "fixes=grpo", f"+algo.ext.const_bonus={BONUS}"))
    assert s["status"] == "finished" and s["label"] == "bonus"
    assert s["switches"] == {**{k: False for k in fixes.FIXES if k != "const_bonus"}, "const_bonus": True}
    for r in (r for r in _rows(tmp_path / "bonus") if "reward/mean" in r):
        assert r["reward/const_bonus_mean"] == BONUS
        # the bonus is added to the +1/-1 correctness reward of every response
        assert r["reward/mean"] == pytest.approx(2 * r["reward/acc_mean"] - 1 + BONUS, abs=1e-6)
    train(small_cfg(tmp_path / "grpo", "fixes=grpo"))
    data = A.load_runs(tmp_path)
    assert "const_bonus" in data.runs.columns and "const_bonus" in A.SWITCHES
    assert dict(zip(data.runs["label"], data.runs["const_bonus"])) == {"bonus": True, "grpo": False}
    table = A.comparison_table(data)
    assert set(table.index) == {"grpo", "bonus"}


@pytest.mark.slow
def test_an_advantage_estimator_from_outside_the_package(tmp_path, small_cfg, rank_estimator):
    s = train(small_cfg(tmp_path, "fixes=grpo", "algo.adv_estimator=rank"))
    assert s["status"] == "finished" and s["label"] == "grpo"  # an estimator is not a fix
    assert rank_estimator == [(4, 4), (4, 4)]  # one call per step: 4 groups of 4
    assert all(r["actor/n_updates"] >= 1 for r in _rows(tmp_path) if "reward/mean" in r)


def test_unregistered_names_fail_listing_the_choices(tmp_path, small_cfg):
    from dapo_exp.config import ConfigError

    with pytest.raises(ConfigError, match="algo.adv_estimator='rank' is not valid; choose one of: grpo"):
        train(small_cfg(tmp_path, "algo.adv_estimator=rank"))
    with pytest.raises(ConfigError, match="algo.ext.const_bonus is read by no registered fix"):
        train(small_cfg(tmp_path, f"+algo.ext.const_bonus={BONUS}"))
    assert not (tmp_path / rundir.SUMMARY).exists()  # refused before the run directory was touched
