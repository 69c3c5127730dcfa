"""The training loop of GRPO / DAPO, top to bottom.

One rollout step, each line a named function (``dapo_exp.steps`` unless noted)::

    rollout + score (rollout.groups.score_groups: verifier reward + shaping terms)
    -> dynamic sampling (rollout.dynamic_sampling.collect_groups: refill until only mixed groups)
    -> build_batch: advantages (algo.adv_estimator), loss mask (Overlong Filtering)
    -> old_logprobs: the trainer's log-probs of the samples the update cannot score itself
       (and the reference's, KL on)
    -> update_policy: mini-batches of whole groups, micro-batch gradient accumulation
       normalised by the mini-batch (algo.loss_agg), the policy loss of algo.policy_loss,
       per-token advantages x truncated IS weights (algo.tis_cap)
    -> sync the rollout engine -> step_metrics / sampling_metrics -> evaluate -> checkpoint

How it deviates from the paper, honestly: the paper trains a 32B model for
thousands of steps on DAPO-Math-17k; the embedded default is a 0.3M-parameter
policy on a synthetic arithmetic task for 30 steps, which exercises every
mechanism but says nothing about AIME. Old log-probs are always the trainer's
(never taken from the rollout engine): the rows of the first mini-batch (every row
when a batch gets one update) take them from the update forward itself, detached,
before any optimizer step (ratio 1 exactly, as TRL and verl); the other rows are
recomputed by a no-grad forward before the first update
(``train.recompute_old_logprobs=true`` recomputes every row). The KL term is off unless
``algo.kl_coef > 0`` (then a frozen copy of the initial policy is the reference).

``train(cfg)`` is a plain function: ``run.py`` wraps it in ``@hydra.main`` and
tests call it with a composed config.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import math
import os
import random
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from dapo_exp import algorithms, checkpoint, fixes, objective, rundir, steps
from dapo_exp.config import ConfigError, validate
from dapo_exp.console import ProgressLines
from dapo_exp.logprobs import ResponseForward
from dapo_exp.rollout.dynamic_sampling import collect_groups
from dapo_exp.rollout.engine import SamplingSpec
from dapo_exp.rollout.groups import Group, score_groups

log = logging.getLogger("dapo_exp.train")


# =========================================================================== #
# Helpers                                                                       #
# =========================================================================== #
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


class PromptSampler:
    """Walks through the training prompts in a seeded random order, epoch after epoch.

    Its whole state is ``position`` (prompts consumed), so a resumed run continues
    with exactly the prompts an uninterrupted run would have drawn.
    """

    def __init__(self, n: int, seed: int, position: int = 0) -> None:
        self.n, self.seed, self.position = n, seed, position
        self._epoch, self._order = -1, None

    def _order_of(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 7919 + epoch)
            self._order, self._epoch = torch.randperm(self.n, generator=g).tolist(), epoch
        return self._order

    def take(self, k: int) -> list[int]:
        out = []
        for _ in range(k):
            epoch, i = divmod(self.position, self.n)
            out.append(self._order_of(epoch)[i])
            self.position += 1
        return out


class RunStopped(BaseException):
    """The run stopped cleanly on a signal (checkpoint and summary written); a re-run resumes it."""

    def __init__(self, signame: str) -> None:
        super().__init__(f"stopped by {signame}; re-run the same command to resume")
        self.signame = signame


class StopRequest:
    """SIGTERM (SLURM's preemption and time limit) and SIGINT (Ctrl-C) as a clean stop.

    The first signal asks the loop to stop after the current step: it writes a
    checkpoint and a summary with status ``stopped``, then raises :class:`RunStopped`.
    A second signal interrupts at once (``KeyboardInterrupt``: status ``failed``, the
    last checkpoint kept). Installed only in the main thread; the previous handlers
    come back on exit.
    """

    def __init__(self) -> None:
        self.signame: str | None = None
        self._old: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.signame is not None:
            raise KeyboardInterrupt(f"second signal ({name}): stopping at once")
        self.signame = name
        print(f"[dapo-exp] {name}: stopping after this step with a checkpoint; send it again to stop at once",
              flush=True)

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)


def autocast_dtype(cfg: DictConfig, device: torch.device) -> torch.dtype | None:
    """Autocast on CUDA in ``model.dtype`` (``train.bf16``: auto = when 16-bit, true = always bf16)."""
    half = {"bfloat16": torch.bfloat16, "float16": torch.float16, "auto": torch.bfloat16}.get(cfg.model.dtype)
    flag = str(cfg.train.bf16).lower()
    on = device.type == "cuda" and (flag == "true" or (flag == "auto" and half is not None))
    return (half or torch.bfloat16) if on else None


def policy_path(cfg: DictConfig) -> str:
    """``model.path=tiny``: the tiny policy warm-started on the toy task (built once, cached);
    anything else: an HF id or a local directory."""
    if cfg.model.path == "tiny":
        from dapo_exp.tasks.arith_warmstart import ensure_tiny_checkpoint

        return ensure_tiny_checkpoint(cfg.model, cfg.task, cfg.rollout.max_response_len)
    return os.path.expanduser(cfg.model.path)


# =========================================================================== #
# Before any compute                                                            #
# =========================================================================== #
def preflight(cfg: DictConfig) -> None:
    """Every check that needs no model: values (:func:`dapo_exp.config.validate`), names against
    the registries and modes that own them, extension keys, data and model sources."""
    from dapo_exp.models import check_model_source
    from dapo_exp.rollout import ENGINES
    from dapo_exp.tasks import TASKS, check_task_sources
    from dapo_exp.tasks.verifier import VERIFIERS

    validate(cfg)
    a = cfg.algo
    for key, value, choices in (
        ("algo.loss_agg", a.loss_agg, objective.LOSS_AGG_MODES),
        ("algo.kl_estimator", a.kl_estimator, objective.KL_ESTIMATORS),
        ("algo.overlong_punishment", a.overlong_punishment, objective.OVERLONG_PUNISHMENT_MODES),
    ):
        if value not in choices:
            raise ConfigError(f"{key}={value!r} is not valid; choose one of: {', '.join(choices)}")
    for registry, value in ((algorithms.ADVANTAGE_ESTIMATORS, a.adv_estimator),
                            (algorithms.POLICY_LOSSES, a.policy_loss), (TASKS, cfg.task.name),
                            (ENGINES, cfg.rollout.engine), (VERIFIERS, cfg.task.verifier)):
        registry.pick(value)
    declared = {k.removeprefix("ext.") for f in fixes.FIXES.values() for k in f.keys if k.startswith("ext.")}
    unknown = sorted(set(a.ext) - declared)
    if unknown:
        raise ConfigError(f"algo.ext.{unknown[0]} is read by no registered fix (declared extension keys: "
                          f"{', '.join(sorted(declared)) or 'none'}); register the fix first (dapo_exp.fixes)")
    check_model_source(cfg.model.path)
    check_task_sources(cfg.task)


# =========================================================================== #
# Set-up: task, policy, engine, optimizer, resume, tracking                     #
# =========================================================================== #
@dataclass
class Run:
    """Everything the loop holds for one run."""

    cfg: DictConfig
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
    state: dict[str, Any] = field(default_factory=dict)
    start_step: int = 0
    tracker: Any = None
    sampler: PromptSampler | None = None
    writers: dict[str, rundir.JsonlWriter] = field(default_factory=dict)
    stop: StopRequest = field(default_factory=StopRequest)


def _render_prompts(problems: list, tokenizer: Any, use_chat: bool, max_len: int, what: str) -> list[list[int]]:
    from dapo_exp.tasks.base import render_prompt

    prompts = [render_prompt(p.prompt, tokenizer, use_chat) for p in problems]
    too_long = sum(len(p) > max_len for p in prompts)
    if too_long:
        log.warning("%d %s prompts exceed task.max_prompt_len=%d; they are left-truncated", too_long, what, max_len)
        prompts = [p[-max_len:] for p in prompts]
    return prompts


def build_run(cfg: DictConfig, out: Path, label: str, cleanup: list) -> Run:
    """Task, policy (float32 master weights), verifier, prompts, reference, engine and optimizer."""
    from dapo_exp.models import load_policy
    from dapo_exp.rollout import make_engine
    from dapo_exp.tasks import load_task
    from dapo_exp.tasks.verifier import get_verifier

    seed_everything(cfg.seed)
    device = pick_device(cfg.train.device)
    task = load_task(cfg.task)
    model_path = policy_path(cfg)
    # master weights stay float32 whatever model.dtype says: at the paper's lr 1e-6 an
    # AdamW update is far below bfloat16's resolution and would round away. model.dtype
    # is the compute dtype (autocast on CUDA, train.bf16) and the vLLM engine's dtype.
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
    return Run(cfg=cfg, out=out, label=label, device=device, task=task, tokenizer=tokenizer, model=model,
               model_path=model_path, ref_model=ref_model, verifier=verifier, engine=engine,
               train_prompts=train_prompts, eval_prompts=eval_prompts, answers=[p.answer for p in task.train],
               optimizer=optimizer, scheduler=scheduler,
               fwd=fwd)


def resume(run: Run) -> None:
    """Load the newest checkpoint (or start fresh), cut the logs back to it, open the writers."""
    run.state = {
        "sampler_position": 0, "cum_rollouts": 0, "cum_gen_tokens": 0, "cum_trained_rollouts": 0,
        "carry": [], "evals": {}, "wall_time_s": 0.0, "wandb_id": None,
    }
    logs = (rundir.METRICS, rundir.EVAL_SAMPLES, rundir.TRAIN_SAMPLES)
    last = checkpoint.latest(run.out / rundir.CHECKPOINTS)
    logged = [row.get("step", 0) for row in rundir.read_jsonl(run.out / rundir.METRICS)]
    if last is not None:
        run.start_step, run.state = checkpoint.load(last, run.model, run.optimizer, run.scheduler)
        run.engine.sync_weights(run.model)
        later = sum(st > run.start_step for st in logged)
        log.info("resumed from %s (step %d)", last, run.start_step)
        print(f"[dapo-exp] resuming {run.out.name} from its checkpoint at step {run.start_step}"
              + (f"; discarding {later} metric rows logged after it" if later else ""), flush=True)
    else:
        if logged:
            print(f"[dapo-exp] {run.out.name}: no checkpoint, starting over (discarding the {len(logged)} metric rows "
                  f"of an earlier attempt, up to step {max(logged)})", flush=True)
        for f in logs:
            (run.out / f).unlink(missing_ok=True)
    for f in logs:
        rundir.truncate_jsonl(run.out / f, run.start_step)
    run.writers = {f: rundir.JsonlWriter(run.out / f) for f in logs}
    run.sampler = PromptSampler(len(run.train_prompts), run.cfg.seed, run.state["sampler_position"])


def start_tracking(run: Run, resolved: dict, commit: str, switches: dict[str, bool], cleanup: list) -> None:
    """A W&B run or a no-op (the loop never branches on it); resumed runs continue their W&B run."""
    from dapo_exp.tracking import start_tracker

    cfg, st = run.cfg, run.state
    # stable across processes (Python's hash() is salted), so a restarted run continues its W&B run
    st["wandb_id"] = st.get("wandb_id") or f"{run.label}-s{cfg.seed}-{hashlib.sha1(str(run.out).encode()).hexdigest()[:8]}"
    run.tracker = start_tracker(
        cfg.logger.backend, out_dir=str(run.out), config={**resolved, "git_commit": commit, "label": run.label},
        # the W&B group is the sweep (never one shared group for unrelated single runs)
        project=cfg.logger.project, group=cfg.logger.group or (None if cfg.sweep == "default" else cfg.sweep),
        name=f"{run.label}-s{cfg.seed}",
        tags=[k for k, v in switches.items() if v] + [f"preset:{cfg.preset}", f"label:{run.label}"]
        + list(cfg.logger.tags),
        mode=cfg.logger.mode, entity=cfg.logger.entity, run_id=st["wandb_id"],
    )
    cleanup.append(lambda: run.tracker.finish(exit_code=1))


# =========================================================================== #
# One rollout step                                                              #
# =========================================================================== #
def rollout_groups(run: Run, step: int) -> tuple[list[Group], Any, dict[str, float]]:
    """Generate, score and (Dynamic Sampling) filter groups until the batch is full."""
    cfg, a, r = run.cfg, run.cfg.algo, run.cfg.rollout
    shaping = algorithms.active_shaping(a)
    counters = {"verify_timeouts": 0.0, "gen_seconds": 0.0}

    def generate_round(round_idx: int, n_prompts: int) -> list[Group]:
        idx = run.sampler.take(n_prompts)
        prompts = [run.train_prompts[i] for i in idx]
        gens = run.engine.generate(prompts, SamplingSpec(
            n=r.n, max_new_tokens=r.max_response_len, temperature=r.temperature, top_p=r.top_p,
            seed=cfg.seed * 1_000_003 + step * 101 + round_idx))
        counters["gen_seconds"] += gens.stats.get("gen_seconds", 0.0)
        groups, timeouts = score_groups(
            prompt_indices=idx, prompt_ids=prompts, gens=gens, group_size=r.n, answers=[run.answers[i] for i in idx],
            tokenizer=run.tokenizer, verifier=run.verifier, shaping=shaping, algo=a, max_len=r.max_response_len)
        counters["verify_timeouts"] += timeouts
        return groups

    run.engine.wake()
    groups, run.state["carry"], ds = collect_groups(
        generate_round, want=run.cfg.train.prompts_per_step, enabled=a.dynamic_sampling, signal=a.ds_signal,
        max_rounds=a.ds_max_rounds, on_cap=a.ds_on_cap, surplus=a.ds_surplus, oversample=a.ds_oversample,
        carry=run.state["carry"],
    )
    run.engine.sleep()
    return groups, ds, counters


def update_spec(cfg: DictConfig) -> steps.UpdateSpec:
    a, t = cfg.algo, cfg.train
    return steps.UpdateSpec(
        group_size=cfg.rollout.n, mini_batch_size=t.mini_batch_size, micro_batch_size=t.micro_batch_size,
        token_budget=t.token_budget, ppo_epochs=t.ppo_epochs, grad_clip=cfg.optim.grad_clip, loss_agg=a.loss_agg,
        max_len=cfg.rollout.max_response_len, surrogate=algorithms.POLICY_LOSSES.pick(a.policy_loss)(algo=a),
        kl_coef=a.kl_coef, kl_estimator=a.kl_estimator, tis_cap=a.tis_cap,
    )


def train_on(run: Run, groups: list[Group], step: int) -> dict[str, float]:
    """Advantages, masks, old log-probs, the update and the engine sync; returns the step's metrics."""
    cfg, a, t = run.cfg, run.cfg.algo, run.cfg.train
    estimator = algorithms.ADVANTAGE_ESTIMATORS.pick(a.adv_estimator)
    batch = steps.build_batch(groups, group_size=cfg.rollout.n, estimator=lambda rw: estimator(rw, algo=a),
                              overlong_filtering=a.overlong_filtering)
    spec, seed = update_spec(cfg), cfg.seed * 31 + step * 7
    t_train = time.perf_counter()
    # the first mini-batch's rows (every row with one mini-batch) are scored by the update itself
    on_policy = [] if t.recompute_old_logprobs else steps.on_policy_rows(len(groups), spec=spec, seed=seed)
    old = steps.old_logprobs(run.model, batch, fwd=run.fwd, ref_model=run.ref_model,
                             micro_batch_size=t.micro_batch_size, token_budget=t.token_budget, on_policy=on_policy)
    upd = steps.update_policy(run.model, run.optimizer, batch, old, fwd=run.fwd, spec=spec, seed=seed)
    run.engine.sync_weights(run.model)
    t_train = time.perf_counter() - t_train
    tok_adv = steps.token_advantages(batch, old.logp, range(batch.size), tis_cap=a.tis_cap)
    mismatch = steps.rollout_mismatch(batch, old)
    shaping_metrics = {name: term.metric for name, term in algorithms.REWARD_SHAPING.items()}
    m = {**mismatch, **steps.step_metrics(batch, old, upd, tok_adv, shaping_metrics=shaping_metrics,
                                           ppo_epochs=t.ppo_epochs, t_train=t_train)}
    m.update(steps.sample_diagnostics(groups, run.task.train, _diagnostics(cfg)))
    run.state["cum_trained_rollouts"] += batch.size
    run.writers[rundir.TRAIN_SAMPLES].write(steps.train_sample_rows(step, groups))
    return m


def _diagnostics(cfg: DictConfig) -> Any:
    """The task's mechanism diagnostics (:data:`dapo_exp.tasks.DIAGNOSTICS`), or None."""
    from dapo_exp.tasks import DIAGNOSTICS

    return DIAGNOSTICS.get(cfg.task.name)


def run_eval(run: Run, step: int) -> dict[str, float]:
    """Evaluate, record in the run state (for best/final), log."""
    cfg, e = run.cfg, run.cfg.eval
    spec = steps.EvalSpec(k=e.k, max_len=e.max_response_len or cfg.rollout.max_response_len,
                          temperature=e.temperature, top_p=e.top_p, seed=cfg.seed * 1_000_003 + 999_983,
                          micro_batch_size=cfg.train.micro_batch_size, save_samples=e.save_samples)
    fwd = ResponseForward(run.tokenizer.pad_token_id, run.device, cfg.train.logprob_chunk, e.temperature)
    m = steps.evaluate(run.model, run.engine, problems=run.task.eval, prompt_ids=run.eval_prompts,
                       tokenizer=run.tokenizer, verifier=run.verifier, fwd=fwd, spec=spec, step=step,
                       sample_writer=run.writers[rundir.EVAL_SAMPLES], diagnostics=_diagnostics(cfg))
    run.state["evals"][step] = m
    run.writers[rundir.METRICS].write({"step": step, **m})
    run.tracker.log(m, step)
    return m


# =========================================================================== #
# The loop                                                                      #
# =========================================================================== #
def train(cfg: DictConfig) -> dict[str, Any]:
    """Train one run as configured; returns the run summary (also written to summary.json).

    A run whose ``summary.json`` says ``finished`` is skipped (a re-run sweep does
    not redo finished jobs). A run with checkpoints resumes from the newest one. One
    process at a time may write a run directory (:class:`dapo_exp.rundir.RunLock`).
    SIGTERM / SIGINT stop it cleanly after the current step (:class:`StopRequest`).
    ``backend.name`` other than ``native`` hands the job to :func:`dapo_exp.backends.launch`.
    """
    if cfg.backend.name != "native":  # another engine runs the job: translated there (dapo_exp/backends)
        from dapo_exp.backends import launch

        return launch(cfg)
    t_start = time.perf_counter()
    preflight(cfg)  # before any compute
    out = Path(cfg.out_dir).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    previous = rundir.read_summary(out)
    if previous and previous.get("status") == rundir.STATUS_FINISHED:
        log.info("%s already finished (summary.json); skipping", out)
        print(f"[dapo-exp] {out} already finished; skipping (delete summary.json to re-run)")
        return previous

    with rundir.RunLock(out):  # one writer per run directory; a second one is refused here
        return _train_locked(cfg, out, t_start)


def _train_locked(cfg: DictConfig, out: Path, t_start: float) -> dict[str, Any]:
    from dapo_exp.hydra_setup import run_label

    label, switches = run_label(cfg), fixes.switches(cfg.algo)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    commit, env = rundir.git_commit(), rundir.environment()
    rundir.write_json(out / rundir.CONFIG, {"config": resolved, "git_commit": commit, "label": label,
                                            "switches": switches, "environment": env})
    summary: dict[str, Any] = {
        "status": rundir.STATUS_RUNNING, "label": label, "preset": cfg.preset, "switches": switches,
        "seed": cfg.seed, "config": resolved, "git_commit": commit, "environment": env, "error": None,
    }
    cleanup: list = []  # what was opened: closed here if the run fails
    try:
        with StopRequest() as stop:  # from here on SIGTERM / SIGINT stop at the next step boundary
            run = build_run(cfg, out, label, cleanup)
            run.stop = stop
            resume(run)
            start_tracking(run, resolved, commit, switches, cleanup)
            return loop(run, summary, t_start)
    except RunStopped:
        raise  # a clean stop: its summary says "stopped" and everything is closed
    except BaseException as exc:  # KeyboardInterrupt too: record it, keep the checkpoints, re-raise
        summary["traceback"] = traceback.format_exc()
        rundir.record_failure(out, exc, **summary)
        for close in reversed(cleanup):
            try:
                close()
            except Exception:  # noqa: BLE001 - best effort; the original error is what matters
                log.warning("cleanup after failure failed", exc_info=True)
        raise


def loop(run: Run, summary: dict[str, Any], t_start: float) -> dict[str, Any]:
    """Rollout steps from ``run.start_step + 1`` to ``train.steps``, then the summary.

    ``t_start``: when this process started the run (wall time counts set-up too).
    """
    from tqdm.auto import tqdm

    cfg, t, st = run.cfg, run.cfg.train, run.state
    log.info("%s: %s, %.2fM params, %d train / %d eval problems, device %s, rollout %s%s", run.label,
             run.model_path, sum(p.numel() for p in run.model.parameters()) / 1e6, len(run.train_prompts),
             len(run.eval_prompts), run.device, cfg.rollout.engine,
             f" (decode={run.engine.decode_used})" if hasattr(run.engine, "decode_used") else "")
    if cfg.eval.before_training and run.start_step == 0:
        run_eval(run, 0)
    bar = tqdm(range(run.start_step + 1, t.steps + 1), initial=run.start_step, total=t.steps, desc=run.label,
               dynamic_ncols=True, file=sys.stderr, disable=None)
    # plain lines for logs (nohup, SLURM, CI) when the bar is off; the bar is enough on a terminal
    lines = ProgressLines(f"{run.label} s{cfg.seed}", t.steps, cfg.logger.progress_every_s, enabled=bool(bar.disable))
    step = run.start_step
    for next_step in bar:
        if run.stop.signame:  # a signal during the last step (or the set-up): its checkpoint is written
            bar.close()
            stopped(run, summary, step)
        step, t_step = next_step, time.perf_counter()
        groups, ds, counters = rollout_groups(run, step)  # rollouts, rewards, dynamic sampling
        t_gen = time.perf_counter() - t_step
        st["sampler_position"] = run.sampler.position
        st["cum_rollouts"] += ds.rollouts_generated
        st["cum_gen_tokens"] += ds.gen_tokens
        if groups:
            m = train_on(run, groups, step)  # advantages, masks, old log-probs, update, sync
        else:
            m = {}
            log.warning("step %d: no group kept (dynamic sampling partial batch); no update", step)
        m["reward/verify_timeouts"] = counters["verify_timeouts"]
        run.scheduler.step()
        m.update(steps.sampling_metrics(ds, group_size=cfg.rollout.n, gen_seconds=counters["gen_seconds"]))
        m.update({
            "compute/rollouts_total": float(st["cum_rollouts"]),
            "compute/gen_tokens_total": float(st["cum_gen_tokens"]),
            "compute/trained_rollouts_total": float(st["cum_trained_rollouts"]),
            "optim/lr": run.optimizer.param_groups[0]["lr"],
            "timing_s/gen": t_gen,
            "timing_s/step": time.perf_counter() - t_step,
        })
        run.writers[rundir.METRICS].write({"step": step, **m})
        run.tracker.log(m, step)

        ev = run_eval(run, step) if (cfg.eval.every and step % cfg.eval.every == 0 or step == t.steps) else {}
        bar.set_postfix(reward=f"{m.get('reward/mean', float('nan')):.2f}",
                        acc=f"{m.get('reward/acc_mean', float('nan')):.2f}",
                        ent=f"{m.get('actor/entropy', float('nan')):.2f}", s_step=f"{m['timing_s/step']:.1f}",
                        **({"eval": f"{ev['eval/acc_avg']:.2f}"} if ev else {}))
        lines.step(step, m, ev)
        if cfg.checkpoint.every and step % cfg.checkpoint.every == 0 or step == t.steps or run.stop.signame:
            st["wall_time_s"] += time.perf_counter() - t_start
            t_start = time.perf_counter()
            checkpoint.save(run.out / rundir.CHECKPOINTS, step, run.model, run.optimizer, run.scheduler, st,
                            cfg.checkpoint.keep)
    bar.close()
    if t.steps == 0 or (run.start_step == t.steps and not st["evals"]):
        run_eval(run, t.steps)
    st["wall_time_s"] += time.perf_counter() - t_start
    return finish(run, summary, step)


def stopped(run: Run, summary: dict[str, Any], step: int) -> None:
    """A clean stop after ``step`` (its checkpoint written, unless nothing was trained yet): summary
    ``stopped``, close, raise :class:`RunStopped`."""
    summary.update(status=rundir.STATUS_STOPPED, steps_done=step, wall_time_s=run.state["wall_time_s"],
                   error=f"stopped by {run.stop.signame} after step {step}; re-run the same command to resume")
    rundir.write_json(run.out / rundir.SUMMARY, summary)
    run.tracker.finish(exit_code=1)
    run.engine.close()
    print(f"[dapo-exp] {run.out.name}: stopped after step {step}; re-run the same command to resume", flush=True)
    raise RunStopped(run.stop.signame)


def finish(run: Run, summary: dict[str, Any], step: int) -> dict[str, Any]:
    """Write the summary (final, best, base evaluations), close tracking and the engine."""
    st = run.state
    evals = {int(k): v for k, v in st["evals"].items()}
    final_step = max(evals)
    # best over the evaluations of the trained policy (step 0 is the base policy, reported as `base`)
    trained = [s_ for s_ in evals if s_ > 0] or list(evals)
    best_step = max(trained, key=lambda s_: (evals[s_].get(rundir.EVAL_ACC, -1), -s_))
    summary.update(
        status=rundir.STATUS_FINISHED, steps_done=step, wall_time_s=st["wall_time_s"],
        final={"step": final_step, **evals[final_step]}, best={"step": best_step, **evals[best_step]},
        base={"step": 0, **evals[0]} if 0 in evals else {},
        compute={"rollouts_total": st["cum_rollouts"], "gen_tokens_total": st["cum_gen_tokens"]},
        model_path=run.model_path, n_params=sum(p.numel() for p in run.model.parameters()),
    )
    rundir.write_json(run.out / rundir.SUMMARY, summary)
    run.tracker.summary({k: v for k, v in summary.items() if k not in ("config", "traceback")}
                        | {"final/" + k: v for k, v in summary["final"].items()})
    run.tracker.finish()
    run.engine.close()
    _print_summary(summary)
    return summary


def _print_summary(s: dict[str, Any]) -> None:
    """One screen at the end of a run."""
    keys = [rundir.EVAL_ACC, rundir.EVAL_PASS, rundir.EVAL_MAJ, rundir.EVAL_LEN, rundir.EVAL_TRUNC,
            rundir.EVAL_ENTROPY]
    lines = [f"[dapo-exp] run {s['label']} seed {s['seed']}: finished {s['steps_done']} steps in "
             f"{s['wall_time_s']:.0f}s (commit {s['git_commit'][:12]})"]
    lines.append(f"  {'metric':28s} {'base':>8s} {'final':>8s} {'best':>8s}")

    def fmt(d: dict, k: str) -> str:
        v = d.get(k)
        return f"{v:8.3f}" if isinstance(v, (int, float)) and not math.isnan(v) else f"{'-':>8s}"

    for k in keys:
        lines.append(f"  {k:28s} {fmt(s.get('base', {}), k)} {fmt(s['final'], k)} {fmt(s['best'], k)}")
    lines.append(f"  switches: {', '.join(k for k, v in s['switches'].items() if v) or 'none (GRPO)'}")
    print("\n".join(lines))
