"""Translate a resolved dapo-exp config into verl's: overrides of ``verl/trainer/config/ppo_trainer.yaml``.

Pure functions, no verl import (verl lives in its own virtualenv): :func:`translate` maps a
config to a :class:`VerlJob` (Hydra overrides for ``python -m verl.trainer.main_ppo`` and the
environment of that process). Every key of the config has one :class:`Rule` in :data:`RULES`
(the table of docs/reference/verl.md is :func:`markdown_table`): a verl key, something the launcher does, or a
knob of the native trainer that must keep its default. A value verl cannot honour raises
:class:`Untranslatable` naming the key, before anything is launched; nothing is dropped silently.

The fixes go through their registry: each fix's module declares the rule of each of its ``algo``
keys (``Fix.verl``, built with :mod:`dapo_exp.fixes.verl_rules`; :data:`FIX_RULES` collects them); a
fix with no rules (an extension's ``algo.ext.<key>``, or a new fix not yet translated) is refused by
name when it is on, and must hold its defaults when it is off.

Written against verl 0.9.1 (:data:`VERL_VERSION`), whose default trainer is the "V1" trainer
(``trainer.use_v1=true``): Dynamic Sampling is its replay buffer's group filter
(``algorithm.filter_groups``: refill, surplus discarded, **no cap on refills**), the overlong buffer
is the DAPO reward manager of its reward loop (``reward.reward_manager.name=dapo``,
``reward.reward_kwargs``), and Overlong Filtering, which verl has no switch for, is our agent loop
:mod:`dapo_exp.backends.verl_ext` (loaded through ``actor_rollout_ref.model.external_lib``).
Every key used here is checked against verl's installed config by ``tests/test_verl_backend.py``.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dapo_exp import fixes
from dapo_exp.config import Config
from dapo_exp.fixes import grpo
from dapo_exp.fixes.grpo import NO_DUAL_CLIP, VERL_ADV_EPS  # noqa: F401 - re-exported
from dapo_exp.fixes.verl_rules import VERL_VERSION, Context, Rule, Untranslatable, to, unused  # noqa: F401 - re-exported
from dapo_exp.fixes.verl_rules import A as _A
from dapo_exp.fixes.verl_rules import R as _R
from dapo_exp.fixes.verl_rules import fail as _fail
from dapo_exp.fixes.verl_rules import only as _only
from dapo_exp.fixes.verl_rules import render as _render

EXT_MODULE = "dapo_exp.backends.verl_ext"  # imported by verl's workers (actor_rollout_ref.model.external_lib)
OF_AGENT_LOOP = "dapo_exp_overlong_filtering"  # the agent loop it registers
FILTERED_LINE = "[dapo-exp] overlong filtering: a truncated response masked out of the loss"  # its log line
DATA_DIR = "verl_data"  # under the run directory: the exported train / eval parquet files
DATA_SOURCE = "math_dapo"  # verl's default_compute_score -> verl.utils.reward_score.math_dapo
MODEL_DIR = "verl_model"  # under the run directory: model.path=tiny's warm start, as verl loads it
OWN_REWARD_TASKS = ("arith",)  # tasks verl has no scorer for: the native verifier is verl's reward function
REWARD_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "verl_reward.py")
CPU_MODULE = "dapo_exp.backends.verl_cpu"  # verl's CPU platform and patches (train.device=cpu)
CPU_RAY_CPUS = 32  # logical CPUs of a CPU-mode job's Ray (TransferQueue alone starts 9 one-CPU actors)
TINY_POSITIONS = 256  # model.path=tiny's max_position_embeddings (dapo_exp.models.build_tiny_model)


@dataclass
class VerlJob:
    """A translated job: ``python -m verl.trainer.main_ppo <overrides>`` with ``env`` set."""

    overrides: list[str]
    env: dict[str, str]
    values: dict[str, Any]  # the overrides as {key: value} (before rendering)
    not_translated: dict[str, str] = field(default_factory=dict)  # key -> why it needs no verl key


# --------------------------------------------------------------------------- #
# Rendering                                                                     #
# --------------------------------------------------------------------------- #
def render_override(key: str, value: Any) -> str:
    """``key=value`` in Hydra's override grammar (strings quoted when they need it)."""
    return f"{key}={_render(value)}"


# --------------------------------------------------------------------------- #
# Rule builders                                                                 #
# --------------------------------------------------------------------------- #
_SCHEMA = OmegaConf.structured(Config)


def native_only(why: str) -> Rule:
    """A knob of the native trainer with no effect on the algorithm: its default is accepted (it
    means nothing to verl), any other value fails (verl cannot honour it)."""
    return Rule(f"none: {why}; must keep its default", lambda v, ctx: {}, default_only=True)


