"""backend=verl against verl's own code (verl==0.9.1 in its own virtualenv, .venv-verl).

Run by `.ci/test` with verl's interpreter: `.venv-verl/bin/python -m pytest -m verl tests/test_verl_backend.py`
(in the main environment, where verl is not installed, every test here skips saying so).

(a) every `fixes=` preset x every `experiment=` preset, and every switch that no preset turns on
    (DPPO, OPO, Pass@k, GPG's estimator, REINFORCE++-baseline): the translated overrides compose against
    verl's installed Hydra config (`verl/trainer/config/ppo_trainer.yaml` and its groups), every
    value reads back as translated (and as the switch's rule says), and verl's own `validate_config` passes;
(b) the same tensors through our objective and through verl's `core_algos` (GRPO advantages, the
    vanilla policy loss with its clip ratios and dual clip, `agg_loss` with the trainer's global-batch
    normalisers, micro-batches included), with verl's parameters read from the composed verl config:
    equal, except the documented differences; a mutation of each translated value breaks it;
    our Overlong Filtering agent loop; verl's DAPO overlong reward vs our soft punishment; KL;
(c) the acceptance dry run (`run.py -m backend=verl experiment=dapo_32b_paper fixes=paper_1_grpo,...,
    paper_6_dapo backend.dry_run=true`, tests/paper_dry_run.py): the six printed commands compose and
    validate against verl's config, hold Table 1's ladder, the released script's 16 x 8 layout and
    resume, their sbatch scripts ask for that layout, and the DAPO row holds the paper's 32B
    hyperparameters field by field (the reference's table, ../shared/docs/dapo_reference.md).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

verl = pytest.importorskip("verl", reason="verl is not installed here: .ci/test runs these tests with "
                           ".venv-verl/bin/python (bash .ci/install-verl creates it)")

from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import DictConfig, OmegaConf, open_dict  # noqa: E402

from dapo_exp import objective  # noqa: E402
from dapo_exp.backends import verl as vb  # noqa: E402
from dapo_exp.hydra_setup import register_resolvers  # noqa: E402

pytestmark = pytest.mark.verl

ROOT = Path(__file__).resolve().parents[1]
CONF = str(ROOT / "conf")
VERL_CONF = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
ALL_EXPERIMENTS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))
# the CPU testbed's regimes (toy_*) run the embedded arith task and tiny model: native only
TOY_EXPERIMENTS = [e for e in ALL_EXPERIMENTS if e.startswith("toy_")]
EXPERIMENTS = [e for e in ALL_EXPERIMENTS if e not in TOY_EXPERIMENTS]
PRESETS = sorted(p.stem for p in (ROOT / "conf" / "fixes").glob("*.yaml"))
# what the launcher adds for verl's Ray workers (dapo_exp.backends.verl_launch._environment)
ENV = {"WANDB_MODE": "offline", "VERL_FILE_LOGGER_PATH": "/runs/x=1,y=2/verl_metrics.jsonl", "PYTHONPATH": "/repo"}


def ours(*overrides: str):
    register_resolvers()
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose("config", overrides=["backend=verl", "out_dir='/runs/x=1,y=2'", *overrides])


@functools.cache
def translated(experiment: str, preset: str, *extra: str):
    cfg = ours(*([f"experiment={experiment}"] if experiment else []), f"fixes={preset}", *extra)
    return cfg, vb.translate(cfg)


@functools.cache
def verl_config(experiment: str, preset: str, *extra: str):
    _, job = translated(experiment, preset, *extra)
    with initialize_config_dir(config_dir=VERL_CONF, version_base=None):
        return compose("ppo_trainer", overrides=job.overrides + vb.ray_env_overrides(ENV))


# --------------------------------------------------------------------------- #
# (a) the overrides compose and validate against verl's own config             #
# --------------------------------------------------------------------------- #
def verl_estimator(cfg) -> str:
    """The name of verl's estimator that our config's estimator is (GRPO's where no estimator fix is on)."""
    from dapo_exp import fixes

    on = [f.name for f in fixes.active(cfg.algo) if "estimator" in f.slots]
    names = {"rloo": "rloo", "opo": "opo", "grpo_passk": "grpo_passk", "gpg_adv": "gpg",
             "reinforce_pp": "reinforce_plus_plus_baseline" if cfg.algo.reinforce_pp_baseline else "reinforce_plus_plus"}
    return names[on[0]] if on else "grpo"


def _composes_and_validates(experiment: str, preset: str, *extra: str) -> None:
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    cfg, job = translated(experiment, preset, *extra)
    c = verl_config(experiment, preset, *extra)  # an unknown key, or `+` on an existing one, fails here
    for key, value in job.values.items():
        if key.startswith("$"):  # environment variables: the launcher sets them (ray_env_overrides)
            continue
        got = OmegaConf.select(c, key.lstrip("+"), throw_on_missing=True)
        got = OmegaConf.to_container(got) if OmegaConf.is_config(got) else got
        assert got == value, (experiment, preset, key, got, value)  # the rendering round-trips
    for k, v in ENV.items():
        assert c.ray_kwargs.ray_init.runtime_env.env_vars[k] == v
    validate_config(c, use_reference_policy=need_reference_policy(c), use_critic=need_critic(c))
    algo = omega_conf_to_dataclass(c.algorithm)
    assert algo.adv_estimator == verl_estimator(cfg) and not need_critic(c) and not need_reference_policy(c)
    omega_conf_to_dataclass(c.actor_rollout_ref.rollout)


# Every preset under the paper's recipe; under the other scale presets, the presets whose translation reads what
# an experiment sets (the length cap: the overlong buffer, Dr. GRPO's L_max; the batch sizes: Dynamic Sampling's),
# and one of the family's losses. The fixes' other translations read only the algo section (80 compositions
# here before, 2026-11-29: about 100 CPU-s of CI for the same keys).
EXPERIMENT_PRESETS = ("grpo", "full", "paper_6_dapo", "dr_grpo", "cispo")


def test_every_preset_composes_and_validates_against_verls_config():
    for preset in PRESETS:
        _composes_and_validates("dapo_32b_paper", preset)


@pytest.mark.parametrize("experiment", [e for e in EXPERIMENTS if e != "dapo_32b_paper"])
def test_every_scale_preset_composes_and_validates_against_verls_config(experiment):
    for preset in EXPERIMENT_PRESETS:
        _composes_and_validates(experiment, preset)


@pytest.mark.parametrize("experiment, preset", [("", p) for p in ("grpo", "full", "paper_6_dapo", "cispo")]
                         + [(e, "paper_6_dapo") for e in TOY_EXPERIMENTS])  # the regimes: the DAPO row, every fix on
def test_the_toy_in_cpu_mode_composes_and_validates_against_verls_config(experiment, preset):
    """The CPU testbed on verl's CPU mode (train.device=cpu): its keys exist in verl's config and validate."""
    _composes_and_validates(experiment or "", preset, "train.device=cpu")


# The switches that no `fixes=` preset turns on, each on GRPO's preset, with the verl settings their rules
# (dapo_exp/fixes/<name>.py, `verl=`) must give: composed against verl's config, read back, validated by verl (the
# same tensors through both: test_same_advantages_and_loss_for_every_preset)
_ACTOR = "actor_rollout_ref.actor."
SWITCHES_WITHOUT_A_PRESET = [
    (("dppo_tv=enabled", "algo.dual_clip=null"),  # the bounds as clip_ratio_low/high, the cap as clip_ratio_c
     {_ACTOR + "policy_loss.loss_mode": "dppo_tv", _ACTOR + "clip_ratio_low": 0.15, _ACTOR + "clip_ratio_high": 0.15,
      _ACTOR + "clip_ratio_c": 20.0}),
    (("dppo_tv=enabled", "algo.dual_clip=null", "algo.dppo_tv_high=0.05", "algo.dppo_tv_cap=1.2"),
     {_ACTOR + "policy_loss.loss_mode": "dppo_tv", _ACTOR + "clip_ratio_low": 0.15, _ACTOR + "clip_ratio_high": 0.05,
      _ACTOR + "clip_ratio_c": 1.2}),
    (("dppo_kl=enabled", "algo.dual_clip=null"),
     {_ACTOR + "policy_loss.loss_mode": "dppo_kl", _ACTOR + "clip_ratio_low": 0.05, _ACTOR + "clip_ratio_high": 0.05,
      _ACTOR + "clip_ratio_c": 20.0}),
    (("opo=enabled",), {"algorithm.adv_estimator": "opo"}),
    (("grpo_passk=enabled",), {"algorithm.adv_estimator": "grpo_passk", "algorithm.norm_adv_by_std_in_grpo": True}),
    (("grpo_passk=enabled", "dr_grpo_adv=enabled"),
     {"algorithm.adv_estimator": "grpo_passk", "algorithm.norm_adv_by_std_in_grpo": False}),
    (("gpg_adv=enabled",), {"algorithm.adv_estimator": "gpg"}),
    (("reinforce_pp=baseline",), {"algorithm.adv_estimator": "reinforce_plus_plus_baseline", "algorithm.gamma": 1.0}),
]


@pytest.mark.parametrize("extra, expected", SWITCHES_WITHOUT_A_PRESET,
                         ids=[",".join(extra) for extra, _ in SWITCHES_WITHOUT_A_PRESET])
def test_every_switch_without_a_preset_composes_reads_back_and_validates(extra, expected):
    from verl.utils.config import omega_conf_to_dataclass

    _composes_and_validates("dapo_32b_paper", "grpo", *extra)
    c = verl_config("dapo_32b_paper", "grpo", *extra)
    for key, value in expected.items():
        assert OmegaConf.select(c, key, throw_on_missing=True) == value, (extra, key)
    actor = omega_conf_to_dataclass(c.actor_rollout_ref.actor)  # as verl's worker builds it
    assert actor.policy_loss.loss_mode == expected.get(_ACTOR + "policy_loss.loss_mode", "vanilla")
    algo = omega_conf_to_dataclass(c.algorithm)
    assert algo.adv_estimator == expected.get("algorithm.adv_estimator", "grpo")


def test_every_switch_verl_runs_is_dry_run_by_a_preset_or_the_list_above():
    """A switch (each option of each fix's group) that verl runs has its dry run here: a `fixes=` preset turns
    it on (every preset composes and validates above) or it is in SWITCHES_WITHOUT_A_PRESET with the verl
    settings its rule must give (the rollout corrections: ROLLOUT_CORRECTIONS, read back as verl's typed config). One that verl refuses fails translation, naming why (tested per switch in
    tests/test_estimators.py and below). A new switch with a verl rule and neither fails here."""
    from hydra.core.global_hydra import GlobalHydra

    from dapo_exp import fixes
    from dapo_exp.errors import ConfigError

    extras = [extra for extra, _ in SWITCHES_WITHOUT_A_PRESET] + [extra for extra, *_ in ROLLOUT_CORRECTIONS]
    covered = {tuple(o.split("=", 1)) for extra in extras for o in extra if o.split("=", 1)[0] in fixes.FIXES}
    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        for preset in PRESETS:
            cfg = compose("config", overrides=["backend=verl", f"fixes={preset}"], return_hydra_config=True)
            covered |= {(g, o) for g, o in cfg.hydra.runtime.choices.items() if g in fixes.FIXES and o != "disabled"}
    missing, refused = [], []
    for name, fix in fixes.FIXES.items():
        for option in (o for o in fix.options if o != "disabled"):
            try:
                vb.translate(ours("experiment=dapo_32b_paper", "fixes=grpo", f"{name}={option}"))
            except (vb.Untranslatable, ConfigError):
                refused.append(f"{name}={option}")
                continue
            if (name, option) not in covered:
                missing.append(f"{name}={option}")
    assert not missing, f"switches verl runs with no dry run (add them to SWITCHES_WITHOUT_A_PRESET): {missing}"
    assert {"remax=enabled", "gdpo=enabled", "gae=enabled", "top_entropy=enabled"} <= set(refused)  # the guard ran


def test_paper_recipe_reads_back_from_verls_config():
    """The paper's 32B row 6 (DAPO), as verl holds it after composition."""
    c = verl_config("dapo_32b_paper", "paper_6_dapo")
    a, r = c.actor_rollout_ref.actor, c.actor_rollout_ref.rollout
    assert (a.clip_ratio_low, a.clip_ratio_high, a.clip_ratio_c) == (0.2, 0.28, 10.0)
    assert a.loss_agg_mode == "token-mean" and not a.use_kl_loss and not c.algorithm.use_kl_in_reward
    assert c.algorithm.filter_groups.enable and c.algorithm.filter_groups.metric == "acc"
    assert c.reward.reward_manager.name == "dapo"
    ob = c.reward.reward_kwargs.overlong_buffer_cfg
    assert (ob.enable, ob.len, ob.penalty_factor, c.reward.reward_kwargs.max_resp_len) == (True, 4096, 1.0, 20480)
    assert (c.data.train_batch_size, r.n, a.ppo_mini_batch_size) == (512, 16, 32)  # 16 updates of 512 responses
    assert (c.data.max_prompt_length, c.data.max_response_length, r.response_length) == (2048, 20480, 20480)
    assert (a.optim.lr, a.optim.lr_warmup_steps, a.optim.weight_decay, a.optim.clip_grad) == (1e-6, 20, 0.1, 1.0)
    assert (r.temperature, r.top_p, r.val_kwargs.temperature, r.val_kwargs.top_p, r.val_kwargs.n) == (1, 1, 1, 0.7, 32)
    assert r.agent.default_agent_loop == vb.OF_AGENT_LOOP and c.actor_rollout_ref.model.external_lib == vb.EXT_MODULE


# --------------------------------------------------------------------------- #
# The acceptance dry run: the paper's ladder at 32B, as printed, against verl    #
# --------------------------------------------------------------------------- #
REFERENCE = ROOT.parent / "shared" / "docs" / "dapo_reference.md"  # the project's reference (not in the repo)
_A, _R = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout."
# (row of the reference's "Hyperparameters of the paper's 32B run" table, the words of its value there,
#  the verl key, the value verl must hold): the DAPO row (paper_6_dapo), field by field
PAPER_32B = [
    ("optimizer", "constant lr 1e-6", _A + "optim.lr", 1e-6),
    ("optimizer", "constant lr", _A + "optim.lr_scheduler_type", "constant"),
    ("optimizer", "paper: 20 rollout steps", _A + "optim.lr_warmup_steps", 20),
    ("optimizer", "weight decay 0.1", _A + "optim.weight_decay", 0.1),
    ("optimizer", "grad clip 1.0", _A + "optim.clip_grad", 1.0),
    ("prompts per rollout step", "512", "data.train_batch_size", 512),
    ("responses per prompt (G)", "16", _R + "n", 16),
    ("mini-batch", "512 responses", _A + "ppo_mini_batch_size", 32),  # verl counts prompts: 32 x G = 512
    ("mini-batch", "1 epoch", _A + "ppo_epochs", 1),
    ("max response length L_max", "20480 tokens", "data.max_response_length", 20480),
    ("max response length L_max", "20480 tokens", "reward.reward_kwargs.max_resp_len", 20480),
    ("max response length L_max", "L_cache 4096", "reward.reward_kwargs.overlong_buffer_cfg.len", 4096),
    ("max prompt length", "2048", "data.max_prompt_length", 2048),
    ("clip", "eps_low 0.2", _A + "clip_ratio_low", 0.2),
    ("clip", "eps_high 0.28", _A + "clip_ratio_high", 0.28),
    ("clip", "dual-clip c = 10", _A + "clip_ratio_c", 10.0),
    ("KL", "removed", _A + "use_kl_loss", False),
    ("KL", "removed", "algorithm.use_kl_in_reward", False),
    ("reward", "+1 if the answer is equivalent, -1 otherwise", "reward.reward_manager.name", "dapo"),
    ("dynamic sampling", "over-sample 3x", "algorithm.filter_groups.max_inflight_gen_batches", 3),
    ("dynamic sampling", "filter on accuracy", "algorithm.filter_groups.metric", "acc"),
    # documented difference: verl 0.9.1 has no cap on refills (0 = none; README, algo.ds_max_rounds)
    ("dynamic sampling", "at most 10 generation rounds", "algorithm.filter_groups.max_num_gen_batches", 0),
    ("training sampling", "temperature 1.0", _R + "temperature", 1.0),
    ("training sampling", "top_p 1.0", _R + "top_p", 1.0),
    ("evaluation", "avg@32", _R + "val_kwargs.n", 32),
    ("evaluation", "temperature 1.0", _R + "val_kwargs.temperature", 1.0),
    ("evaluation", "top_p 0.7", _R + "val_kwargs.top_p", 0.7),
]
# the released script's layout: volcengine/verl recipe/dapo/run_dapo_qwen2.5_32b.sh (NNODES=16,
# trainer.n_gpus_per_node=8, gen_tp=4, sp_size=8), the paper's 128 GPUs
SCRIPT_LAYOUT = {"trainer.nnodes": 16, "trainer.n_gpus_per_node": 8, _R + "tensor_model_parallel_size": 4,
                 _A + "fsdp_config.ulysses_sequence_parallel_size": 8}
# Table 1's ladder, cumulative: what each row switches on, as verl holds it
LADDER = {  # row: (clip_ratio_high, loss_agg_mode, overlong buffer, filter_groups, our Overlong Filtering loop)
    "paper_1_grpo": (0.2, "seq-mean-token-mean", False, False, False),
    "paper_2_of": (0.2, "seq-mean-token-mean", False, False, True),
    "paper_3_clip": (0.28, "seq-mean-token-mean", False, False, True),
    "paper_4_sop": (0.28, "seq-mean-token-mean", True, False, True),
    "paper_5_tl": (0.28, "token-mean", True, False, True),
    "paper_6_dapo": (0.28, "token-mean", True, True, True),
}


def _reference_rows() -> dict[str, str]:
    rows = {}
    for line in REFERENCE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2:
            rows[cells[0]] = cells[1]
    return rows


def test_the_transcribed_32b_values_are_the_reference_tables():
    """Each value checked below is written in the reference's table, in the row named."""
    if not REFERENCE.exists():
        pytest.skip(f"{REFERENCE} is not beside this checkout; the values below are checked without it")
    rows = _reference_rows()
    for row, words, _, _ in PAPER_32B:
        assert words in rows[row], (row, words, rows.get(row))


@pytest.fixture(scope="module")
def paper_jobs(tmp_path_factory):
    """The acceptance dry run, run with this interpreter (verl's environment runs run.py too)."""
    from paper_dry_run import paper_dry_run

    jobs, _ = paper_dry_run(tmp_path_factory.mktemp("paper_dry_run"))
    return {j.record["label"]: j for j in jobs}


def _compose_printed(job) -> DictConfig:
    assert job.command[1:3] == ["-m", "verl.trainer.main_ppo"]
    with initialize_config_dir(config_dir=VERL_CONF, version_base=None):
        return compose("ppo_trainer", overrides=job.command[3:])


def test_the_paper_dry_run_prints_six_jobs_that_compose_against_verls_config(paper_jobs):
    """Every printed command composes and validates against verl's installed config; each row holds its
    fixes (Table 1's ladder), the paper's layout, resume from the run's checkpoints, and its sbatch
    script asks SLURM for that layout."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    assert sorted(paper_jobs) == sorted(LADDER)
    for label, job in paper_jobs.items():
        c = _compose_printed(job)
        validate_config(c, use_reference_policy=need_reference_policy(c), use_critic=need_critic(c))
        a = c.actor_rollout_ref.actor
        of = c.actor_rollout_ref.rollout.agent.default_agent_loop == vb.OF_AGENT_LOOP
        got = (a.clip_ratio_high, a.loss_agg_mode, c.reward.reward_kwargs.overlong_buffer_cfg.enable,
               c.algorithm.filter_groups.enable, of)
        assert got == LADDER[label], (label, got)
        for key, want in SCRIPT_LAYOUT.items():
            assert OmegaConf.select(c, key) == want, (label, key)
        assert c.trainer.resume_mode == "auto" and c.trainer.default_local_dir == str(job.out / "checkpoints")
        sbatch = [line.split(" ", 1)[1] for line in job.script.splitlines() if line.startswith("#SBATCH ")]
        assert {"--nodes=16", "--gpus-per-node=8", "--ntasks-per-node=1", "--requeue"} <= set(sbatch), label
        assert "NNODES=16\n" in job.script and "GPUS_PER_NODE=8\n" in job.script


def test_the_paper_dry_runs_dapo_row_has_the_papers_32b_hyperparameters(paper_jobs):
    """The DAPO row (paper_6_dapo) as verl holds it after composing the printed command, field by field
    against the reference's table (transcribed in PAPER_32B, checked against the file above)."""
    c = _compose_printed(paper_jobs["paper_6_dapo"])
    for row, words, key, want in PAPER_32B:
        got = OmegaConf.select(c, key, throw_on_missing=True)
        assert got == want, f"{row} ({words}): verl's {key} is {got!r}, the paper's is {want!r}"


def _verls_compute_dtype(fsdp_config) -> torch.dtype:
    """The dtype verl's FSDP engine computes in, read as `FSDPEngine._build_fsdp_module` reads it: the
    engine config's `mixed_precision.param_dtype`, bf16 when the dict is unset."""
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.torch_dtypes import PrecisionType

    mp = omega_conf_to_dataclass(fsdp_config).mixed_precision
    return PrecisionType.to_dtype(mp.get("param_dtype", "bf16")) if mp is not None else torch.bfloat16


@pytest.mark.parametrize(("experiment", "extra", "want"), [
    ("smollm2_add2", ("train.device=cpu",), torch.float32),  # the real model on a CPU: float32, as natively
    ("", ("train.device=cpu",), torch.float32),  # the toy
    ("qwen0.5b_gsm8k", (), torch.bfloat16),  # model.dtype bfloat16: bf16 autocast natively on CUDA
    ("qwen0.5b_gsm8k", ("train.bf16=false",), torch.float32),
])
def test_verls_fsdp_engine_computes_in_the_native_trainers_dtype(experiment, extra, want):
    """verl's FSDP engine computes in bf16 unless `fsdp_config.mixed_precision` says otherwise (its
    `fsdp_config.dtype` is read by Megatron only): a float32 run must reach it as float32, for the actor
    and the reference, or verl trains a different (and, on an AVX2-only CPU, ~28x slower) model."""
    c = verl_config(experiment, "grpo", *extra)
    for role in (c.actor_rollout_ref.actor, c.actor_rollout_ref.ref):
        assert _verls_compute_dtype(role.fsdp_config) == want, (experiment, extra)
    # without the translated dict verl's default is bf16: the rule is what makes a float32 run float32
    bare = copy.deepcopy(c.actor_rollout_ref.actor.fsdp_config)
    with open_dict(bare):
        del bare["mixed_precision"]
    assert _verls_compute_dtype(bare) == torch.bfloat16


def test_gpu_free_values_that_verl_treats_specially():
    """dual_clip null, grad_clip 0 and Dr.GRPO's sum-norm reach verl as values with the same meaning."""
    c = verl_config("qwen0.5b_gsm8k", "full", "algo.dual_clip=null", "optim.grad_clip=0",
                    "token_level_loss=disabled", "dr_grpo_norm=enabled", "algo.adv_norm_std=false", "train.token_budget=8192",
                    "algo.kl_coef=0.001", "algo.kl_estimator=k2")
    a = c.actor_rollout_ref.actor
    assert a.clip_ratio_c == vb.NO_DUAL_CLIP and a.optim.clip_grad == math.inf
    assert a.loss_agg_mode == "seq-mean-token-sum-norm" and a.loss_scale_factor == 1024
    assert c.algorithm.norm_adv_by_std_in_grpo is False
    assert a.use_dynamic_bsz and a.ppo_max_token_len_per_gpu == 8192
    assert a.use_kl_loss and (a.kl_loss_coef, a.kl_loss_type) == (0.001, "k2")
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    assert need_reference_policy(c)  # KL on: verl builds the reference model
    validate_config(c, use_reference_policy=True, use_critic=need_critic(c))


# --------------------------------------------------------------------------- #
# (b) the same tensors through both                                             #
# --------------------------------------------------------------------------- #
B, T, G = 8, 12, 4  # responses, padded response width, group size


def batch(seed: int = 0):
    """Tensors where every translated setting matters: clipping on both sides, the dual clip (ratio
    above 10 with A < 0), varied lengths, truncated responses, mixed groups with std != 1."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([12, 3, 7, 12, 1, 12, 5, 9])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    truncated = torch.tensor([True, False, False, True, False, False, False, False])  # at the cap, no EOS
    rewards = torch.tensor([[1.0, -1.0, -1.0, -0.5], [1.0, 1.0, -1.0, -1.3]])
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    logp = old + (torch.rand(B, T, generator=g, dtype=torch.float64) - 0.5) * 0.8
    logp[1, 0] = old[1, 0] + 3.0  # ratio e^3 = 20 > c = 10 on a negative-advantage row (row 1: reward -1)
    logp[2, 1] = old[2, 1] + 2.5
    return dict(mask=mask, truncated=truncated, rewards=rewards, old=old, logp=logp, lengths=lengths)


def our_side(cfg, d):
    """Our advantage, mask and loss through the plan the fixes compose for this config (dapo_exp.compose):
    the same composition the trainer runs, so every fix's translation is compared with verl's result."""
    from dapo_exp import compose

    plan = compose.compose(cfg.algo, compose.run_info(cfg))
    adv = plan.advantage(d["rewards"], lengths=d["mask"].sum(1).view(d["rewards"].shape).to(d["rewards"].dtype)
                         ).value.reshape(-1)
    mask = plan.token_mask(d["mask"], d["truncated"]).value
    out = plan.token_losses(d["logp"], d["old"], adv[:, None].double(), mask=mask).value
    weights = plan.weights(mask, torch.arange(B // G).repeat_interleave(G)).value
    our_side.token_terms = out.loss * mask * weights[:, None].to(out.loss.dtype)  # each token's share of the loss
    return adv, objective.weighted_token_sum(out.loss, mask, weights), mask


def verl_mask(c, d):
    """verl's response_mask: what verl's configured agent loop makes of each response."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

    from dapo_exp.backends import verl_ext

    eos = 99
    masks = []
    for i in range(B):
        n = int(d["lengths"][i])
        ids = [5] * n if d["truncated"][i] else [5] * (n - 1) + [eos]
        out = AgentLoopOutput(prompt_ids=[1], response_ids=ids, response_mask=[1] * n, metrics=AgentLoopMetrics())
        if c.actor_rollout_ref.rollout.agent.default_agent_loop == vb.OF_AGENT_LOOP:
            out = verl_ext.filter_output(out, max_len=T, eos_ids={eos})
        masks.append(out.response_mask + [0] * (T - n))
    return torch.tensor(masks)


def verl_side(c, d, micro_batches=((0, B),)):
    """verl's GRPO advantage and policy loss, with verl's parameters read from its composed config and
    the global-batch normalisers its engine computes (batch_num_tokens = the mini-batch's loss_mask
    sum, global_batch_size = its rows), summed over micro-batches as verl's gradient accumulation does."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, get_adv_estimator_fn, get_policy_loss_fn
    from verl.utils.config import omega_conf_to_dataclass

    mask = verl_mask(c, d)
    scores = torch.zeros(B, T, dtype=torch.float32)
    scores[torch.arange(B), d["lengths"] - 1] = d["rewards"].reshape(-1)  # the reward at the last token
    index = [f"g{i // G}" for i in range(B)]
    if c.algorithm.adv_estimator == "grpo":
        adv, _ = compute_grpo_outcome_advantage(scores, mask, index,
                                                norm_adv_by_std_in_grpo=c.algorithm.norm_adv_by_std_in_grpo)
    else:  # as verl's compute_advantage calls the registry's other estimators
        adv, _ = get_adv_estimator_fn(c.algorithm.adv_estimator)(
            token_level_rewards=scores, response_mask=mask, index=np.array(index, dtype=object),
            config=omega_conf_to_dataclass(c.algorithm))
    actor = omega_conf_to_dataclass(c.actor_rollout_ref.actor)
    loss_fn = get_policy_loss_fn(actor.policy_loss.loss_mode)
    total = torch.zeros((), dtype=torch.float64)
    for lo, hi in micro_batches:
        actor.global_batch_info.update(dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=B,
                                       loss_scale_factor=actor.loss_scale_factor)
        loss, _ = loss_fn(old_log_prob=d["old"][lo:hi], log_prob=d["logp"][lo:hi],
                          advantages=adv[lo:hi].double(), response_mask=mask[lo:hi].bool(),
                          loss_agg_mode=actor.loss_agg_mode, config=actor)
        total = total + loss
    first = adv[torch.arange(B), 0]  # verl broadcasts the advantage over the row, masked
    return first, total, mask


def _ours_and_verl(preset, *extra, experiment="dapo_32b_paper"):
    cfg, _ = translated(experiment, preset, *extra)
    return cfg, verl_config(experiment, preset, *extra)


@pytest.mark.parametrize("preset, extra", [(p, ()) for p in PRESETS] + [
    ("full", ("algo.adv_norm_std=false",)),  # Dr.GRPO's advantage
    ("paper_6_dapo", ("algo.dual_clip=null",)),  # no dual clip: verl's c = 1e10 never binds
    ("paper_5_tl", ("algo.eps_low=0.1", "algo.eps_high=0.35")),
    *[("grpo", (f"{d}=enabled", "algo.dual_clip=null")) for d in ("dppo_tv", "dppo_kl")],  # DPPO's cap: clip_ratio_c
    ("grpo", ("dppo_tv=enabled", "algo.dual_clip=null", "algo.dppo_tv_high=0.05", "algo.dppo_tv_cap=1.2")),
    ("sapo", ("algo.sapo_tau_neg=2.0",)),
    ("grpo", ("gpg_adv=enabled",)),  # GPG's estimator under PPO's clip
    ("grpo", ("reinforce_pp=baseline",)), ("grpo", ("opo=enabled",)),  # verl's advantage estimators
    ("grpo", ("grpo_passk=enabled",)), ("grpo", ("grpo_passk=enabled", "dr_grpo_adv=enabled")),
    ("full", ("rloo=enabled",)), ("full", ("grpo_passk=enabled",)),
])
def test_same_advantages_and_loss_for_every_preset(preset, extra):
    cfg, c = _ours_and_verl(preset, *extra)
    d = batch()
    adv, loss, mask = our_side(cfg, d)
    v_adv, v_loss, v_mask = verl_side(c, d)
    kept = v_mask.sum(1) > 0
    assert torch.equal(mask.bool(), v_mask.bool())  # Overlong Filtering: the same mask from our agent loop
    torch.testing.assert_close(v_adv[kept].double(), adv[kept].double(), rtol=1e-6, atol=1e-7)
    if cfg.algo.clip_cov:
        # documented: verl zeroes the loss of the tokens Clip-Cov selects (at least one:
        # max(int(ratio * tokens), 1), drawn from torch's global stream); ours detaches them (value kept).
        # So the two differ by at most that many tokens' shares of the loss.
        k = max(int(cfg.algo.clip_cov_ratio * int(mask.sum())), 1)
        assert abs(float(v_loss - loss)) <= k * float(our_side.token_terms.abs().max()) + 1e-9
        assert torch.isfinite(v_loss)
    elif cfg.algo.loss_agg == "seq-mean-token-mean" and cfg.algo.overlong_filtering and not cfg.algo.dr_grpo_norm:
        # documented: verl divides by every response of the mini-batch (global_batch_size), masked
        # ones included; ours by the responses that keep a token (B')
        torch.testing.assert_close(v_loss, loss * kept.sum() / B, rtol=1e-6, atol=1e-9)
    else:
        torch.testing.assert_close(v_loss, loss, rtol=1e-6, atol=1e-9)
    # verl's gradient accumulation gives the same sum over micro-batches, as ours does by construction,
    # except for the modes whose verl loss depends on the split (documented): clip_cov / kl_cov select
    # their tokens within each micro-batch, geo_mean averages over each micro-batch's rows
    _, v_split, _ = verl_side(c, d, micro_batches=((0, 3), (3, 8)))
    if c.actor_rollout_ref.actor.policy_loss.loss_mode in ("clip_cov", "kl_cov", "geo_mean"):
        assert torch.isfinite(v_split)
    else:
        torch.testing.assert_close(v_split, v_loss, rtol=1e-9, atol=1e-12)


# each translated value, changed on verl's side, must change verl's result (the comparison above can fail)
MUTATIONS = {
    "actor_rollout_ref.actor.clip_ratio_low": lambda v: v + 0.1,
    "actor_rollout_ref.actor.clip_ratio_high": lambda v: v + 0.1,
    "actor_rollout_ref.actor.clip_ratio_c": lambda v: 3.0,
    "actor_rollout_ref.actor.loss_agg_mode": lambda v: "token-mean" if v != "token-mean" else "seq-mean-token-mean",
    "algorithm.norm_adv_by_std_in_grpo": lambda v: not v,
    "actor_rollout_ref.rollout.agent.default_agent_loop":
        lambda v: "single_turn_agent" if v == vb.OF_AGENT_LOOP else vb.OF_AGENT_LOOP,
}


@pytest.mark.parametrize("preset", ["paper_1_grpo", "paper_3_clip", "paper_6_dapo", "full"])
@pytest.mark.parametrize("key", list(MUTATIONS))
def test_a_changed_translated_value_breaks_the_equivalence(preset, key):
    _, c = _ours_and_verl(preset)
    d = batch()
    v_adv, v_loss, v_mask = verl_side(c, d)
    bad = copy.deepcopy(c)
    OmegaConf.update(bad, key, MUTATIONS[key](OmegaConf.select(c, key)))
    b_adv, b_loss, b_mask = verl_side(bad, d)
    changed = not torch.allclose(b_loss, v_loss, rtol=1e-6) or not torch.allclose(b_adv, v_adv)
    assert changed, f"{key} changed on verl's side and nothing changed: the equivalence test could not see it"


# the family's translated values: each, changed on verl's side, changes verl's result
FAMILY_MUTATIONS = [
    ("gspo", "actor_rollout_ref.actor.policy_loss.loss_mode", "vanilla"),
    ("gspo", "actor_rollout_ref.actor.clip_ratio_high", 0.2),
    ("cispo", "actor_rollout_ref.actor.policy_loss.loss_mode", "vanilla"),
    ("cispo", "actor_rollout_ref.actor.clip_ratio_high", 0.28),
    ("gmpo", "actor_rollout_ref.actor.policy_loss.loss_mode", "vanilla"),
    ("gmpo", "actor_rollout_ref.actor.clip_ratio_low", 0.1),
    ("kl_cov", "actor_rollout_ref.actor.policy_loss.ppo_kl_coef", 0.1),
    ("kl_cov", "actor_rollout_ref.actor.policy_loss.kl_cov_ratio", 0.5),
    ("dr_grpo", "actor_rollout_ref.actor.loss_agg_mode", "seq-mean-token-mean"),
    ("dr_grpo", "algorithm.norm_adv_by_std_in_grpo", True),
    ("sapo", "actor_rollout_ref.actor.tau_neg", 1.5),
    ("sapo", "actor_rollout_ref.actor.policy_loss.loss_mode", "vanilla"),
    ("gpg", "actor_rollout_ref.actor.policy_loss.loss_mode", "vanilla"),
    ("gpg", "algorithm.adv_estimator", "grpo"),
    ("dro", "actor_rollout_ref.actor.policy_loss.dro_beta", 5.0),
    ("dro", "actor_rollout_ref.actor.policy_loss.loss_mode", "vanilla"),
    ("rloo", "algorithm.adv_estimator", "grpo"),
    ("reinforce_pp", "algorithm.adv_estimator", "reinforce_plus_plus_baseline"),
    ("reinforce_pp", "algorithm.gamma", 0.9),
]


@pytest.mark.parametrize("preset, key, value", FAMILY_MUTATIONS)
def test_a_changed_family_value_breaks_the_equivalence(preset, key, value):
    _, c = _ours_and_verl(preset)
    d = batch()
    v_adv, v_loss, _ = verl_side(c, d)
    bad = copy.deepcopy(c)
    OmegaConf.update(bad, key, value)
    b_adv, b_loss, _ = verl_side(bad, d)
    assert not torch.allclose(b_loss, v_loss, rtol=1e-6) or not torch.allclose(b_adv, v_adv), key


def test_gspo_sequence_form_is_refused_on_verl_naming_the_key():
    with pytest.raises(vb.Untranslatable, match="algo.gspo_form='sequence'"):
        translated("dapo_32b_paper", "gspo", "algo.gspo_form=sequence")


def test_seq_mean_token_sum_norm_is_the_same_with_verls_loss_scale_factor():
    cfg, c = _ours_and_verl("paper_2_of", "dr_grpo_norm=enabled", "rollout.max_response_len=12",
                            "algo.overlong_cache_len=4", "eval.max_response_len=null", experiment="qwen0.5b_gsm8k")
    d = batch()
    _, loss, _ = our_side(cfg, d)
    _, v_loss, _ = verl_side(c, d)
    torch.testing.assert_close(v_loss, loss, rtol=1e-6, atol=1e-9)
    # documented: without the translated loss_scale_factor verl divides by the padded width of each
    # micro-batch, a different scale whenever a micro-batch is narrower than L_max
    from verl.trainer.ppo.core_algos import agg_loss

    narrow = agg_loss(torch.ones(2, 5), torch.ones(2, 5), "seq-mean-token-sum-norm")
    ours = objective.aggregate_loss(torch.ones(2, 5), torch.ones(2, 5), "seq-mean-token-sum-norm", max_len=12)
    assert float(narrow) == pytest.approx(1.0) and float(ours) == pytest.approx(10 / 24)


def test_documented_differences_of_verls_advantage_and_aggregation():
    from verl.trainer.ppo.core_algos import agg_loss, compute_grpo_outcome_advantage

    # G = 1: verl takes mean 0, std 1 (A = R / (1 + eps)); ours gives exactly 0
    a, _ = compute_grpo_outcome_advantage(torch.tensor([[0.0, 2.0]]), torch.ones(1, 2), ["solo"])
    assert a[0, 0] == pytest.approx(2.0 / (1 + 1e-6))
    assert objective.group_advantages(torch.tensor([[2.0]]))[0, 0] == 0
    # all-equal group: verl's (R - mean) / (0 + eps) leaves the rounding residue of the mean over eps
    r = torch.tensor([0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1])
    v, _ = compute_grpo_outcome_advantage(torch.stack([torch.zeros(7), r], 1), torch.ones(7, 2), ["g"] * 7)
    torch.testing.assert_close(v[:, 0], (r - r.mean()) / (r.std() + 1e-6))  # verl's formula, residue and all
    assert torch.all(objective.group_advantages(r[None, :]) == 0)
    # an all-zero mask (every response of a mini-batch filtered): verl's token-mean is 0/0 = NaN, ours 0
    z = agg_loss(torch.ones(2, 3), torch.zeros(2, 3), "token-mean")
    assert math.isnan(float(z))
    assert objective.aggregate_loss(torch.ones(2, 3), torch.zeros(2, 3), "token-mean") == 0


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_estimators_are_verls(estimator):
    from verl.trainer.ppo.core_algos import kl_penalty

    g = torch.Generator().manual_seed(1)
    logp, ref = -torch.rand(4, 6, generator=g) * 3, -torch.rand(4, 6, generator=g) * 3
    torch.testing.assert_close(kl_penalty(logp, ref, estimator), objective.kl_penalty(logp, ref, estimator))


def test_overlong_filtering_agent_loop_is_registered_and_filters():
    """The agent loop verl instantiates from its registry is ours and masks what objective.overlong_filtering masks."""
    import hydra
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput, _agent_loop_registry
    from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

    from dapo_exp.backends import verl_ext

    target = _agent_loop_registry[vb.OF_AGENT_LOOP]["_target_"]
    assert hydra.utils.get_class(target) is verl_ext.OverlongFilteringAgentLoop
    assert issubclass(verl_ext.OverlongFilteringAgentLoop, SingleTurnAgentLoop)

    made = []

    async def parent_run(self, sampling_params, **kwargs):
        return made.pop(0)

    loop = object.__new__(verl_ext.OverlongFilteringAgentLoop)
    loop.response_length, loop._eos_ids = 4, {2}
    for ids, kept in (([7, 7, 7, 7], False), ([7, 7, 7, 2], True), ([7, 2], True)):
        made.append(AgentLoopOutput(prompt_ids=[1], response_ids=ids, response_mask=[1] * len(ids),
                                    metrics=AgentLoopMetrics()))
        original = SingleTurnAgentLoop.run
        SingleTurnAgentLoop.run = parent_run
        try:
            out = asyncio.run(loop.run({}))
        finally:
            SingleTurnAgentLoop.run = original
        assert out.response_mask == [int(kept)] * len(ids) and out.extra_fields["truncated"] is (not kept)


def test_verl_loads_the_extension_through_external_lib(tmp_path):
    """verl's own model config imports `actor_rollout_ref.model.external_lib`: in a fresh verl process,
    building verl's HFModelConfig with the translated value registers our agent loop."""
    from dapo_exp.models import build_char_tokenizer, build_tiny_model

    tok = build_char_tokenizer()
    build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, seed=0).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    code = ("from verl.workers.config import HFModelConfig\n"
            "from verl.experimental.agent_loop.agent_loop import _agent_loop_registry as r\n"
            f"assert {vb.OF_AGENT_LOOP!r} not in r\n"
            f"HFModelConfig(path={str(tmp_path)!r}, external_lib={vb.EXT_MODULE!r})\n"
            f"print(r[{vb.OF_AGENT_LOOP!r}])\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "dapo_exp.backends.verl_ext.OverlongFilteringAgentLoop" in res.stdout


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_verls_dapo_overlong_reward_is_our_soft_punishment(experiment):
    """verl's DAPO reward manager, built from the composed verl config, adds exactly our Eq. 13 term."""
    from verl import DataProto
    from verl.experimental.reward_loop.reward_manager.dapo import DAPORewardManager

    cfg, c = _ours_and_verl("paper_4_sop", experiment=experiment)
    a, cap = cfg.algo, cfg.rollout.max_response_len

    class Tok:
        def decode(self, ids, skip_special_tokens=True):
            return "Answer: 3"

    def score(**kw):
        return {"score": -1.0, "acc": False, "pred": "3"}

    mgr = DAPORewardManager(c, Tok(), score)
    lengths = sorted({1, cap - a.overlong_cache_len - 1, cap - a.overlong_cache_len, cap - a.overlong_cache_len + 1,
                      cap - a.overlong_cache_len // 2, cap - 1, cap})
    got = []
    for n in lengths:
        responses = torch.zeros(1, cap, dtype=torch.long)
        att = torch.cat([torch.ones(1, 2, dtype=torch.long), (torch.arange(cap) < n).long()[None]], 1)
        obj = functools.partial(np.array, dtype=object)
        data = DataProto.from_dict(tensors={"prompts": torch.ones(1, 2, dtype=torch.long), "responses": responses,
                                            "attention_mask": att},
                                   non_tensors={"data_source": obj(["math_dapo"]),
                                                "reward_model": obj([{"ground_truth": "3"}]), "extra_info": obj([{}])})
        out = mgr.loop.run_until_complete(mgr.run_single(data))
        assert out["reward_extra_info"]["acc"] is False  # the filter metric `acc` is there for dynamic sampling
        got.append(float(out["reward_score"]) - (-1.0))
    want = objective.overlong_punishment(torch.tensor(lengths), max_len=cap, cache_len=a.overlong_cache_len,
                                         factor=a.overlong_factor, mode="soft")
    torch.testing.assert_close(torch.tensor(got, dtype=torch.float32), want, rtol=1e-6, atol=1e-7)
    assert want[-1] == -1.0 and want[0] == 0.0  # the ramp is exercised end to end


def test_the_file_logger_rows_verl_writes_become_our_metrics(tmp_path, monkeypatch):
    """verl's own Tracking(file) writes the metrics file; the launcher's reader turns it into rows and a
    summary that the analysis reads as a native run's."""
    from verl.utils.tracking import Tracking

    path = tmp_path / "verl_metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    tr = Tracking(project_name="p", experiment_name="e", default_backend=["file"])
    tr.log({"val-core/math_dapo/acc/mean@4": 0.25, "val-aux/math_dapo/score/mean@4": -0.5}, step=0)
    for step in (1, 2):
        tr.log({"critic/score/mean": 0.1 * step, "actor/entropy": 1.0 / step, "actor/lr": 1e-6,
                "response_length/mean": 100.0 + step, "training/filter_groups/evicted_samples": 2.0,
                "training/global_step": step}, step=step)
    tr.log({"val-core/math_dapo/acc/mean@4": 0.5}, step=2)
    tr.finish()
    from dapo_exp import rundir

    rows = vb.metric_rows(rundir.read_jsonl(path), prompts_per_step=8, group_size=4)
    summary = vb.summary_fields(rows)
    assert summary["final"]["eval/acc_avg"] == 0.5 and summary["base"]["eval/acc_avg"] == 0.25
    assert summary["steps_done"] == 2
    train = [r for r in rows if "reward/mean" in r]
    assert [r["reward/mean"] for r in train] == pytest.approx([0.1, 0.2])
    assert train[0]["dynamic_sampling/rollouts_per_trained"] == pytest.approx(10 / 8)
    assert train[1]["compute/rollouts_total"] == pytest.approx(2 * 10 * 4)


def test_the_exported_data_loads_through_verls_dataset(tmp_path):
    """The launcher's export (native loader: dedup, template) is what verl's RLHFDataset reads, with the
    prompt as one user message and the ground truth where verl's reward manager looks."""
    import pandas as pd
    from transformers import AutoTokenizer
    from verl.trainer.ppo.utils import create_rl_dataset

    from dapo_exp.backends.verl_launch import export_data
    from dapo_exp.benchmarks.random_models import SIZES, save_random_qwen2

    rows = [{"data_source": "math_dapo", "prompt": [{"role": "user", "content": f"What is {i} + {i}? Answer:"}],
             "ability": "MATH", "reward_model": {"ground_truth": str(2 * i), "style": "rule"},
             "extra_info": {"index": f"i{i}-{rep}"}} for rep in range(3) for i in range(4)]
    pd.DataFrame(rows).to_parquet(tmp_path / "m.parquet")
    save_random_qwen2(str(tmp_path / "model"), SIZES["0.4M"], chat_template=True)
    cfg = ours("experiment=qwen1.5b_dapo_math", f"task.train_source={tmp_path / 'm.parquet'}",
               f"task.eval_source={tmp_path / 'm.parquet'}", f"out_dir={tmp_path / 'run'}")
    assert export_data(cfg, tmp_path / "run") == {"train": 4, "eval": 4}  # deduplicated by prompt, as natively
    job = vb.translate(cfg, label="x")
    with initialize_config_dir(config_dir=VERL_CONF, version_base=None):
        c = compose("ppo_trainer", overrides=job.overrides)
    ds = create_rl_dataset(c.data.train_files, c.data, AutoTokenizer.from_pretrained(tmp_path / "model"), None)
    item = ds[2]
    assert len(ds) == 4 and item["data_source"] == vb.DATA_SOURCE
    assert item["raw_prompt"] == [{"role": "user", "content": "What is 2 + 2? Answer:"}]
    assert item["reward_model"]["ground_truth"] == "4"


# --------------------------------------------------------------------------- #
# Top-entropy tokens and rollout correction                                     #
# --------------------------------------------------------------------------- #
def test_top_entropy_is_refused_on_verl_naming_the_key():
    with pytest.raises(vb.Untranslatable, match=r"algo.top_entropy=True has no verl 0.9.1 counterpart.*entropy mask"):
        translated("dapo_32b_paper", "full", "top_entropy=enabled")


ROLLOUT_CORRECTIONS = [
    (("rollout_correction=enabled",), "sequence", 2.0),
    (("rollout_correction=icepop",), "token", "0.5_5.0"),
    (("rollout_correction=enabled", "algo.rc_level=token", "algo.rc_cap=3.0"), "token", 3.0),
    (("rollout_correction=enabled", "algo.rc_band_low=0.25", "algo.rc_band_high=2.0"), "sequence", "0.25_2.0"),
]


@pytest.mark.parametrize("extra, level, threshold", ROLLOUT_CORRECTIONS)
def test_rollout_correction_composes_against_verls_config(extra, level, threshold):
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.utils.config import omega_conf_to_dataclass

    for preset in ("grpo", "full"):
        c = verl_config("dapo_32b_paper", preset, *extra)
        rc = omega_conf_to_dataclass(c.algorithm.rollout_correction, RolloutCorrectionConfig)  # verl's typed config
        assert (rc.rollout_is, rc.rollout_is_threshold, rc.rollout_rs, rc.bypass_mode) == (level, threshold, None, False)
        assert c.actor_rollout_ref.rollout.calculate_log_probs  # verl's default: the engine's log-probs are there
    off = verl_config("dapo_32b_paper", "full")
    assert off.algorithm.rollout_correction.rollout_is is None  # switch off: verl's default, no correction


@pytest.mark.parametrize("extra, key", [
    (("algo.rc_aggregation=geometric",), r"algo\.rc_aggregation='geometric' has no verl"),
    (("algo.rc_cap=null", "algo.rc_band_low=0.5", "algo.rc_band_high=2.0"), r"algo\.rc_cap=None has no verl"),
    (("algo.rc_cap=2.0", "algo.rc_band_low=0.5", "algo.rc_band_high=5.0"), r"algo\.rc_cap=2\.0 has no verl"),
])
def test_untranslatable_rollout_corrections_are_refused_naming_the_key(extra, key):
    with pytest.raises(vb.Untranslatable, match=key):
        translated("dapo_32b_paper", "full", "rollout_correction=enabled", *extra)


DPPO_EXTRA = ("dppo_tv=enabled", "algo.dual_clip=null", "algo.dppo_tv_high=0.05", "algo.dppo_tv_cap=1.2")


@pytest.mark.parametrize("key, value", [("actor_rollout_ref.actor.clip_ratio_c", 1e10),
                                        ("actor_rollout_ref.actor.clip_ratio_high", 0.15),
                                        ("actor_rollout_ref.actor.policy_loss.loss_mode", "vanilla")])
def test_a_changed_dppo_value_breaks_the_equivalence(key, value):
    """DPPO's cap is verl's clip_ratio_c (GRPO's dual-clip rule leaves it to DPPO's), its bounds clip_ratio_low/high."""
    _, c = _ours_and_verl("grpo", *DPPO_EXTRA)
    a = c.actor_rollout_ref.actor
    assert (a.policy_loss.loss_mode, a.clip_ratio_low, a.clip_ratio_high, a.clip_ratio_c) == ("dppo_tv", 0.15, 0.05, 1.2)
    d = batch()
    v_adv, v_loss, _ = verl_side(c, d)
    bad = copy.deepcopy(c)
    OmegaConf.update(bad, key, value)
    assert not torch.allclose(verl_side(bad, d)[1], v_loss, rtol=1e-6), key
