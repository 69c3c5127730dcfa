"""The named steps of one rollout step, in the order the loop calls them: :func:`dapo_exp.train.loop`,
:func:`dapo_exp.train.train_on` (from the batch to the step's metrics) and :func:`dapo_exp.train.run_eval`.

::

    start_clocks
    (train.rollout_groups, not steps of this module: generate, score with rollout.groups.score_groups (the
     plan's reward terms), the group filter's rounds and refill with rollout.dynamic_sampling.collect_groups)
    -> build_batch: advantages (the plan's estimator, then its advantage transforms), response and loss masks
       (the plan's token_mask slot), and their hooks' metrics
    -> on_policy_rows, old_logprobs: the trainer's log-probs of the samples that the update cannot give itself
       (on_policy_rows: those of the first mini-batch), entropy, reference log-probs
    -> update_policy: mini-batches of whole groups (the plan's normaliser: their loss weights), micro-batch
       accumulation, optimizer steps; per-token advantages (token_advantages, x token_weight: the plan's one
       rollout_weight slot, when the engine reported log-probs); with an update mask, a no-grad forward of
       each mini-batch first (mini_batch_keep: its entropy); the plan's loss (surrogate, GRPO's KL term, the
       fixes' loss terms)
    -> token_weight / token_advantages of the whole batch, rollout_mismatch, step_metrics, sample_diagnostics,
       check_finite, train_sample_rows
    -> sampling_metrics (the group filter's rounds and counts), gpu_peak -> evaluate (periodic)

Each step takes plain values (no config object), the update's sizes (:class:`UpdateSizes`) and the
run's :class:`dapo_exp.compose.Plan` (the fixes composed, behind one method per point of the
pipeline); no step reads a config or calls a fix's hook itself.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dapo_exp import checkpoint, rundir
from dapo_exp.batching import microbatches
from dapo_exp.compose import FIX_METRIC, Out, Plan
from dapo_exp.logprobs import ResponseForward
from dapo_exp.rollout.dynamic_sampling import CollectStats
from dapo_exp.rollout.engine import SamplingSpec
from dapo_exp.rollout.groups import Group
from dapo_exp.rollout.mismatch import pad_logprobs, rollout_mismatch_stats


# --------------------------------------------------------------------------- #
# Batch: advantages and masks                                                   #
# --------------------------------------------------------------------------- #
@dataclass
class Batch:
    """The training batch, flattened group-major: row ``g * G + j`` is response ``j`` of group ``g``."""

    groups: list[Group]
    rewards: Tensor  # (N, G)
    advantages: Tensor  # (B,) one value per response
    prompts: list[list[int]]  # (B,) prompt ids of each row
    responses: list[list[int]]  # (B,) response ids
    lengths: list[int]  # (B,)
    truncated: Tensor  # (B,) bool
    group_index: Tensor  # (B,) group of each row
    resp_mask: Tensor  # (B, T) real response tokens
    loss_mask: Tensor  # (B, T) tokens that count in the loss: resp_mask after the token_mask slot's hooks
    engine_logp: Tensor | None = None  # (B, T) the log-probs the engine sampled with, if it reported them
    metrics: dict[str, float] = field(default_factory=dict)  # what the advantage and token-mask hooks logged

    @property
    def size(self) -> int:
        return len(self.responses)

    @property
    def width(self) -> int:
        return self.resp_mask.shape[1]


def build_batch(groups: list[Group], *, group_size: int, plan: Plan) -> Batch:
    """Advantages (``plan.advantage(rewards (N, G), lengths=, parts=, baseline=)``, the baseline the groups' greedy
    rewards when the plan reads them) and masks of the kept groups
    (``plan.token_mask(resp_mask (B, T), truncated (B,))``, e.g. Overlong Filtering), with their metrics."""
    rewards = torch.tensor([g.reward for g in groups], dtype=torch.float32)
    responses = [resp for g in groups for resp in g.response_ids]
    lengths = [len(x) for x in responses]
    baseline = (torch.tensor([g.baseline for g in groups], dtype=torch.float32)  # ReMax: the greedy responses'
                if plan.greedy_baseline else None)
    adv, adv_metrics = plan.advantage(rewards, lengths=torch.tensor(lengths, dtype=torch.float32).view(rewards.shape),
                                      parts=reward_parts(groups, rewards), baseline=baseline)
    adv = adv.reshape(-1)
    truncated = torch.tensor([tr for g in groups for tr in g.truncated])
    width = max(1, max(lengths))
    resp_mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).float()
    loss_mask, mask_metrics = plan.token_mask(resp_mask, truncated)
    return Batch(
        groups=groups, rewards=rewards, advantages=adv,
        prompts=[g.prompt_ids for g in groups for _ in range(group_size)], responses=responses,
        lengths=lengths, truncated=truncated, group_index=torch.arange(len(groups)).repeat_interleave(group_size),
        resp_mask=resp_mask, loss_mask=loss_mask,
        engine_logp=None if groups[0].sampled_logprobs is None
        else pad_logprobs([lp for g in groups for lp in g.sampled_logprobs], width),
        metrics={k: float(v) for k, v in {**adv_metrics, **mask_metrics}.items()},
    )


def reward_parts(groups: list[Group], rewards: Tensor) -> dict[str, Tensor]:
    """The reward's components, each ``(N, G)``: ``accuracy`` (the correctness reward) and each reward term's
    values (its fix's name); they sum to ``rewards``."""
    terms = {name: torch.tensor([g.shaping[name] for g in groups], dtype=rewards.dtype) for name in groups[0].shaping}
    return {"accuracy": rewards - sum(terms.values(), torch.zeros_like(rewards)), **terms}


def row_lengths(batch: Batch, rows: list[int] | range) -> list[int]:
    """Prompt + response tokens of each of ``rows`` (what a micro-batch's padding is sized by)."""
    return [len(batch.prompts[i]) + batch.lengths[i] for i in rows]


# --------------------------------------------------------------------------- #
# Old (and reference) log-probs, entropy                                        #
# --------------------------------------------------------------------------- #
@dataclass
class OldLogprobs:
    """The trainer's log-probs of the samples under the policy that generated them (``pi_old``).

    Rows not yet ``known`` are on-policy rows (:func:`on_policy_rows`): :func:`update_policy`
    fills them from its own first forward of them, before any optimizer step.
    """

    logp: Tensor  # (B, T) the trainer's log-probs of the samples before the update
    ref_logp: Tensor | None  # (B, T) under the frozen reference policy (KL on), else None
    entropy_sum: float  # sum over the known rows' response tokens of the policy's entropy
    known: Tensor  # (B,) bool: rows whose logp (and entropy) are set


def on_policy_rows(n_groups: int, *, sizes: UpdateSizes, seed: int) -> list[int]:
    """Rows whose update forward sees the very policy that sampled them: the first mini-batch's.

    Its forward runs before any optimizer step, so its detached log-probs *are* the old
    log-probs (ratio 1 exactly, as TRL and verl do when a batch gets one update); with one
    mini-batch (``ppo_epochs`` of them or not) that is every row and nothing is recomputed.
    """
    return minibatch_rows(n_groups, sizes=sizes, seed=seed)[0]


@torch.no_grad()
def old_logprobs(
    model: torch.nn.Module, batch: Batch, *, fwd: ResponseForward, ref_model: torch.nn.Module | None,
    micro_batch_size: int, token_budget: int | None, on_policy: list[int] | tuple = (),
) -> OldLogprobs:
    """The trainer's log-probs of the sampled tokens (recomputed, never the engine's) and their entropy,
    for every row but ``on_policy`` (left to :func:`update_policy`); the reference's for every row."""
    B, width = batch.size, batch.width
    known = torch.ones(B, dtype=torch.bool)
    known[list(on_policy)] = False
    old = OldLogprobs(torch.zeros(B, width), torch.zeros(B, width) if ref_model is not None else None, 0.0, known)

    def score(net: torch.nn.Module, rows: list[int], out: Tensor, with_entropy: bool) -> float:
        net.eval()
        ent_sum = 0.0
        for mb in microbatches(row_lengths(batch, rows), micro_batch_size, token_budget):
            sel = [rows[i] for i in mb]
            lp, ent, mk = fwd(net, [batch.prompts[i] for i in sel], [batch.responses[i] for i in sel],
                              with_entropy=with_entropy)
            out[sel, : lp.shape[1]] = lp.cpu()
            ent_sum += float((ent * mk).sum())
        return ent_sum

    recompute = [i for i in range(B) if known[i]]
    if recompute:
        old.entropy_sum = score(model, recompute, old.logp, True)
    if ref_model is not None:
        score(ref_model, list(range(B)), old.ref_logp, False)
    return old


def adopt_update_logprobs(old: OldLogprobs, rows: list[int], logp: Tensor, entropy: Tensor, *,
                          updates_done: int) -> None:
    """On-policy ``rows``: their old log-probs are ``logp`` (``(n, w)``, the update forward's), detached;
    ``entropy`` (``(n, w)``, masked) joins the entropy sum. Refused after an optimizer step."""
    if updates_done:
        raise RuntimeError("on-policy rows must be scored before the first optimizer step of the batch")
    if old.known[rows].any():
        raise RuntimeError("a micro-batch mixes on-policy rows with rows whose old log-probs were recomputed")
    old.logp[rows, : logp.shape[1]] = logp.detach().cpu()
    old.entropy_sum += float(entropy.detach().sum())
    old.known[rows] = True


def token_weight(batch: Batch, old_logp: Tensor, rows: list[int] | range, *, plan: Plan) -> Out | None:
    """``(len(rows), w)`` detached weights of ``rows``' tokens (``old_logp``: their ``(len(rows), w)`` old
    log-probs) from the plan's ``rollout_weight`` slot (``plan.token_weight(old_logp, engine_logp, resp_mask)``,
    e.g. ``rollout_correction``'s importance weights and band mask), with its metrics; None when the plan weighs no
    tokens or the engine reported no log-probs."""
    if batch.engine_logp is None or not plan.weighs_tokens:
        return None
    rows, w = list(rows), old_logp.shape[1]
    return plan.token_weight(old_logp, batch.engine_logp[rows, :w], batch.resp_mask[rows, :w])


def token_advantages(batch: Batch, rows: list[int] | range, width: int, *, weight: Tensor | None = None) -> Tensor:
    """``(len(rows), width)`` per-token advantages of ``rows``: each token carries its response's advantage,
    times its :func:`token_weight` when there is one."""
    rows = list(rows)
    adv = batch.advantages[rows, None].expand(len(rows), width)
    return adv.clone() if weight is None else adv * weight.to(adv.dtype)


def rollout_weight_stats(batch: Batch, rows: list[int], weight: Tensor | None) -> dict[str, float]:
    """Sums of the ``rollout_weight`` slot's ``weight`` (:func:`token_weight`'s) over ``rows``' loss-mask tokens:
    ``rw_sum``, ``rw_zero`` (weight 0: masked by a band) and ``rw_tokens`` (0 when the engine reported no
    log-probs, ``weight`` None): the slot's metrics, whichever fix fills it."""
    if weight is None:
        return {"rw_sum": 0.0, "rw_zero": 0.0, "rw_tokens": 0.0}
    lm = batch.loss_mask[rows, :weight.shape[1]]
    return {"rw_sum": float((weight * lm).sum()), "rw_zero": float(((weight == 0).float() * lm).sum()),
            "rw_tokens": float(lm.sum())}


def rollout_mismatch(batch: Batch, old: OldLogprobs) -> dict[str, float]:
    """The rollout-vs-trainer mismatch metrics (:func:`dapo_exp.rollout.mismatch.rollout_mismatch_stats`),
    when the engine reported the log-probs it sampled with; else none."""
    if batch.engine_logp is None:
        return {}
    return rollout_mismatch_stats(old.logp, batch.engine_logp, batch.resp_mask)


# --------------------------------------------------------------------------- #
# The update                                                                    #
# --------------------------------------------------------------------------- #
@dataclass
class UpdateSums:
    """What :func:`update_policy` adds up over its micro-batches and optimizer steps, typed: GRPO's loss
    shares and counts over the loss-mask tokens, the padding of its micro-batches, the ``update_mask`` and
    ``rollout_weight`` slots' sums (None while their slot is empty), and the fixes' own metrics (a
    surrogate's or a loss term's, :data:`dapo_exp.compose.FIX_METRIC`), which :func:`step_metrics` averages
    over the optimizer steps."""

    n_updates: int = 0
    grad_norm: float = 0.0
    pg_loss: float = 0.0
    kl: float | None = None  # GRPO's KL term (kl_coef > 0)
    n_tokens: float = 0.0
    n_clipped_high: float = 0.0
    n_clipped_low: float = 0.0
    n_clipped_dual: float = 0.0
    ratio_sum: float = 0.0
    slots: float = 0.0  # padded slots of the micro-batches ([max prompt | max response] wide)
    real_tokens: float = 0.0
    n_kept: float | None = None  # update_mask: loss-mask tokens whose policy-gradient term counted
    keep_entropy_min: float = 0.0  # update_mask: the smallest kept entropy, summed over mini-batches
    keep_minibatches: int = 0
    rw_sum: float | None = None  # rollout_weight: the weights' sum over loss-mask tokens
    rw_zero: float | None = None  # rollout_weight: loss-mask tokens weighted 0
    rw_tokens: float | None = None  # rollout_weight: loss-mask tokens (0: the engine reported no log-probs)
    fixes: dict[str, float] = field(default_factory=dict)  # a fix's own metric -> its sum over micro-batches

    def add(self, stats: dict[str, Any]) -> None:
        """Add a micro-batch's statistics (:meth:`dapo_exp.compose.Plan.loss`'s, :func:`rollout_weight_stats`')."""
        for key, v in stats.items():
            if key.startswith(FIX_METRIC):
                name = key.removeprefix(FIX_METRIC)
                self.fixes[name] = self.fixes.get(name, 0.0) + float(v)
            elif key in _SUMMED:
                setattr(self, key, (getattr(self, key) or 0.0) + float(v))
            else:
                raise KeyError(f"{key!r} is no statistic of the update (UpdateSums)")

    def add_own(self, metrics: dict[str, Any]) -> None:
        """Add a hook's own metrics (a normaliser's, an update mask's, a rollout weight's) to the fixes' sums."""
        self.add({FIX_METRIC + k: v for k, v in metrics.items()})


_SUMMED = {"pg_loss", "kl", "n_tokens", "n_clipped_high", "n_clipped_low", "n_clipped_dual", "ratio_sum", "n_kept",
           "rw_sum", "rw_zero", "rw_tokens"}


@dataclass(frozen=True)
class UpdateSizes:
    """How a batch becomes optimizer steps (``train.*`` and ``optim.grad_clip``); what the loss is, is the plan's."""

    group_size: int
    mini_batch_size: int
    micro_batch_size: int
    token_budget: int | None
    ppo_epochs: int
    grad_clip: float


def minibatch_rows(n_groups: int, *, sizes: UpdateSizes, seed: int) -> list[list[int]]:
    """Rows of each mini-batch: whole groups, in a random order per epoch seeded by ``seed + epoch``."""
    G, per_mb = sizes.group_size, max(1, sizes.mini_batch_size // sizes.group_size)
    out = []
    for epoch in range(sizes.ppo_epochs):
        order = torch.randperm(n_groups, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
        out += [[gi * G + j for gi in order[s : s + per_mb] for j in range(G)] for s in range(0, n_groups, per_mb)]
    return out


def update_policy(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Batch, old: OldLogprobs,
    *, fwd: ResponseForward, plan: Plan, sizes: UpdateSizes, seed: int,
) -> UpdateSums:
    """PPO-style updates; each mini-batch is one optimizer step, its gradient accumulated over
    micro-batches with the mini-batch's normaliser (so the split never changes it).

    The on-policy rows of ``old`` (not ``known``, :func:`on_policy_rows`) take their old log-probs
    and entropy from this forward, detached, before the first optimizer step; ``old`` is complete
    afterwards. Returns the summed statistics (:class:`UpdateSums`).
    """
    model.train()
    upd = UpdateSums()
    device = fwd.device
    for rows in minibatch_rows(len(batch.groups), sizes=sizes, seed=seed):
        weights, own = plan.weights(batch.loss_mask[rows], batch.group_index[rows])
        upd.add_own(own)
        keep = mini_batch_keep(model, batch, rows, fwd=fwd, plan=plan, sizes=sizes, upd=upd) if plan.masks_updates \
            else None
        lens = row_lengths(batch, rows)
        for micro in microbatches(lens, sizes.micro_batch_size, sizes.token_budget):
            sel = [rows[i] for i in micro]
            # padding waste: the tensor is [max prompt | max response] wide
            upd.slots += len(sel) * (max(len(batch.prompts[i]) for i in sel) + max(batch.lengths[i] for i in sel))
            upd.real_tokens += sum(lens[i] for i in micro)
            on_policy = not bool(old.known[sel].all())
            lp, ent, mk = fwd(model, [batch.prompts[i] for i in sel], [batch.responses[i] for i in sel],
                              with_entropy=on_policy or plan.needs_entropy)
            w = lp.shape[1]
            if on_policy:
                adopt_update_logprobs(old, sel, lp, ent * mk, updates_done=upd.n_updates)
            old_lp = old.logp[sel, :w]
            weight, own = token_weight(batch, old_lp, sel, plan=plan) or (None, {})
            upd.add_own(own)
            tok_adv = token_advantages(batch, sel, w, weight=weight)
            loss, st = plan.loss(
                logp=lp, old_logp=old_lp.to(device), entropy=ent, advantages=tok_adv.to(device),
                mask=batch.loss_mask[sel, :w].to(device), weights=weights[micro].to(device),
                ref_logp=None if old.ref_logp is None else old.ref_logp[sel, :w].to(device),
                keep=None if keep is None else keep[micro, :w].to(device),
            )
            loss.backward()
            if plan.weighs_tokens:
                st = {**st, **rollout_weight_stats(batch, sel, weight)}
            upd.add(st)
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), sizes.grad_clip if sizes.grad_clip > 0 else 1e12)
        upd.grad_norm += float(gn)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        upd.n_updates += 1
    model.eval()
    return upd


@torch.no_grad()
def mini_batch_keep(model: torch.nn.Module, batch: Batch, rows: list[int], *, fwd: ResponseForward,
                    plan: Plan, sizes: UpdateSizes, upd: UpdateSums) -> Tensor:
    """``(len(rows), width)`` bool: the plan's update mask (``plan.keep``) of the mini-batch's loss-mask tokens.

    The per-token entropy comes from a no-grad forward of the whole mini-batch under the policy
    about to be updated (in the update's mode, micro-batch by micro-batch), so the selection is
    the mini-batch's whatever its split; the mask carries no gradient. Adds the smallest kept
    entropy to ``upd.keep_entropy_min`` and counts the mini-batch in ``upd.keep_minibatches``.
    """
    entropy = torch.zeros(len(rows), batch.width)
    for micro in microbatches(row_lengths(batch, rows), sizes.micro_batch_size, sizes.token_budget):
        sel = [rows[i] for i in micro]
        _, ent, mk = fwd(model, [batch.prompts[i] for i in sel], [batch.responses[i] for i in sel], with_entropy=True)
        entropy[micro, : ent.shape[1]] = (ent * mk).float().cpu()
    keep, own = plan.keep(entropy, batch.loss_mask[rows])
    upd.add_own(own)
    upd.keep_entropy_min += float(entropy[keep].min()) if bool(keep.any()) else 0.0
    upd.keep_minibatches += 1
    return keep


# --------------------------------------------------------------------------- #
# Metrics (names and formulas: docs/reference/metrics.md)                      #
# --------------------------------------------------------------------------- #
def step_metrics(
    batch: Batch, old: OldLogprobs, upd: UpdateSums, tok_adv: Tensor, *, ppo_epochs: int, t_train: float,
) -> dict[str, float]:
    """Reward, loss, clipping, masking, length and throughput metrics of a trained step (the reward terms'
    own: :meth:`dapo_exp.compose.Plan.reward_logged`)."""
    acc = torch.tensor([g.correct for g in batch.groups], dtype=torch.float32)
    n_tok, n_upd = max(upd.n_tokens, 1.0), max(upd.n_updates, 1.0)
    resp_tokens, lm_tokens = float(batch.resp_mask.sum()), float(batch.loss_mask.sum())
    m = {
        "reward/mean": float(batch.rewards.mean()),
        "reward/acc_mean": float(acc.mean()),
        "actor/entropy": old.entropy_sum / max(resp_tokens, 1.0),
        "actor/pg_loss": upd.pg_loss / n_upd,
        "actor/pg_clipfrac_higher": upd.n_clipped_high / n_tok,
        "actor/pg_clipfrac_lower": upd.n_clipped_low / n_tok,
        "actor/pg_clipfrac_dual": upd.n_clipped_dual / n_tok,
        "actor/ppo_ratio_mean": upd.ratio_sum / n_tok,
        "actor/grad_norm": upd.grad_norm / n_upd,
        "actor/masked_token_frac": 1.0 - lm_tokens / max(resp_tokens, 1.0),
        "actor/effective_batch_frac": float((batch.advantages != 0).float().mean()),
        "actor/zero_adv_token_frac": float(((tok_adv == 0).float() * batch.loss_mask).sum()) / max(lm_tokens, 1.0),
        "actor/n_updates": float(upd.n_updates),
        "perf/padding_waste": 1.0 - upd.real_tokens / max(upd.slots, 1.0),
        "response_length/mean": float(np.mean(batch.lengths)),
        "response_length/max": float(np.max(batch.lengths)),
        "response_length/min": float(np.min(batch.lengths)),
        "response_length/clip_ratio": float(batch.truncated.float().mean()),
        "timing_s/update_actor": t_train,
        "perf/train_tokens_per_s": resp_tokens * ppo_epochs / max(t_train, 1e-9),
    }
    if upd.kl is not None:
        m["actor/kl"] = upd.kl / n_upd
    if upd.n_kept is not None:  # the update_mask slot: share of the loss-mask tokens whose pg term counted
        m["actor/update_mask_kept_frac"] = upd.n_kept / n_tok
        m["actor/update_mask_entropy_min"] = upd.keep_entropy_min / max(upd.keep_minibatches, 1.0)
    if upd.rw_tokens is not None:  # the rollout_weight slot (weight 1 where the engine reported no log-probs)
        m["actor/rollout_weight_mean"] = upd.rw_sum / upd.rw_tokens if upd.rw_tokens else 1.0
        m["actor/rollout_weight_zero_frac"] = upd.rw_zero / max(upd.rw_tokens, 1.0)
    # the surrogate's and the loss terms' own metrics: each mini-batch's sum over its micro-batches, averaged over
    # the updates
    m.update({name: v / n_upd for name, v in upd.fixes.items()})
    m.update(batch.metrics)  # the advantage and token-mask hooks' own metrics
    return m


class TrainingDiverged(RuntimeError):
    """A loss, gradient norm or weight went non-finite; nothing of that step was logged or checkpointed."""


# checked in this order after each update (the first non-finite one is named)
DIVERGENCE_METRICS = ("actor/pg_loss", "actor/kl", "actor/grad_norm")


def check_finite(model: torch.nn.Module, out: Path, step: int, metrics: dict[str, float]) -> None:
    """Raise :class:`TrainingDiverged` if the step's loss, KL, gradient norm or the weights are not
    finite, naming what, the step and the last good checkpoint under ``out``; called before anything of
    the step is logged or checkpointed."""
    what = next((f"{k} is {metrics[k]}" for k in DIVERGENCE_METRICS
                 if k in metrics and not math.isfinite(metrics[k])), None)
    if what is None:
        bad = checkpoint.first_nonfinite(model.named_parameters())
        what = bad and f"the weights are not finite ({bad})"
    if what is None:
        return
    kept = sorted(p for p in (out / rundir.CHECKPOINTS).glob("step_*")
                  if (m := checkpoint.STEP_DIR.fullmatch(p.name)) and int(m.group(1)) < step)
    last = f"the last good checkpoint, {kept[-1].name}, is kept" if kept else "no checkpoint was written before it"
    raise TrainingDiverged(
        f"{what} at step {step}: training diverged (start over with a lower optim.lr or optim.grad_clip). "
        f"Nothing of step {step} was logged or checkpointed; {last}")


def start_clocks(device: Any) -> float:
    """A step's start: on CUDA, a new window for :func:`gpu_peak`; returns ``time.perf_counter()``."""
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    return time.perf_counter()


def gpu_peak(device: Any) -> dict[str, float]:
    """On CUDA, the peak memory of PyTorch's allocator since :func:`start_clocks` (``perf/gpu_mem_peak_gib``,
    allocated, and ``perf/gpu_mem_reserved_gib``, GiB): the step's rollout, old log-probs and update. Elsewhere
    nothing."""
    if torch.device(device).type != "cuda":
        return {}
    return {"perf/gpu_mem_peak_gib": torch.cuda.max_memory_allocated(device) / 2**30,
            "perf/gpu_mem_reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30}


def sampling_metrics(ds: CollectStats, *, group_size: int, gen_seconds: float) -> dict[str, float]:
    """The group filter's rounds and counts (``ds``, the refill loop's :class:`CollectStats`), whichever fix fills
    the ``group_filter`` slot, under the names ``dynamic_sampling/*`` (Dynamic Sampling's, the slot's first fix);
    logged with no filter too (one round, every group kept; zero-variance groups still counted); and the
    generation's tokens/s (the sampled responses' and the greedy baselines', over the step's generation seconds,
    which include both)."""
    return {
        "dynamic_sampling/zero_var_frac": ds.zero_var_groups / max(ds.groups_generated, 1),
        "dynamic_sampling/gen_rounds": float(ds.rounds),
        "dynamic_sampling/rollouts_generated": float(ds.rollouts_generated),
        "dynamic_sampling/kept_groups": float(ds.kept_groups),
        "dynamic_sampling/rollouts_per_trained": ds.rollouts_generated / max(ds.kept_groups * group_size, 1),
        "dynamic_sampling/surplus_groups": float(ds.surplus_groups),
        "dynamic_sampling/cap_hit": float(ds.cap_hit),
        "perf/gen_tokens_per_s": (ds.gen_tokens + ds.greedy_tokens) / max(gen_seconds, 1e-9),
    }


def sample_diagnostics(groups: list[Group], problems: list, diagnostics: Callable | None) -> dict[str, float]:
    """The task's diagnostics over every response of the trained groups, as ``diag/<name>``."""
    if diagnostics is None or not groups:
        return {}
    probs = [problems[g.prompt_index] for g in groups for _ in g.response_ids]
    texts = [t for g in groups for t in g.meta["texts"]]
    diag = diagnostics(probs, texts, [t for g in groups for t in g.truncated], [c for g in groups for c in g.correct])
    return {f"diag/{name}": float(v) for name, v in diag.items()}


def train_sample_rows(step: int, groups: list[Group], n_groups: int = 2) -> list[dict[str, Any]]:
    """A few training rollouts of the step for ``train_samples.jsonl``."""
    return [
        {"step": step, "group": gi, "prompt_index": g.prompt_index, "response": g.meta["texts"][j],
         "correct": g.correct[j], "reward": g.reward[j], "length": len(g.response_ids[j]),
         "truncated": g.truncated[j]}
        for gi, g in enumerate(groups[:n_groups]) for j in range(len(g.response_ids))
    ]


# --------------------------------------------------------------------------- #
# Evaluation                                                                    #
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class EvalSpec:
    k: int
    max_len: int
    temperature: float
    top_p: float
    seed: int
    micro_batch_size: int
    save_samples: bool
    keys: tuple[int, ...] | None = None  # keyed randomness: one key per problem (dapo_exp.keyed)


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, engine: Any, *, problems: list, prompt_ids: list[list[int]], tokenizer: Any,
    verifier: Any, fwd: ResponseForward, spec: EvalSpec, step: int, sample_writer: rundir.JsonlWriter,
    diagnostics: Callable | None = None,
) -> dict[str, float]:
    """avg@k, pass@k, maj@k, length, truncation and entropy on the held-out problems, and the
    task's ``diagnostics`` (:data:`dapo_exp.tasks.DIAGNOSTICS`) of the samples as ``eval/diag_*``.

    ``fwd`` must score at the eval temperature (the entropy of the sampling distribution).
    """
    from dapo_exp.evaluation import summarise_eval

    k, t0 = spec.k, time.perf_counter()
    engine.wake()
    gens = engine.generate(prompt_ids, SamplingSpec(n=k, max_new_tokens=spec.max_len, temperature=spec.temperature,
                                                    top_p=spec.top_p, seed=spec.seed + step,
                                                    keys=list(spec.keys) if spec.keys is not None else None))
    texts = tokenizer.batch_decode(gens.response_ids, skip_special_tokens=True)
    sample_problems = [p for p in problems for _ in range(k)]
    answers = [p.answer for p in sample_problems]
    results = verifier.verify_batch(texts, answers)
    ids = [p.id for p in problems]
    summary = summarise_eval(ids, [r.correct for r in results], [r.pred for r in results], gens.lengths,
                             gens.truncated, k)
    metrics = {key: float(v) for key, v in summary.items() if key.startswith("eval/")}
    ent_sum, tok = 0.0, 0.0
    rep_prompts = [p for p in prompt_ids for _ in range(k)]
    for s in range(0, len(rep_prompts), spec.micro_batch_size):
        sl = slice(s, s + spec.micro_batch_size)
        _, ent, m = fwd(model, rep_prompts[sl], gens.response_ids[sl], with_entropy=True)
        ent_sum += float((ent * m).sum())
        tok += float(m.sum())
    metrics[rundir.EVAL_ENTROPY] = ent_sum / max(tok, 1.0)
    if diagnostics is not None:
        diag = diagnostics(sample_problems, texts, list(gens.truncated), [bool(r.correct) for r in results])
        metrics.update({f"eval/diag_{name}": float(v) for name, v in diag.items()})
    metrics["eval/verify_timeouts"] = float(sum(r.timed_out for r in results))
    metrics["timing_s/eval"] = time.perf_counter() - t0
    if spec.save_samples:
        sample_writer.write([
            {"step": step, "problem_id": ids[i // k], "sample": i % k, "prompt": problems[i // k].prompt,
             "response": texts[i], "answer": answers[i], "pred": results[i].pred,
             "correct": bool(results[i].correct), "length": gens.lengths[i], "truncated": gens.truncated[i]}
            for i in range(len(texts))
        ])
    return metrics
