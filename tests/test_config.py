"""The config tree: every preset composes, the ladder adds one fix per step, bad configs fail early."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from dapo_exp import objective
from dapo_exp.config import (
    LOSS_AGG_MODES,
    OVERLONG_PUNISHMENT_MODES,
    KL_ESTIMATORS,
    PRESET_SWITCHES,
    ConfigError,
    config_label,
    fix_switches,
    validate,
)
from dapo_exp.hydra_setup import register_resolvers

ROOT = Path(__file__).resolve().parents[1]
CONF = str(ROOT / "conf")
PRESETS = sorted(p.stem for p in (ROOT / "conf" / "fixes").glob("*.yaml"))
LADDER = ["paper_1_grpo", "paper_2_of", "paper_3_clip", "paper_4_sop", "paper_5_tl", "paper_6_dapo"]
register_resolvers()


def make_cfg(*overrides):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose("config", overrides=list(overrides))


def test_the_named_presets_exist():
    expected = {"grpo", "clip", "clip_ds", "full", "full_no_clip", "full_no_ds", "full_no_tl", "full_no_sop", *LADDER}
    assert expected <= set(PRESETS)


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_composes_validates_and_matches_its_switches(preset):
    cfg = make_cfg(f"fixes={preset}")
    validate(cfg)
    assert cfg.preset == preset
    expected = PRESET_SWITCHES.get(preset, PRESET_SWITCHES["grpo"] if preset == "paper_1_grpo" else None)
    assert fix_switches(cfg) == expected
    assert config_label(cfg) == preset


def test_grpo_baseline_has_none_of_the_fixes():
    a = make_cfg("fixes=grpo").algo
    assert a.eps_low == a.eps_high == 0.2
    assert a.loss_agg == "seq-mean-token-mean"
    assert not a.overlong_filtering and a.overlong_punishment == "none"
    assert not a.dynamic_sampling and a.kl_coef == 0.0


def test_full_is_the_released_recipe():
    a = make_cfg("fixes=full").algo
    assert (a.eps_low, a.eps_high) == (0.2, 0.28)
    assert a.loss_agg == "token-mean" and a.dynamic_sampling and a.overlong_punishment == "soft"
    assert not a.overlong_filtering  # the released script does not use it


def _diff(c1, c2):
    d1, d2 = OmegaConf.to_container(c1.algo), OmegaConf.to_container(c2.algo)
    return {k for k in d1 if d1[k] != d2[k]}


@pytest.mark.parametrize("i", range(1, len(LADDER)))
def test_each_ladder_step_adds_exactly_one_fix(i):
    prev, cur = make_cfg(f"fixes={LADDER[i - 1]}"), make_cfg(f"fixes={LADDER[i]}")
    s_prev, s_cur = fix_switches(prev), fix_switches(cur)
    changed = [k for k in s_cur if s_cur[k] != s_prev[k]]
    assert len(changed) == 1 and s_cur[changed[0]] and not s_prev[changed[0]]
    # and in the config values, only that fix's keys changed
    keys = {
        "overlong_filtering": {"overlong_filtering"},
        "clip_higher": {"eps_high"},
        "overlong_punishment": {"overlong_punishment"},
        "token_level_loss": {"loss_agg"},
        "dynamic_sampling": {"dynamic_sampling"},
    }[changed[0]]
    assert _diff(prev, cur) == keys


@pytest.mark.parametrize("loo,off", [("full_no_clip", "clip_higher"), ("full_no_ds", "dynamic_sampling"),
                                     ("full_no_tl", "token_level_loss"), ("full_no_sop", "overlong_punishment")])
def test_leave_one_out_differs_from_full_in_one_fix(loo, off):
    full, cur = fix_switches(make_cfg("fixes=full")), fix_switches(make_cfg(f"fixes={loo}"))
    assert {k for k in full if full[k] != cur[k]} == {off}


def test_command_line_switch_beats_the_preset_and_label_follows_values():
    cfg = make_cfg("fixes=full", "clip_higher=disabled")
    assert cfg.algo.eps_high == 0.2
    assert config_label(cfg) == "full_no_clip"
    cfg = make_cfg("fixes=grpo", "token_level_loss=enabled", "overlong_filtering=enabled")
    assert config_label(cfg) == "tl+of"


def test_full_factorial_is_one_multirun_command():
    out = subprocess.run(
        [sys.executable, "run.py", "-m", "--cfg", "job", "clip_higher=disabled,enabled",
         "dynamic_sampling=disabled,enabled", "token_level_loss=disabled,enabled",
         "overlong_punishment=disabled,soft", "overlong_filtering=disabled,enabled"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "[dry run] 32 jobs" in out.stdout


def test_cfg_job_prints_every_preset_and_the_user_sweep_lists_four_jobs():
    out = subprocess.run([sys.executable, "run.py", "-m", "--cfg", "job", "fixes=grpo,clip,clip_ds,full"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "[dry run] 4 jobs" in out.stdout
    for i, p in enumerate(["grpo", "clip", "clip_ds", "full"]):
        assert f"#{i} : fixes={p}" in out.stdout and f"preset: {p}" in out.stdout
    single = subprocess.run([sys.executable, "run.py", "--cfg", "job", "fixes=paper_4_sop"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert single.returncode == 0 and "preset: paper_4_sop" in single.stdout


def test_name_lists_agree_with_objective():
    assert LOSS_AGG_MODES == objective.LOSS_AGG_MODES
    assert KL_ESTIMATORS == objective.KL_ESTIMATORS
    assert OVERLONG_PUNISHMENT_MODES == objective.OVERLONG_PUNISHMENT_MODES


# --------------------------------------------------------------------------- #
# bad configs                                                                   #
# --------------------------------------------------------------------------- #
def test_misspelt_key_fails_at_compose_time():
    with pytest.raises(Exception) as e:
        make_cfg("algo.eps_hihg=0.3")
    assert "eps_hihg" in str(e.value)


def test_wrong_type_fails_at_compose_time():
    with pytest.raises(Exception) as e:
        make_cfg("algo.eps_high=abc")
    assert "eps_high" in str(e.value)


def test_unknown_preset_fails_listing_choices():
    with pytest.raises(Exception) as e:
        make_cfg("fixes=dapo")
    assert "full" in str(e.value) and "grpo" in str(e.value)


@pytest.mark.parametrize(
    "overrides,field",
    [
        (["algo.eps_low=-0.1"], "algo.eps_low"),
        (["algo.eps_high=-0.01"], "algo.eps_high"),
        (["algo.overlong_cache_len=100"], "algo.overlong_cache_len"),
        (["fixes=full", "rollout.n=1", "train.mini_batch_size=16", "train.micro_batch_size=16"], "rollout.n"),
        (["train.mini_batch_size=48"], "train.mini_batch_size"),
        (["train.mini_batch_size=36", "train.prompts_per_step=9", "rollout.n=4"], "train.mini_batch_size"),
        (["train.micro_batch_size=24"], "train.micro_batch_size"),
        (["algo.loss_agg=token_mean"], "algo.loss_agg"),
        (["algo.ds_signal=score"], "algo.ds_signal"),
        (["algo.dual_clip=0.5"], "algo.dual_clip"),
        (["rollout.top_p=0"], "rollout.top_p"),
        (["algo.kl_estimator=k9"], "algo.kl_estimator"),
    ],
)
def test_bad_values_raise_naming_the_field(overrides, field):
    cfg = make_cfg(*overrides)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        validate(cfg)


def test_bad_config_fails_before_any_compute(tmp_path, monkeypatch):
    """train() validates first: no model is built, no file but nothing is written."""
    import dapo_exp.models as models

    def boom(*a, **k):
        raise AssertionError("model built before the config was checked")

    monkeypatch.setattr(models, "resolve_model_path", boom)
    from dapo_exp.train import train

    cfg = make_cfg("algo.eps_low=-1", f"out_dir={tmp_path}", "logger=none")
    with pytest.raises(ConfigError, match="algo.eps_low"):
        train(cfg)
    assert not any(tmp_path.iterdir())
