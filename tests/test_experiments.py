"""Experiment, model and task presets: the paper's 32B values, and every experiment x fixes preset validates."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir

from dapo_exp.config import validate
from dapo_exp.fixes import switches as fix_switches
from dapo_exp.hydra_setup import preset_switches, register_resolvers
from dapo_exp.tasks import check_task_sources

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
FIXES = sorted(p.stem for p in (CONF / "fixes").glob("*.yaml"))
MODELS = sorted(p.stem for p in (CONF / "model").glob("qwen*.yaml"))
TASKS = sorted(p.stem for p in (CONF / "task").glob("*.yaml"))
# keys that belong to the fix switches (conf/<switch>/*.yaml): an experiment must not set them
SWITCH_KEYS = {"eps_low", "eps_high", "loss_agg", "dynamic_sampling", "overlong_punishment", "overlong_factor",
               "overlong_filtering"}


@pytest.fixture(scope="module")
def composer():
    register_resolvers()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        yield lambda *overrides: compose("config", overrides=list(overrides))


def test_presets_exist():
    assert {"dapo_32b_paper", "qwen1.5b_dapo_math", "qwen0.5b_gsm8k"} <= set(EXPERIMENTS)
    assert {"qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "qwen2.5-32b", "qwen2.5-math-1.5b",
            "qwen2.5-math-7b"} <= set(MODELS)
    assert {"arith", "dapo_math", "gsm8k", "math500"} <= set(TASKS)


def test_dapo_32b_paper_matches_the_reference_table(composer):
    """`python run.py experiment=dapo_32b_paper --cfg job`, value by value (fixes=full is the default)."""
    c = composer("experiment=dapo_32b_paper")
    validate(c)
    # model and data
    assert c.model.path == "Qwen/Qwen2.5-32B" and c.model.name == "hf"
    assert c.task.name == "dapo_math"
    assert c.task.train_source == "BytedTsinghua-SIA/DAPO-Math-17k"
    assert c.task.eval_source == "aime24" and c.task.eval_limit is None
    assert c.task.verifier == "math_dapo"
    # optimizer: AdamW lr 1e-6 constant, warm-up 20 (paper), weight decay 0.1, grad clip 1.0
    assert c.optim.lr == 1e-6
    assert c.optim.warmup_steps == 20
    assert c.optim.weight_decay == 0.1
    assert c.optim.grad_clip == 1.0
    # batch: 512 prompts x 16 responses, mini-batch 512 responses = 16 updates per step, 1 epoch
    assert c.train.prompts_per_step == 512
    assert c.rollout.n == 16
    assert c.train.mini_batch_size == 512
    assert c.train.prompts_per_step * c.rollout.n // c.train.mini_batch_size == 16
    assert c.train.ppo_epochs == 1
    # lengths: L_max 20480 = 16384 + L_cache 4096; max prompt 2048
    assert c.rollout.max_response_len == 20480
    assert c.algo.overlong_cache_len == 4096
    assert c.algo.overlong_max_len is None  # L_max is the generation cap
    assert c.rollout.max_response_len - c.algo.overlong_cache_len == 16384
    assert c.task.max_prompt_len == 2048
    # clip: dual clip 10 (released script); no KL
    assert c.algo.dual_clip == 10
    assert c.algo.kl_coef == 0.0
    # dynamic sampling: 3x over-sampling, at most 10 rounds, filter on accuracy
    assert c.algo.ds_oversample == 3
    assert c.algo.ds_max_rounds == 10
    assert c.algo.ds_signal == "acc"
    # sampling: training 1.0 / 1.0; evaluation 1.0 / 0.7, avg@32 on AIME 2024
    assert (c.rollout.temperature, c.rollout.top_p) == (1.0, 1.0)
    assert (c.eval.temperature, c.eval.top_p) == (1.0, 0.7)
    assert c.eval.k == 32
    # the fixes come from fixes=full: clip 0.2 / 0.28, token-mean, dynamic sampling, soft punishment x1.0
    assert (c.algo.eps_low, c.algo.eps_high) == (0.2, 0.28)
    assert c.algo.loss_agg == "token-mean"
    assert c.algo.dynamic_sampling is True
    assert (c.algo.overlong_punishment, c.algo.overlong_factor) == ("soft", 1.0)
    assert c.algo.overlong_filtering is False
    assert c.preset == "full"
    # and the paper's naive GRPO row at the same scale has none of them
    g = composer("experiment=dapo_32b_paper", "fixes=paper_1_grpo")
    assert (g.algo.eps_low, g.algo.eps_high, g.algo.loss_agg) == (0.2, 0.2, "seq-mean-token-mean")
    assert not g.algo.dynamic_sampling and g.algo.overlong_punishment == "none" and not g.algo.overlong_filtering
    assert g.optim.lr == 1e-6 and g.rollout.max_response_len == 20480


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_sets_no_fix_switch(experiment):
    raw = yaml.safe_load((CONF / "experiment" / f"{experiment}.yaml").read_text())
    assert not SWITCH_KEYS & set(raw.get("algo", {})), "fix switches come from fixes=, not from experiments"
    assert "preset" not in raw
    text = (CONF / "experiment" / f"{experiment}.yaml").read_text()
    assert text.startswith("# @package _global_")
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    if experiment.startswith("toy_"):  # a CPU testbed regime: what it builds, what the paper predicts
        assert "regime" in header and "predict" in header and "python run.py" in header
    elif experiment.startswith("smollm2_"):  # a real model on a CPU: its measured cost, the key the launch line reads
        assert "python run.py" in header and "cpu_s_per_step" in header
        raw_notes = yaml.safe_load(text).get("notes", {})
        assert raw_notes.get("cpu_s_per_step", 0) > 0 and "measured" in text.split("cpu_s_per_step:")[0].lower()
    elif experiment != "dapo_32b_paper":
        assert "ESTIMATE" in header and "GPU-hours" in header and "H100" in header


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_with_every_fixes_preset(composer, experiment):
    for fixes in FIXES:
        cfg = composer(f"experiment={experiment}", f"fixes={fixes}")
        validate(cfg)
        check_task_sources(cfg.task)
        # an experiment preset sets scale, never a switch
        assert fix_switches(cfg.algo) == preset_switches(fixes), (experiment, fixes)
        assert cfg.preset == fixes
        assert cfg.algo.eps_low == 0.2 and cfg.algo.eps_high in (0.2, 0.28)
        assert cfg.algo.loss_agg in ("seq-mean-token-mean", "token-mean")


@pytest.mark.parametrize("model", MODELS)
def test_model_presets(composer, model):
    raw = yaml.safe_load((CONF / "model" / f"{model}.yaml").read_text())
    assert raw["name"] == "hf" and raw["path"].startswith("Qwen/Qwen2.5-") and raw["dtype"] == "bfloat16"
    cfg = composer(f"model={model}")
    validate(cfg)


def test_the_packaged_model_preset(composer):
    raw = yaml.safe_load((CONF / "model" / "smollm2_135m.yaml").read_text())
    from dapo_exp.packaged_models import PACKAGED_MODELS

    assert raw["path"] in PACKAGED_MODELS and raw["dtype"] == "float32" and raw["wheel"] is None
    text = (CONF / "model" / "smollm2_135m.yaml").read_text().splitlines()
    for i, line in enumerate(text):  # a comment above every field
        if line and not line.startswith("#"):
            assert text[i - 1].startswith("#"), f"conf/model/smollm2_135m.yaml: no comment above {line!r}"
    validate(composer("model=smollm2_135m"))


@pytest.mark.parametrize("task", ["dapo_math", "gsm8k", "math500", "chat_arith"])
def test_task_presets(composer, task):
    cfg = composer(f"task={task}")
    validate(cfg)
    check_task_sources(cfg.task)
    assert cfg.task.name == task
    text = (CONF / "task" / f"{task}.yaml").read_text().splitlines()
    assert text[0] == "# @package task"
    for i, line in enumerate(text):  # a comment above every field
        if line and not line.startswith("#"):
            assert text[i - 1].startswith("#"), f"conf/task/{task}.yaml: no comment above {line!r}"


def test_the_default_regime_is_what_verdict_cost_measured(composer):
    """The toy's defaults are the verdict_cost benchmark's batch4x setting, whose figures the launch line and
    the docs quote; experiment=toy_fast is its fast setting (the default until 2026-11-25) with the
    last-3 mean declared as the endpoint: nothing else differs."""
    from omegaconf import OmegaConf

    from dapo_exp.benchmarks.verdict_cost import settings

    def leaves(*overrides):
        def walk(d, prefix=""):
            for k, v in d.items():
                yield from walk(v, f"{prefix}{k}.") if isinstance(v, dict) and v else [(f"{prefix}{k}", v)]
        return dict(walk(OmegaConf.to_container(composer("fixes=grpo", *overrides), resolve=True)))

    def differ(a, b):
        return {k: (a.get(k), b.get(k)) for k in set(a) | set(b) if a.get(k) != b.get(k)}

    measured = settings(quick=False, final_problems=256, final_samples=8)
    default = leaves()
    assert differ(default, leaves(*measured["batch4x"])) == {}
    assert default["train.prompts_per_step"] == 64 and default["eval.final_samples"] == 8
    assert default["eval.endpoint"] == "final"
    fast = leaves("experiment=toy_fast")
    assert differ(fast, leaves(*measured["fast"])) == {"eval.endpoint": ("last_k_mean", "final")}
    assert fast["train.prompts_per_step"] == 16 and fast["eval.final_samples"] is None


@pytest.mark.parametrize("preset", ["toy_clip", "toy_degeneration", "toy_ds", "toy_headroom", "toy_overlong"])
def test_the_toy_regimes_keep_the_fast_sizes_they_were_measured_in(composer, preset):
    """The toy_* regimes were measured at 16 prompts per step and 64 x 4 evaluations: they include
    experiment=toy_fast, so a change of the defaults leaves them as measured."""
    c = composer("fixes=grpo", f"experiment={preset}")
    assert (c.train.prompts_per_step, c.task.arith_n_eval, c.eval.problems, c.eval.final_problems,
            c.eval.final_samples, c.eval.endpoint) == (16, 64, None, None, None, "last_k_mean")
    assert c.train.mini_batch_size == (16 if preset == "toy_clip" else 32)


@pytest.mark.parametrize("key", ["eval.problems=64", "eval.final_problems=256", "eval.final_samples=8"])
def test_verl_refuses_the_toys_evaluation_sizes_naming_the_override(composer, key):
    """verl evaluates the whole held-out set at every validation: the toy's sizes (schema defaults) are
    refused before anything runs, naming the null that the real-scale presets set."""
    from dapo_exp.backends import verl as vb

    cfg = composer("backend=verl", "experiment=qwen0.5b_gsm8k", "fixes=grpo", "out_dir=/runs/x", key)
    with pytest.raises(vb.Untranslatable, match=re.escape(f"pass {key.split('=')[0]}=null")):
        vb.translate(cfg)
    vb.translate(composer("backend=verl", "experiment=qwen0.5b_gsm8k", "fixes=grpo", "out_dir=/runs/x"))


@pytest.mark.parametrize("preset", ["qwen0.5b_gsm8k", "qwen1.5b_dapo_math", "dapo_32b_paper"])
def test_real_scale_presets_evaluate_the_whole_held_out_set(composer, preset):
    """The toy's 64-problem curves and 256 x 8 final evaluation are schema defaults: the real-scale presets
    evaluate every held-out problem at eval.k samples, the final evaluation too (as verl does)."""
    c = composer("fixes=grpo", f"experiment={preset}")
    assert (c.eval.problems, c.eval.final_problems, c.eval.final_samples) == (None, None, None)


@pytest.mark.parametrize("preset", ["qwen0.5b_gsm8k", "qwen1.5b_dapo_math", "dapo_32b_paper"])
def test_a_real_scale_preset_shrunk_for_a_smoke_test_evaluates_at_the_shrunk_cap(composer, preset):
    """eval.max_response_len is null (the training cap) in the presets, not the cap's number: a smoke test's
    rollout.max_response_len=16 evaluates 16-token answers, not the preset's 1024-20480."""
    c = composer("fixes=grpo", f"experiment={preset}", "rollout.max_response_len=16", "algo.overlong_cache_len=4")
    assert (c.eval.max_response_len or c.rollout.max_response_len) == 16  # how train.run_eval reads the cap
