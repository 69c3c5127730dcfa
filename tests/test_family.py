"""The GRPO family after DAPO as switches: each trains two CPU steps with a finite loss and logs
its metrics, is labelled and tagged by its short name, and bad combinations fail before compute."""

import json
import math

import pytest

from dapo_exp import fixes, rundir
from dapo_exp.config import ConfigError
from dapo_exp.train import preflight, train

FAMILY_SWITCHES = ["dr_grpo_adv", "dr_grpo_norm", "gspo", "cispo", "gmpo", "clip_cov", "kl_cov"]


@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILY_SWITCHES)
def test_each_family_fix_trains_two_steps_and_logs_its_metrics(tmp_path, small_cfg, name):
    fix = fixes.FIXES[name]
    s = train(small_cfg(tmp_path, "fixes=grpo", f"{name}=enabled"))
    assert s["status"] == "finished" and s["label"] in (fix.short, name)  # its preset's name where one matches
    assert s["switches"] == {k: k == name for k in fixes.FIXES}
    rows = [json.loads(x) for x in (tmp_path / rundir.METRICS).read_text().splitlines()]
    trained = [r for r in rows if "actor/pg_loss" in r]
    assert len(trained) == 2
    for r in trained:
        assert math.isfinite(r["actor/pg_loss"]) and math.isfinite(r["actor/grad_norm"])
        assert all(m in r for m in fix.metrics), [m for m in fix.metrics if m not in r]


@pytest.mark.slow
def test_a_family_fix_changes_the_update(tmp_path, small_cfg):
    """Same seed, same samples at step 1: GSPO's surrogate gives another loss than PPO's clip."""
    base = train(small_cfg(tmp_path / "grpo", "fixes=grpo", "train.steps=1"))
    gspo = train(small_cfg(tmp_path / "gspo", "fixes=gspo", "train.steps=1"))
    row = {k: [json.loads(x) for x in (tmp_path / k / rundir.METRICS).read_text().splitlines()
               if "actor/pg_loss" in x][0] for k in ("grpo", "gspo")}
    assert row["grpo"]["reward/mean"] == row["gspo"]["reward/mean"]  # same samples
    assert row["grpo"]["actor/grad_norm"] != row["gspo"]["actor/grad_norm"]
    assert base["label"] == "grpo" and gspo["label"] == "gspo"


@pytest.mark.parametrize("a,b", [("gspo", "cispo"), ("gmpo", "kl_cov"), ("clip_cov", "gspo")])
def test_two_surrogates_fail_before_compute_naming_both(small_cfg, tmp_path, a, b):
    with pytest.raises(ConfigError, match=rf"fixes ({a} and {b}|{b} and {a}) cannot be combined \(both fill the "
                                          "surrogate slot\\)"):
        preflight(small_cfg(tmp_path, "fixes=grpo", f"{a}=enabled", f"{b}=enabled"))


@pytest.mark.parametrize("other", ["gspo", "cispo", "gmpo", "kl_cov"])
def test_clip_higher_excludes_the_surrogates_that_ignore_its_range(small_cfg, tmp_path, other):
    with pytest.raises(ConfigError, match=rf"clip_higher and {other} cannot be combined \(they exclude each other\)"):
        preflight(small_cfg(tmp_path, "fixes=grpo", "clip_higher=enabled", f"{other}=enabled"))


def test_what_combines_composes(small_cfg, tmp_path):
    """Clip-Higher's range applies to Clip-Cov's clip; Dr. GRPO's advantage goes with any surrogate;
    its normaliser excludes the Token-level Loss (both are normalisers)."""
    preflight(small_cfg(tmp_path, "fixes=grpo", "clip_higher=enabled", "clip_cov=enabled"))
    preflight(small_cfg(tmp_path, "fixes=gspo", "dr_grpo_adv=enabled"))
    with pytest.raises(ConfigError, match="token_level_loss and dr_grpo_norm cannot be combined"):
        preflight(small_cfg(tmp_path, "fixes=grpo", "token_level_loss=enabled", "dr_grpo_norm=enabled"))


@pytest.mark.parametrize("override,key", [("algo.gspo_form=tokens", "algo.gspo_form"),
                                          ("algo.cispo_eps_low=1.5", "algo.cispo_eps_low"),
                                          ("algo.gmpo_eps_low=-0.1", "algo.gmpo_eps_low"),
                                          ("algo.clip_cov_lb=6", "algo.clip_cov_ratio / clip_cov_lb"),
                                          ("algo.kl_cov_coef=-1", "algo.kl_cov_ratio / kl_cov_coef")])
def test_bad_family_values_name_the_key(small_cfg, tmp_path, override, key):
    with pytest.raises(ConfigError, match=key):
        preflight(small_cfg(tmp_path, override))


def test_presets_of_the_family_are_their_switches():
    from dapo_exp.hydra_setup import preset_switches

    expect = {"dr_grpo": {"dr_grpo_adv", "dr_grpo_norm"}, "gspo": {"gspo"}, "cispo": {"cispo"}, "gmpo": {"gmpo"},
              "clip_cov": {"clip_cov"}, "kl_cov": {"kl_cov"}}
    assert set(fixes.FAMILY) == set(expect)
    for preset, on in expect.items():
        assert {k for k, v in preset_switches(preset).items() if v} == on


def test_a_run_recorded_before_a_fix_existed_has_it_off():
    """The analysis reads old runs: an algo config without a fix's keys reads as that fix off."""
    from omegaconf import OmegaConf

    old = OmegaConf.create({"eps_low": 0.2, "eps_high": 0.28, "loss_agg": "token-mean", "dynamic_sampling": True,
                            "overlong_punishment": "soft", "overlong_cache_len": 16, "overlong_factor": 1.0,
                            "overlong_max_len": None, "overlong_filtering": False, "ds_signal": "acc",
                            "ds_max_rounds": 10, "ds_on_cap": "error", "ds_surplus": "discard", "ds_oversample": 1.0})
    on = fixes.switches(old)
    assert [k for k, v in on.items() if v] == ["clip_higher", "dynamic_sampling", "token_level_loss",
                                               "overlong_punishment"]
