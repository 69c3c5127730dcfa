"""The training loop of GRPO and its fixes, top to bottom.

One rollout step, each line a named function (:mod:`dapo_exp.steps` unless noted)::

    rollout_groups: generate, score (correctness + the fixes' reward terms), filter and refill
                    (the group filter, Dynamic Sampling's; rollout.dynamic_sampling.collect_groups)
    train_on:       build_batch (advantages, the fixes' token masks) -> old_logprobs (the rows the
                    update cannot score itself, the reference's with KL on) -> update_policy (mini-
                    batches of whole groups, the fix-chosen surrogate and normaliser) -> engine sync
    metrics -> evaluate (every eval.every steps) -> checkpoint (every checkpoint.every steps)

The fixes act only through the plan :mod:`dapo_exp.compose` binds once per run (``run.plan``);
the run's lifecycle (lock, records, signals, resume, tracking, summary) is :mod:`dapo_exp.runner`'s:
``runner.open_run`` hands this loop a :class:`dapo_exp.runner.RunContext` and the loop calls its points
(checkpoint, stop, finish); the run's pieces are :mod:`dapo_exp.build`'s: the frozen ``Run`` it was built
from, and its ``Progress`` (the checkpointed state, the start step, the prompt sampler, the log writers and
the tracker), which each step function receives beside it.

How it deviates from the paper, honestly: the paper trains a 32B model for thousands of steps on
DAPO-Math-17k; the embedded default is a 0.3M-parameter policy on a synthetic arithmetic task for
30 steps, which exercises every mechanism but says nothing about AIME. Old log-probs are always the
trainer's (never the rollout engine's): the first mini-batch's rows take them from the update
forward itself, detached, before any optimizer step (ratio 1 exactly, as TRL and verl); the other
rows are recomputed by a no-grad forward first (``train.recompute_old_logprobs=true``: every row).
The KL term is off unless ``algo.kl_coef > 0`` (a frozen copy of the initial policy is then the
reference).

``train(cfg)`` is a plain function: ``run.py`` wraps it in ``@hydra.main``; tests call it.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from dapo_exp import compose, rundir, runner, steps
from dapo_exp.build import Progress, Run
from dapo_exp.console import ProgressLines
from dapo_exp.evaluation import sizes_line
from dapo_exp.fixes.base import mean_over_rounds
from dapo_exp.logprobs import ResponseForward
from dapo_exp.quiet import quiet
from dapo_exp.rollout.dynamic_sampling import collect_groups
from dapo_exp.rollout.engine import SamplingSpec
from dapo_exp.rollout.groups import Group, score_groups
from dapo_exp.runner import RunStopped  # noqa: F401 - part of train's interface (a clean stop)

log = logging.getLogger("dapo_exp.train")


def train(cfg: DictConfig, claim: Path | None = None) -> dict[str, Any]:
    """Train one run as configured; returns the run summary (also written to summary.json). ``claim``: the run
    directory, already claimed by the caller (:func:`dapo_exp.runner.claimed`, as ``run.py`` does); without it
    the run claims its directory itself. ``backend.name`` other than ``native`` hands the job to
    :func:`dapo_exp.backends.launch`."""
    if cfg.backend.name != "native":  # another engine runs the job: translated there (dapo_exp/backends)
        from dapo_exp.backends import launch

        return launch(cfg, claim=claim)
    quiet()  # a parallel sweep's worker is another process: third-party noise off here too
    t_start = time.perf_counter()
    plan = preflight(cfg)  # every check, before any compute
    with runner.open_run(cfg, plan, t_start, claim) as ctx:  # built, resumed, tracked; a failure or stop is recorded
        return ctx.finished if ctx.finished is not None else loop(ctx)


def loop(ctx: runner.RunContext) -> dict[str, Any]:
    """Rollout steps from ``progress.start_step + 1`` to ``train.steps``, then the summary."""
    from tqdm.auto import tqdm

    run, progress = ctx.run, ctx.progress
    cfg, t, st, start = run.cfg, run.cfg.train, progress.state, progress.start_step
    ctx.begin_loop()  # a signal from here on stops after the current step, with a checkpoint
    log.info("%s: %s, %.2fM params, %d train problems, %s, device %s, rollout %s%s", run.label,
             run.model_path, sum(p.numel() for p in run.model.parameters()) / 1e6, len(run.train_prompts),
             sizes_line(cfg.eval, len(run.eval_prompts)), run.device, cfg.rollout.engine,
             f" (decode={run.engine.decode_used})" if hasattr(run.engine, "decode_used") else "")
    if cfg.eval.before_training and start == 0:
        run_eval(run, progress, 0)
    bar = tqdm(range(start + 1, t.steps + 1), initial=start, total=t.steps, desc=run.label,
               dynamic_ncols=True, file=sys.stderr, disable=None)
    # plain lines for logs (nohup, SLURM, CI) when the bar is off; the bar is enough on a terminal
    lines = ProgressLines(f"{run.label} s{cfg.seed}", t.steps, cfg.logger.progress_every_s, enabled=bool(bar.disable))
    step = start
    for next_step in bar:
        if ctx.stop_signal:  # a signal during the last step (or the set-up): stopped() writes that step's checkpoint
            bar.close()
            ctx.stopped(step)
        step, t_step = next_step, steps.start_clocks(run.device)  # wall time, and the step's peak GPU memory
        groups, ds, counters, rollout_metrics = rollout_groups(run, progress, step)  # rollouts, rewards, filter
        t_gen = time.perf_counter() - t_step
        st.sampler_position = progress.sampler.position
        st.cum_rollouts += ds.rollouts_generated
        st.cum_gen_tokens += ds.gen_tokens + ds.greedy_tokens  # the greedy baselines' tokens too (ReMax)
        if groups:
            m = train_on(run, progress, groups, step)  # advantages, masks, old log-probs, update, sync
        else:
            m = {}
            log.warning("step %d: no group kept (dynamic sampling partial batch); no update", step)
        m["reward/verify_timeouts"] = counters["verify_timeouts"]
        run.scheduler.step()
        m.update(steps.sampling_metrics(ds, group_size=cfg.rollout.n, gen_seconds=counters["gen_seconds"]))
        m.update(rollout_metrics)
        m.update({
            "compute/rollouts_total": float(st.cum_rollouts),
            "compute/gen_tokens_total": float(st.cum_gen_tokens),
            "compute/trained_rollouts_total": float(st.cum_trained_rollouts),
            "optim/lr": run.optimizer.param_groups[0]["lr"],
            "timing_s/gen": t_gen,
            "timing_s/step": time.perf_counter() - t_step,
            **steps.gpu_peak(run.device),
        })
        if groups:
            run.plan.check_logged(m)  # every fix that is on logs what it declares
        progress.log(step, m)

        evaluate = cfg.eval.every and step % cfg.eval.every == 0 or step == t.steps
        ev = run_eval(run, progress, step) if evaluate else {}
        bar.set_postfix(reward=f"{m.get('reward/mean', float('nan')):.2f}",
                        acc=f"{m.get('reward/acc_mean', float('nan')):.2f}",
                        ent=f"{m.get('actor/entropy', float('nan')):.2f}", s_step=f"{m['timing_s/step']:.1f}",
                        **({"eval": f"{ev['eval/acc_avg']:.2f}"} if ev else {}))
        lines.step(step, m, ev)
        if cfg.checkpoint.every and step % cfg.checkpoint.every == 0 or step == t.steps:
            ctx.checkpoint(step)
    bar.close()
    if t.steps == 0 or (start == t.steps and not st.evals):
        run_eval(run, progress, t.steps)
    return ctx.finish(step)


# =========================================================================== #
# Before any compute                                                            #
# =========================================================================== #
def preflight(cfg: DictConfig) -> compose.Plan:
    """Every check that needs no model, then the run's plan (the fixes composed): values
    (:func:`dapo_exp.config.validate`), each fix's own checks and their combination
    (:func:`dapo_exp.compose.compose`), names against the registries that own them, data and model sources."""
    from dapo_exp.config import validate
    from dapo_exp.models import check_model_source
    from dapo_exp.rollout import ENGINES
    from dapo_exp.tasks import TASKS, check_task_sources
    from dapo_exp.tasks.verifier import VERIFIERS

    validate(cfg)
    plan = compose.compose(cfg.algo, compose.run_info(cfg))
    for registry, value in ((TASKS, cfg.task.name), (ENGINES, cfg.rollout.engine), (VERIFIERS, cfg.task.verifier)):
        registry.pick(value)
    check_model_source(cfg.model.path)
    check_task_sources(cfg.task)
    return plan


# =========================================================================== #
# One rollout step                                                              #
# =========================================================================== #
def rollout_groups(run: Run, progress: Progress,
                   step: int) -> tuple[list[Group], Any, dict[str, float], dict[str, float]]:
    """Generate, score and filter groups (the group filter's refill) until the batch is full, the prompts from
    ``progress.sampler`` and Dynamic Sampling's carried groups in ``progress.state``; returns the groups, the
    rounds' counts, the verifier's and engine's counters and the reward terms' and filter's metrics."""
    cfg, r = run.cfg, run.cfg.rollout
    counters = {"verify_timeouts": 0.0, "gen_seconds": 0.0}
    greedy_tokens: list[int] = []  # ReMax: each round's greedy responses' tokens
    reward_metrics: list[dict[str, float]] = []  # the reward terms' own, per round

    def generate_round(round_idx: int, n_prompts: int) -> list[Group]:
        idx = progress.sampler.take(n_prompts, step=step, round_idx=round_idx)
        prompts = [run.train_prompts[i] for i in idx]
        gens = run.engine.generate(prompts, SamplingSpec(
            n=r.n, max_new_tokens=r.max_response_len, temperature=r.temperature, top_p=r.top_p,
            seed=cfg.seed * 1_000_003 + step * 101 + round_idx,
            keys=progress.sampler.noise_keys(step, round_idx, idx)))
        counters["gen_seconds"] += gens.stats.get("gen_seconds", 0.0)
        groups, timeouts, metrics = score_groups(
            prompt_indices=idx, prompt_ids=prompts, gens=gens, group_size=r.n, answers=[run.answers[i] for i in idx],
            tokenizer=run.tokenizer, verifier=run.verifier, reward=run.plan.reward)
        counters["verify_timeouts"] += timeouts
        reward_metrics.append(metrics)
        if run.plan.greedy_baseline:  # ReMax: one greedy response per prompt, scored like the samples
            greedy(prompts, idx, groups)
        return groups

    def greedy(prompts: list[list[int]], idx: list[int], groups: list[Group]) -> None:
        gens = run.engine.generate(prompts, SamplingSpec(n=1, max_new_tokens=r.max_response_len, greedy=True))
        counters["gen_seconds"] += gens.stats.get("gen_seconds", 0.0)
        greedy_tokens.append(sum(gens.lengths))
        scored, timeouts, _ = score_groups(  # the reward terms' metrics stay the samples'
            prompt_indices=idx, prompt_ids=prompts, gens=gens, group_size=1, answers=[run.answers[i] for i in idx],
            tokenizer=run.tokenizer, verifier=run.verifier, reward=run.plan.reward)
        counters["verify_timeouts"] += timeouts
        for g, b in zip(groups, scored, strict=True):
            g.baseline = b.reward[0]

    run.engine.wake()
    groups, progress.state.carry, ds = collect_groups(
        generate_round, want=cfg.train.prompts_per_step, refill=run.plan.refill, keep=run.plan.keep_groups,
        carry=progress.state.carry)
    run.engine.sleep()
    # the rollout slots' own metrics: the reward terms' and the group filter's, each averaged over the step's rounds
    metrics = {**mean_over_rounds(reward_metrics), **ds.filter_metrics}
    ds.greedy_tokens = sum(greedy_tokens)  # the greedy responses count in the step's generation (tokens and seconds)
    if run.plan.greedy_baseline:
        metrics["compute/greedy_gen_tokens"] = float(ds.greedy_tokens)
    return groups, ds, counters, metrics


def update_sizes(cfg: DictConfig) -> steps.UpdateSizes:
    t = cfg.train
    return steps.UpdateSizes(group_size=cfg.rollout.n, mini_batch_size=t.mini_batch_size,
                             micro_batch_size=t.micro_batch_size, token_budget=t.token_budget, ppo_epochs=t.ppo_epochs,
                             grad_clip=cfg.optim.grad_clip)


def train_on(run: Run, progress: Progress, groups: list[Group], step: int) -> dict[str, float]:
    """Advantages, masks, old log-probs, the update and the engine sync; returns the step's metrics (the
    trained rollouts counted in ``progress.state``, the samples written to its train-samples log)."""
    cfg, t, plan = run.cfg, run.cfg.train, run.plan
    batch = steps.build_batch(groups, group_size=cfg.rollout.n, plan=plan)
    sizes, seed = update_sizes(cfg), cfg.seed * 31 + step * 7
    t_train = time.perf_counter()
    # the first mini-batch's rows (every row with one mini-batch) are scored by the update itself
    on_policy = [] if t.recompute_old_logprobs else steps.on_policy_rows(len(groups), sizes=sizes, seed=seed)
    old = steps.old_logprobs(run.model, batch, fwd=run.fwd, ref_model=run.ref_model,
                             micro_batch_size=t.micro_batch_size, token_budget=t.token_budget, on_policy=on_policy)
    upd = steps.update_policy(run.model, run.optimizer, batch, old, fwd=run.fwd, plan=plan, sizes=sizes, seed=seed)
    run.engine.sync_weights(run.model)
    t_train = time.perf_counter() - t_train
    weight, _ = steps.token_weight(batch, old.logp, range(batch.size), plan=plan) or (None, {})
    tok_adv = steps.token_advantages(batch, range(batch.size), old.logp.shape[1], weight=weight)
    m = {**steps.rollout_mismatch(batch, old),
         **steps.step_metrics(batch, old, upd, tok_adv, ppo_epochs=t.ppo_epochs, t_train=t_train),
         **plan.reward_logged([g.shaping for g in groups])}
    m.update(steps.sample_diagnostics(groups, run.task.train, _diagnostics(cfg)))
    steps.check_finite(run.model, run.out, step, m)  # a diverged step stops the run before it is logged or checkpointed
    progress.state.cum_trained_rollouts += batch.size
    progress.writers[rundir.TRAIN_SAMPLES].write(steps.train_sample_rows(step, groups))
    return m


def _diagnostics(cfg: DictConfig) -> Any:
    """The task's mechanism diagnostics (:data:`dapo_exp.tasks.DIAGNOSTICS`), or None."""
    from dapo_exp.tasks import DIAGNOSTICS

    return DIAGNOSTICS.get(cfg.task.name)


def run_eval(run: Run, progress: Progress, step: int) -> dict[str, float]:
    """Evaluate, record in ``progress.state`` (for best/final), log. The last step's evaluation is the
    endpoint's (``eval.final_problems`` x ``eval.final_samples``), repeated ``eval.final_repeats``
    more times with fresh noise (``eval/acc_avg_rep<i>``)."""
    from dapo_exp.evaluation import eval_size
    from dapo_exp.keyed import eval_sample_keys

    cfg, e = run.cfg, run.cfg.eval
    final = step == cfg.train.steps
    n_problems, k = eval_size(e, final, len(run.task.eval))
    fwd = ResponseForward(run.tokenizer.pad_token_id, run.device, cfg.train.logprob_chunk, e.temperature)

    def once(replica: int) -> dict[str, float]:
        keys = eval_sample_keys(cfg.seed, n_problems, replica) if cfg.train.randomness == "keyed" else None
        spec = steps.EvalSpec(k=k, max_len=e.max_response_len or cfg.rollout.max_response_len,
                              temperature=e.temperature, top_p=e.top_p,
                              seed=cfg.seed * 1_000_003 + 999_983 + replica * 7_919,
                              micro_batch_size=cfg.train.micro_batch_size, save_samples=e.save_samples and not replica,
                              keys=tuple(keys) if keys is not None else None)
        return steps.evaluate(run.model, run.engine, problems=run.task.eval[:n_problems],
                              prompt_ids=run.eval_prompts[:n_problems], tokenizer=run.tokenizer,
                              verifier=run.verifier, fwd=fwd, spec=spec, step=step,
                              sample_writer=progress.writers[rundir.EVAL_SAMPLES], diagnostics=_diagnostics(cfg))

    m = once(0)
    for replica in range(1, e.final_repeats + 1) if final else ():
        m[f"{rundir.EVAL_ACC}_rep{replica}"] = once(replica)[rundir.EVAL_ACC]
    progress.state.evals[step] = m
    progress.log(step, m)
    return m