# --------------------------------------------------------------------------- #
# GRPO (its own keys, fixes/grpo.VERL) and the fixes (dapo_exp.fixes.FIXES): by the rules in their own modules  #
# --------------------------------------------------------------------------- #
GRPO_RULES: dict[str, Rule] = {f"algo.{k}": rule for k, rule in grpo.VERL.items()}  # GRPO's own keys (fixes/grpo.py)
FIX_RULES: dict[str, Rule] = {f"algo.{k}": rule for fix in fixes.FIXES.values() for k, rule in fix.verl.items()}


# --------------------------------------------------------------------------- #
# Everything else                                                               #
# --------------------------------------------------------------------------- #
_PRECISION = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def _compute_dtype(v: Any, ctx: Context) -> dict[str, Any]:
    """The native trainer's compute dtype: autocast in model.dtype when train.bf16 says so, float32 otherwise.

    verl's FSDP engine computes in ``fsdp_config.mixed_precision.param_dtype`` (bf16 when that dict is
    unset, whatever ``fsdp_config.dtype`` says: only Megatron reads ``dtype``), so both are set, for the
    actor and the reference. Unset, a float32 run here trained in bf16 on verl's side; on a CPU without
    bf16 instructions (AVX2 only) that is emulated, about 28 times slower than float32 per matmul."""
    flag, dtype = str(v).lower(), ctx.cfg.model.dtype
    half = {"bfloat16": "bfloat16", "float16": "float16", "auto": "bfloat16"}.get(dtype)
    on = flag == "true" or (flag == "auto" and half is not None)
    compute = (half or "bfloat16") if on else "float32"
    precision = {"param_dtype": _PRECISION[compute], "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    out: dict[str, Any] = {}
    for role in (_A, "actor_rollout_ref.ref."):
        out[role + "fsdp_config.dtype"] = compute
        out["+" + role + "fsdp_config.mixed_precision"] = precision
    return out


def _test_freq(v: int, ctx: Context) -> dict[str, Any]:
    # ours: 0 = before and after training only; verl validates at the last step whenever test_freq > 0
    return {"trainer.test_freq": v if v > 0 else max(1, ctx.cfg.train.steps)}


def _eval_len(v: int | None, ctx: Context) -> dict[str, Any]:
    if v is not None and v != ctx.cfg.rollout.max_response_len:
        _fail("eval.max_response_len", v, "verl validates with the training cap data.max_response_length")
    return {}


def _wandb(rule: Callable[[Any, Context], dict[str, Any]]) -> Callable[[Any, Context], dict[str, Any]]:
    """A W&B setting: read only with logger.backend=wandb (as natively)."""
    return lambda v, ctx: rule(v, ctx) if ctx.cfg.logger.backend == "wandb" else {}


def _loggers(v: str, ctx: Context) -> dict[str, Any]:
    return {"trainer.logger": ["console", "file"] + (["wandb"] if v == "wandb" else [])}


def _wandb_tags(v: list, ctx: Context) -> dict[str, Any]:
    on = [k for k, is_on in fixes.switches(ctx.cfg.algo).items() if is_on]
    return {"$WANDB_TAGS": ",".join(on + [f"preset:{ctx.cfg.preset}", f"label:{ctx.label}", *v])}


def _group(v: str | None, ctx: Context) -> dict[str, Any]:
    group = v or (None if ctx.cfg.sweep == "default" else ctx.cfg.sweep)
    return {"$WANDB_RUN_GROUP": group} if group else {}


def _task(v: str, ctx: Context) -> dict[str, Any]:
    data = os.path.join(ctx.out, DATA_DIR)
    out = {"data.train_files": os.path.join(data, "train.parquet"), "data.val_files": os.path.join(data, "eval.parquet")}
    if v in OWN_REWARD_TASKS:  # scored by the native verifier (verl_reward.py), through verl's DAPO reward manager
        out.update({"reward.custom_reward_function.path": REWARD_FILE, "reward.custom_reward_function.name":
                    "compute_score", "$DAPO_VERL_VERIFIER": ctx.cfg.task.verifier})
    return out


def _verifier(v: str, ctx: Context) -> dict[str, Any]:
    if ctx.cfg.task.name in OWN_REWARD_TASKS:
        return {"reward.reward_manager.name": "dapo"}  # the native verifier itself (_task), any of them
    if v != "math_dapo":
        _fail("task.verifier", v, f"verl's math_dapo reward is the paper's rule (rows get data_source={DATA_SOURCE})")
    return {"reward.reward_manager.name": "dapo"}


def _model_path(v: str, ctx: Context) -> dict[str, Any]:
    if v == "tiny":  # the native warm start, exported by the launcher with a tokenizer verl and vLLM load
        return {"actor_rollout_ref.model.path": os.path.join(ctx.out, MODEL_DIR)}
    from dapo_exp.packaged_models import is_packaged, packaged_directory

    if is_packaged(v):  # the converted directory (the preflight obtained and converted it before the launch)
        return {"actor_rollout_ref.model.path": packaged_directory(v, ctx.cfg.model.package_cache)}
    return {"actor_rollout_ref.model.path": os.path.expanduser(v)}


def _max_prompt_len(v: int, ctx: Context) -> dict[str, Any]:
    # the toy's model has 256 positions and vLLM refuses a max_model_len above them: its prompts (at most
    # ~25 tokens) get the room the model leaves after the response cap
    if ctx.cfg.model.path == "tiny":
        v = min(v, TINY_POSITIONS - ctx.cfg.rollout.max_response_len)
    return {"data.max_prompt_length": v}


def cpu_overrides(ctx: Context) -> dict[str, Any]:
    """``train.device=cpu``: verl's V1 trainer on this machine's CPU (tests, CI, laptops). verl's keys that
    have no CPU default, and the environment that loads :mod:`dapo_exp.backends.verl_cpu` (verl's CPU
    platform and patches) in every process of the job."""
    gpus = ctx.cfg.backend.nnodes * ctx.cfg.backend.gpus_per_node
    # logical resources: Ray hands verl's pools "GPUs" (they hard-code use_gpu=True) and TransferQueue's
    # storage actors a CPU each; Ray accepts both on a CPU host, whatever its core count. Under SLURM the job
    # script's `ray start` declares them (a driver joining a cluster may not), see verl_slurm.sbatch_script.
    # Locally no Ray dashboard: its ten head processes hold about 0.9 GB and nothing here reads them
    ray = ({} if ctx.cfg.backend.launch == "slurm" else
           {"+ray_kwargs.ray_init.num_gpus": gpus, "ray_kwargs.ray_init.num_cpus": CPU_RAY_CPUS,
            "+ray_kwargs.ray_init.include_dashboard": False})
    return {
        "trainer.device": "cpu",
        **ray,
        # no FlashAttention, no padding-free kernels; FSDP2 (FSDP1 refuses CPU parameters)
        "+actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
        "actor_rollout_ref.model.use_remove_padding": False,
        _A + "strategy": "fsdp2", "actor_rollout_ref.ref.strategy": "fsdp2",
        _A + "fsdp_config.use_torch_compile": False, "actor_rollout_ref.ref.fsdp_config.use_torch_compile": False,
        # vLLM's CPU build has no sleep mode (its memory is the host's)
        _R + "free_cache_engine": False, "+" + _R + "enable_sleep_mode": False,
        # one worker each: a CPU machine's cores are few
        _R + "agent.num_workers": 1, "data.dataloader_num_workers": 0,
        # TransferQueue's storage: verl's recommended 2 units a node, not its default 8 (each unit a process of
        # about 470 MB that polls: 8 held 3.7 GB and took 13 CPU-s a minute of a toy run here, 2026-11-29)
        "transfer_queue.backend.SimpleStorage.num_data_storage_units": 2 * ctx.cfg.backend.nnodes,
        "$VERL_PLATFORM": "cpu", "$VERL_ENGINE_DEVICE": "cuda",  # the engine registry knows cuda's FSDP engine only
        "$VERL_USE_EXTERNAL_MODULES": CPU_MODULE, "$VLLM_TARGET_DEVICE": "cpu", "$VLLM_CPU_KVCACHE_SPACE": "1",
    }


def _device(v: str, ctx: Context) -> dict[str, Any]:
    if v == "cpu":
        return cpu_overrides(ctx)
    return {"trainer.device": "cuda"}


def _on_cpu(ctx: Context) -> bool:
    return ctx.cfg.train.device == "cpu"


def _steps(v: int, ctx: Context) -> dict[str, Any]:
    # verl stops at total_training_steps; total_epochs only has to be large enough (>= 1 prompt per step)
    return {"trainer.total_training_steps": v, "trainer.total_epochs": max(1, v)}


def _mini_batch(v: int, ctx: Context) -> dict[str, Any]:
    return {_A + "ppo_mini_batch_size": v // ctx.cfg.rollout.n}  # verl counts prompts, x rollout.n


def _token_budget(v: int | None, ctx: Context) -> dict[str, Any]:
    if v is None:
        return {_A + "use_dynamic_bsz": False}
    return {_A + "use_dynamic_bsz": True, _A + "ppo_max_token_len_per_gpu": v}


def _betas(v: float, ctx: Context) -> dict[str, Any]:
    return {_A + "optim.betas": [ctx.cfg.optim.beta1, ctx.cfg.optim.beta2]}


def _seed(v: int, ctx: Context) -> dict[str, Any]:
    return {"data.seed": v, _R + "seed": v, _A + "data_loader_seed": v, _A + "fsdp_config.seed": v,
            "trainer.experiment_name": f"{ctx.label}-s{v}"}


def _randomness(v: str, ctx: Context) -> dict[str, Any]:
    # verl has no per-purpose keys; its closest is full determinism: batch-invariant vLLM and every
    # request seeded with rollout.seed (+ the replica's rank), deterministic training kernels
    if v == "stream":
        return {}
    if v != "keyed":
        _fail("train.randomness", v, "choose stream or keyed")
    return {_R + "full_determinism": True, _A + "fsdp_config.full_determinism": True}


def _out_dir(v: str, ctx: Context) -> dict[str, Any]:
    return {"trainer.default_local_dir": os.path.join(ctx.out, "checkpoints"), "trainer.resume_mode": "auto"}


def _backend(v: str, ctx: Context) -> dict[str, Any]:
    # the V1 trainer is verl's default and the one with DAPO's group filter; pinned so it cannot drift
    return {"trainer.use_v1": True, "trainer.v1.trainer_mode": "sync"}


def _extra(v: list, ctx: Context) -> dict[str, Any]:
    return {}  # appended verbatim by translate(), after a check that they set no translated key


OTHER_RULES: dict[str, Rule] = {
    "seed": Rule("`data.seed`, `actor_rollout_ref.rollout.seed`, `actor_rollout_ref.actor.data_loader_seed`, "
                 "`actor_rollout_ref.actor.fsdp_config.seed`; `trainer.experiment_name` = label-s<seed>", _seed),
    "preset": unused("recorded (W&B tag `preset:<name>`, config.json)"),
    "sweep": unused("the default W&B group (see logger.group)"),
    "out_dir": Rule("`trainer.default_local_dir=<out_dir>/checkpoints`, `trainer.resume_mode=auto`; the data "
                    "export and verl's file logger also write there", _out_dir),
    "notes": unused("recorded"),
    "run.on_config_change": unused("applied to the run directory before launch, as for the native backend"),
    # algo, beyond GRPO and the fixes
    "algo.ext": _only("algo.ext", {}, "extension fixes have no verl translation"),
    # task: exported by the launcher with the native loaders (same dedup, template, limit)
    "task.name": Rule("`data.train_files`, `data.val_files` = the launcher's export "
                      f"`<out_dir>/{DATA_DIR}/{{train,eval}}.parquet` (`arith` fails)", _task),
    "task.train_source": unused("read by the launcher's export (dapo_exp.tasks, deduplicated as natively)"),
    "task.eval_source": unused("read by the launcher's export"),
    "task.eval_limit": unused("applied by the launcher's export"),
    "task.verifier": Rule("`reward.reward_manager.name=dapo` (math tasks: only `math_dapo`, verl's own rule, rows "
                          f"with data_source={DATA_SOURCE}; `arith`: the native verifier, any of them, as verl's "
                          "`reward.custom_reward_function`)", _verifier),
    "task.verifier_timeout_s": native_only("the native verifier pool's per-answer deadline"),
    "task.verifier_workers": Rule("`reward.num_workers` (null: verl's default; 1 with `train.device=cpu`)",
                                  lambda v, ctx: {"reward.num_workers": v} if v is not None else
                                  ({"reward.num_workers": 1} if _on_cpu(ctx) else {})),
    "task.chat_template": _only("task.chat_template", True, "verl renders every prompt through the chat template"),
    "task.max_prompt_len": Rule("`data.max_prompt_length` (`model.path=tiny`: at most its 256 positions less "
                                "`rollout.max_response_len`)", _max_prompt_len),
    **{f"task.{k}": unused("task=arith only: read by the launcher's export, which generates the problems natively") for k in
       ("arith_seed", "arith_n_train", "arith_n_eval", "arith_max_operand", "arith_n_operands_max", "arith_ops")},
    **{f"task.{k}": unused("read by the launcher's export, which writes each problem's messages (system message, "
                           "worked examples, question) into verl's prompt column") for k in
       ("system_prompt", "level", "few_shot")},
    # model
    "model.name": unused("a label, recorded"),
    "model.path": Rule(f"`actor_rollout_ref.model.path` (`tiny`: the native warm start, exported by the launcher to "
                       f"`<out_dir>/{MODEL_DIR}` with a tokenizer verl and vLLM load; a packaged model, e.g. "
                       f"`smollm2-135m-instruct`: its converted directory under `model.package_cache`)", _model_path),
    "model.dtype": to(_R + "dtype"),
    "model.trust_remote_code": to("actor_rollout_ref.model.trust_remote_code", "data.trust_remote_code"),
    "model.gradient_checkpointing": to("actor_rollout_ref.model.enable_gradient_checkpointing"),
    **{f"model.{k}": unused("model.path=tiny only: the native warm start (shipped, cached or built by these keys) is "
                            "what the launcher exports") for k in
       ("hidden_size", "num_layers", "num_heads", "warmstart_steps", "warmstart_lr", "warmstart_batch_size",
        "warmstart_guess_frac", "warmstart_guess_off_frac", "warmstart_wrong_frac", "warmstart_long_frac",
        "warmstart_loop_frac", "warmstart_step_first_frac", "warmstart_step_marker", "cache_dir",
        "warmstart_source")},
    **{f"model.{k}": unused("packaged models only: where the model comes from and is converted (the launcher passes "
                            "verl the converted directory)") for k in ("wheel", "package_cache")},
    # rollout
    "rollout.engine": _only("rollout.engine", "vllm", "verl generates with vLLM (rollout=vllm)",
                            {_R + "name": "vllm", _R + "top_k": -1}),
    "rollout.n": to(_R + "n"),
    "rollout.max_response_len": to("data.max_response_length"),
    "rollout.temperature": to(_R + "temperature"),
    "rollout.top_p": to(_R + "top_p"),
    "rollout.gen_batch_size": unused("the HF engine's generate batch: how many sequences one call samples, a speed "
                                     "and memory knob with the same distribution (verl's vLLM batches requests "
                                     "itself)"),
    "rollout.decode": native_only("the HF engine's sampling loop (verl samples with vLLM)"),
    "rollout.vllm_gpu_memory_utilization": to(_R + "gpu_memory_utilization"),
    "rollout.vllm_sleep": Rule(f"`{_R}free_cache_engine` (false with `train.device=cpu`)",
                               lambda v, ctx: {} if _on_cpu(ctx) else {_R + "free_cache_engine": v}),
    "rollout.vllm_enforce_eager": to(_R + "enforce_eager"),
    # train
    "train.steps": Rule("`trainer.total_training_steps` (and `trainer.total_epochs` large enough)", _steps),
    "train.prompts_per_step": to("data.train_batch_size"),
    "train.mini_batch_size": Rule(f"`{_A}ppo_mini_batch_size` = mini_batch_size / rollout.n (verl counts prompts)",
                                  _mini_batch),
    "train.micro_batch_size": to(_A + "ppo_micro_batch_size_per_gpu", _R + "log_prob_micro_batch_size_per_gpu",
                                 "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"),
    "train.token_budget": Rule(f"`{_A}use_dynamic_bsz`, `{_A}ppo_max_token_len_per_gpu` (null: off)", _token_budget),
    "train.ppo_epochs": to(_A + "ppo_epochs"),
    "train.recompute_old_logprobs": native_only("where the native trainer takes on-policy old log-probs from "
                                                "(verl decides this itself)"),
    "train.device": Rule("`trainer.device=cuda`; `cpu`: `trainer.device=cpu` and the CPU mode's settings "
                         "(`cpu_overrides`: logical Ray GPUs, SDPA, FSDP2, no sleep mode, one worker each, "
                         "2 TransferQueue storage units a node, no Ray dashboard, "
                         "`dapo_exp.backends.verl_cpu` loaded in every process)", _device),
    "train.bf16": Rule(f"`{_A}fsdp_config.mixed_precision` and `.dtype` (+ ref): the compute dtype, as the native "
                       "autocast (float32 unless bf16 is on)", _compute_dtype),
    "train.torch_compile": to(_A + "use_torch_compile"),
    "train.logprob_chunk": native_only("the native trainer's log-prob chunking (memory)"),
    "train.randomness": Rule(f"keyed: `{_R}full_determinism=true`, `{_A}fsdp_config.full_determinism=true` "
                             "(verl's full determinism: batch-invariant vLLM, every request seeded with the rollout "
                             "seed; no per-purpose keys); stream: none", _randomness),
    "train.share_prompt_forward": unused("the native trainer's shared prompt forward, a speed knob with the same "
                                         "result (verl packs rows its own way)"),
    # optim
    "optim.lr": Rule(f"`{_A}optim.lr` (`lr_scheduler_type=constant`)",
                     lambda v, ctx: {_A + "optim.lr": v, _A + "optim.lr_scheduler_type": "constant"}),
    "optim.warmup_steps": to(_A + "optim.lr_warmup_steps"),
    "optim.weight_decay": to(_A + "optim.weight_decay"),
    "optim.grad_clip": Rule(f"`{_A}optim.clip_grad` (0 = off: inf)",
                            lambda v, ctx: {_A + "optim.clip_grad": v if v > 0 else math.inf}),
    "optim.beta1": Rule(f"`{_A}optim.betas`", _betas),
    "optim.beta2": Rule(f"`{_A}optim.betas`", _betas),
    # eval
    "eval.every": Rule("`trainer.test_freq` (0: the last step only)", _test_freq),
    "eval.before_training": to("trainer.val_before_train"),
    "eval.k": Rule(f"`{_R}val_kwargs.n` (`do_sample=true`)",
                   lambda v, ctx: {_R + "val_kwargs.n": v, _R + "val_kwargs.do_sample": True}),
    "eval.temperature": to(_R + "val_kwargs.temperature"),
    "eval.top_p": to(_R + "val_kwargs.top_p"),
    "eval.max_response_len": Rule("none (only null or = rollout.max_response_len: verl validates at the training cap)",
                                  _eval_len),
    "eval.problems": _only("eval.problems", None, "verl evaluates the whole held-out set: pass eval.problems=null "
                           "(the real-scale presets do; the toy's 64 is the native trainer's)"),
    "eval.final_problems": _only("eval.final_problems", None, "verl's last validation is like the others: pass "
                                 "eval.final_problems=null (the real-scale presets do; the toy's 256 is native)"),
    "eval.final_samples": _only("eval.final_samples", None, "verl's last validation is like the others: pass "
                                "eval.final_samples=null (the real-scale presets do; the toy's 8 is native)"),
    "eval.final_repeats": native_only("repeats of the native final evaluation"),
    "eval.endpoint": unused("recorded: the endpoint the native summary and the table declare"),
    "eval.endpoint_k": unused("recorded, with eval.endpoint"),
    "eval.save_samples": Rule("`trainer.validation_data_dir=<out_dir>/verl_eval_samples` (false: null)",
                              lambda v, ctx: {"trainer.validation_data_dir": os.path.join(ctx.out, "verl_eval_samples")
                                              if v else None}),
    # logger: verl's Tracking reads the W&B group, tags, mode and entity from the environment
    "logger.backend": Rule("`trainer.logger=[console,file(,wandb)]` (file: the metrics the launcher reads back)",
                           _loggers),
    "logger.project": to("trainer.project_name"),
    "logger.entity": Rule("env `WANDB_ENTITY`", _wandb(lambda v, ctx: {"$WANDB_ENTITY": v} if v else {})),
    "logger.group": Rule("env `WANDB_RUN_GROUP` (null: the sweep name)", _wandb(_group)),
    "logger.mode": Rule("env `WANDB_MODE`", _wandb(lambda v, ctx: {"$WANDB_MODE": v})),
    "logger.tags": Rule("env `WANDB_TAGS` (with the enabled fixes, preset and label, as natively)",
                        _wandb(_wandb_tags)),
    "logger.progress_every_s": unused("console display of the native loop (verl prints its own progress)"),
    # checkpoint
    "checkpoint.every": Rule("`trainer.save_freq` (0: the last step only)",
                             lambda v, ctx: {"trainer.save_freq": v if v > 0 else max(1, ctx.cfg.train.steps)}),
    "checkpoint.keep": to("trainer.max_actor_ckpt_to_keep"),
    # backend
    "backend.name": Rule("`trainer.use_v1=true`, `trainer.v1.trainer_mode=sync`", _backend),
    "backend.python": unused("the interpreter the launcher runs verl with"),
    "backend.nnodes": to("trainer.nnodes"),
    "backend.gpus_per_node": to("trainer.n_gpus_per_node"),
    "backend.rollout_tp": to(_R + "tensor_model_parallel_size"),
    "backend.sp_size": to(_A + "fsdp_config.ulysses_sequence_parallel_size",
                          "actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size"),
    "backend.launch": unused("how the launcher starts verl: here, under a local Ray (local), or as an sbatch job "
                             "that starts a Ray cluster over its nodes (slurm)"),
    "backend.slurm": unused("the sbatch script's site settings (backend.launch=slurm)"),
    "backend.extra": Rule("appended verbatim (a key the translation sets is refused)", _extra),
    "backend.dry_run": unused("the launcher prints the command instead of running it"),
}

RULES: dict[str, Rule] = {**GRPO_RULES, **FIX_RULES, **OTHER_RULES}
DICT_LEAVES = {"algo.ext", "notes", "backend.slurm"}  # dict-valued keys translated as one value


# --------------------------------------------------------------------------- #
# The translation                                                               #
# --------------------------------------------------------------------------- #
def _leaves(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for k, v in node.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict) and path not in DICT_LEAVES:
            out += _leaves(v, path + ".")
        else:
            out.append((path, v))
    return out


def _check_default(path: str, value: Any) -> None:
    default = OmegaConf.select(_SCHEMA, path)
    if value != default:
        _fail(path, value, RULES[path].verl.removeprefix("none: ").removesuffix("; must keep its default")
              + f" (its default {default!r} is accepted: it means nothing to verl)")


def _apply(path: str, value: Any, ctx: Context, out: dict[str, Any], skipped: dict[str, str],
           rule: Rule | None = None) -> None:
    rule = rule or RULES[path]
    if rule.default_only:
        _check_default(path, value)
    produced = rule.fn(value, ctx)
    if not produced:
        skipped[path] = rule.verl
    for key, val in produced.items():
        if key in out and out[key] != val:
            raise AssertionError(f"rules disagree on {key}: {out[key]!r} vs {val!r} (at {path})")
        out[key] = val


def _translate_fix(fix: fixes.Fix, ctx: Context, out: dict[str, Any], skipped: dict[str, str]) -> set[str]:
    """Apply the rules of ``fix``'s keys; returns their paths. A key without a rule is refused, naming the fix,
    when the fix is on; when it is off, each such key must hold its default (then nothing reaches verl)."""
    cfg, paths = ctx.cfg, [f"algo.{key}" for key in fix.keys]
    for path in paths:
        value = OmegaConf.select(cfg, path)
        rule = FIX_RULES.get(path) or fix.verl.get(path.removeprefix("algo."))  # a fix registered after this import too
        if rule is not None:
            _apply(path, value, ctx, out, skipped, rule)
            continue
        why = f"fix {fix.name!r} declares it and there is no verl translation for it (no rule in its Fix.verl)"
        if fixes.is_on(fix, cfg.algo):
            _fail(path, value, why + f": run it with backend=native, or switch it off ({fix.name}=disabled)")
        default = OmegaConf.select(_SCHEMA, path)
        if not path.startswith("algo.ext.") and value != default:
            _fail(path, value, why + f"; with the fix off it must keep its default {default!r}")
        skipped[path] = f"none: fix {fix.name!r} is off and has no verl translation"
    return set(paths)


def translate(cfg: DictConfig, *, label: str | None = None) -> VerlJob:
    """The verl job of a resolved dapo-exp config, or :class:`Untranslatable` naming the first key verl
    cannot honour. ``label``: the run label (default: :func:`dapo_exp.hydra_setup.run_label`)."""
    if label is None:
        from dapo_exp.hydra_setup import run_label

        label = run_label(cfg)
    ctx = Context(cfg=cfg, out=os.path.abspath(os.path.expanduser(cfg.out_dir)), label=label, ext_module=EXT_MODULE,
                  agent_loop=OF_AGENT_LOOP)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    values: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    done = set()
    for fix in fixes.FIXES.values():  # the fixes first, through their registry
        done |= _translate_fix(fix, ctx, values, skipped)
    for path, value in _leaves(resolved):
        if path in done:
            continue
        if path not in RULES:
            _fail(path, value, "no rule in dapo_exp/backends/verl.py translates this key")
        _apply(path, value, ctx, values, skipped)
    overrides = [render_override(k, v) for k, v in values.items() if not k.startswith("$")]
    overrides += _checked_extra(list(cfg.backend.extra), values)
    env = {k[1:]: str(v) for k, v in values.items() if k.startswith("$")}
    return VerlJob(overrides=overrides, env=env, values=values, not_translated=skipped)


def _checked_extra(extra: list[str], values: dict[str, Any]) -> list[str]:
    translated = {k.lstrip("+") for k in values}
    for item in extra:
        key = item.split("=", 1)[0].lstrip("+~")
        if key in translated:
            raise Untranslatable(f"backend.extra sets {key}, which the translation sets from the dapo-exp config; "
                                 "change the dapo-exp key instead (docs: reference/verl.md)")
    return extra


def command(job: VerlJob, python: str) -> list[str]:
    """The argv that runs the job: ``<python> -m verl.trainer.main_ppo <overrides>``."""
    return [python, "-m", "verl.trainer.main_ppo", *job.overrides]


def ray_env_overrides(env: dict[str, str]) -> list[str]:
    """``env`` for verl's Ray workers too (``ray_kwargs.ray_init.runtime_env.env_vars``, merged by
    verl's ``run_ppo`` over its own), so that a multi-node job's workers see what the launcher's
    process sees."""
    return [render_override(f"+ray_kwargs.ray_init.runtime_env.env_vars.{k}", str(v)) for k, v in env.items()]


# --------------------------------------------------------------------------- #
# Results: verl's file-logger rows -> the run directory's metrics              #
# --------------------------------------------------------------------------- #
# ours <- verl's, where the two are the same quantity (the other verl names are kept as they are:
# response_length/*, actor/entropy, actor/pg_loss, actor/grad_norm, timing_s/* are already shared)
METRIC_ALIASES = {
    "reward/mean": "critic/score/mean",  # correctness + overlong term, mean over the trained responses
    "optim/lr": "actor/lr",
}
_EVAL_ACC = re.compile(r"^val-core/[^/]+/acc/mean@\d+$")  # avg@k: mean of 1[correct] over problems x k
_EVICTED = "training/filter_groups/evicted_samples"  # groups dropped by the filter (all-equal), this step
_SURPLUS = "training/filter_groups/discarded_surplus_samples"  # kept groups beyond the batch


def _numbers(data: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in data.items() if isinstance(v, (int, float)) and math.isfinite(float(v))}


# verl's response_length/clip_ratio is the share of responses as long as the batch's padded width
# (responses.shape[-1], verl/trainer/ppo/metric_utils.py), which is the cap only when some response reached it;
# a batch padded to its longest response counts every response of that length as clipped (0.75 at a step of
# SmolLM2 whose longest response was 19 of 32 tokens). Ours is the share cut at rollout.max_response_len.
_VERL_CLIP_RATIOS = ("response_length/clip_ratio", "response_length_non_aborted/clip_ratio")
VERL_WIDTH_SHARE = "verl/response_length/at_padded_width"  # verl's value, kept under this name


def _truncated_share(train: dict[str, float], max_response_len: int | None) -> None:
    """``train``'s truncated shares (verl's clip ratios) made ours: where no response reached the cap
    (``response_length/max`` below it) none was truncated, so 0; else verl's value, which is then the share at the
    cap (the padded width is the cap). verl's own value is kept as :data:`VERL_WIDTH_SHARE`."""
    if max_response_len is None or "response_length/clip_ratio" not in train:
        return
    train[VERL_WIDTH_SHARE] = train["response_length/clip_ratio"]
    if train.get("response_length/max", max_response_len) < max_response_len:
        for k in _VERL_CLIP_RATIOS:
            if k in train:
                train[k] = 0.0


def metric_rows(records: list[dict[str, Any]], *, prompts_per_step: int, group_size: int,
                max_response_len: int | None = None) -> list[dict[str, Any]]:
    """verl's file-logger rows (``{"step", "data"}``, every attempt, oldest first) as ``metrics.jsonl`` rows.

    A step logged twice (a resumed attempt re-logs it) keeps the later values. Per step: one training
    row (verl's numeric metrics, plus :data:`METRIC_ALIASES`, plus the dynamic-sampling counts in our
    names: ``dynamic_sampling/zero_var_frac`` = evicted / generated groups, ``rollouts_per_trained`` =
    generated / trained groups with generated = batch + evicted + surplus, and the cumulative
    ``compute/rollouts_total``) and, where verl validated, one eval row with ``eval/acc_avg`` (verl's
    ``val-core/<source>/acc/mean@k``) beside verl's ``val-*`` values. With ``max_response_len`` (the run's
    ``rollout.max_response_len``), the truncated share is the share cut at that cap (:func:`_truncated_share`:
    verl's counts the responses as long as the batch's padded width).
    """
    by_step: dict[int, dict[str, float]] = {}
    for rec in records:
        by_step.setdefault(int(rec["step"]), {}).update(_numbers(rec.get("data") or {}))
    rows, rollouts = [], 0.0
    for step in sorted(by_step):
        data = by_step[step]
        train = {k: v for k, v in data.items() if not k.startswith("val-")}
        evals = {k: v for k, v in data.items() if k.startswith("val-")}
        if train.keys() - {"training/global_step", "training/epoch"}:
            train.update({ours: train[theirs] for ours, theirs in METRIC_ALIASES.items() if theirs in train})
            _truncated_share(train, max_response_len)
            generated = prompts_per_step + train.get(_EVICTED, 0.0) + train.get(_SURPLUS, 0.0)
            rollouts += generated * group_size
            train.update({"dynamic_sampling/zero_var_frac": train.get(_EVICTED, 0.0) / generated,
                          "dynamic_sampling/rollouts_per_trained": generated / prompts_per_step,
                          "compute/rollouts_total": rollouts})
            rows.append({"step": step, **train})
        acc = [v for k, v in evals.items() if _EVAL_ACC.match(k)]
        if evals:
            rows.append({"step": step, **evals, **({"eval/acc_avg": acc[0]} if len(acc) == 1 else {})})
    return rows


def summary_fields(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``final`` / ``best`` / ``base`` evaluations and ``steps_done`` from :func:`metric_rows`' rows, as the
    native summary has them (best: the highest ``eval/acc_avg`` after step 0, the earliest on ties)."""
    evals = {r["step"]: {k: v for k, v in r.items() if k != "step"} for r in rows if "eval/acc_avg" in r}
    trained = [r["step"] for r in rows if "eval/acc_avg" not in r and not any(k.startswith("val-") for k in r)]
    out: dict[str, Any] = {"steps_done": max(trained, default=0)}
    if evals:
        last = max(evals)
        after = [s for s in evals if s > 0] or list(evals)
        best = max(after, key=lambda s: (evals[s]["eval/acc_avg"], -s))
        out.update(final={"step": last, **evals[last]}, best={"step": best, **evals[best]},
                   base={"step": 0, **evals[0]} if 0 in evals else {})
    return out


def markdown_table() -> str:
    """The translation table (docs/reference/verl.md): every dapo-exp key and where it goes in verl."""
    lines = ["| dapo-exp key | verl (0.9.1) |", "|---|---|"]
    for path, rule in RULES.items():
        lines.append(f"| `{path}` | {rule.verl} |")
    for fix in fixes.FIXES.values():  # a fix with no rule at all: refused when on, its defaults when off
        if fix.schema and not any(f"algo.{k}" in FIX_RULES for k in fix.keys):
            lines += [f"| `algo.{k}` | none: fix `{fix.name}` has no verl translation (refused when on; off, its "
                      "default) |" for k in fix.keys]
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table())
