"""The GRPO / DAPO objective as small pure functions.

Every function here takes tensors and scalars and returns tensors: no config
object, no model, nothing else of the project (``torch`` is the only import).
The fixes (:mod:`dapo_exp.fixes`, one module each) bind these functions to the config's
values once per run (:mod:`dapo_exp.compose`), and :mod:`dapo_exp.steps` calls the bound
hooks; config keys under ``algo:`` carry the same names as the keyword arguments below.

One function per fix of DAPO (Yu et al. 2025, arXiv 2503.14476):

============================  ==============================  ==========================
fix (config group)            function                        config keys
============================  ==============================  ==========================
(GRPO) advantages             :func:`group_advantages`        ``algo.adv_norm_std``
Clip-Higher                   :func:`clipped_surrogate`       ``algo.eps_low/eps_high/dual_clip``
Token-level Loss              :func:`aggregate_loss`          ``algo.loss_agg``
KL (off in DAPO)              :func:`kl_penalty`              ``algo.kl_coef/kl_estimator``
Overlong Filtering            :func:`overlong_filtering`      ``algo.overlong_filtering``
Overlong Reward Shaping       :func:`overlong_punishment`     ``algo.overlong_punishment`` ...
Dynamic Sampling              :func:`dynamic_sampling_keep`   ``algo.dynamic_sampling``
(rollout mismatch) TIS        :func:`truncated_is_weights`    ``rollout_correction`` (token)
============================  ==============================  ==========================

Gradient-accumulation invariance (semantic choice 1 of the reference): the
normaliser of every aggregation mode is computed once per *mini-batch*
(:func:`loss_normaliser`) and each micro-batch contributes its rows'
``sum_i w_i sum_t l_it`` (:func:`aggregate_loss` with the mini-batch's ``weights=``),
so the gradient summed over micro-batches equals the gradient of the loss of the
whole mini-batch computed in one piece, whatever the split.

Shapes: ``B`` responses, ``T`` response tokens (right-padded), ``N`` prompt
groups of ``G`` responses each (``B = N * G`` when flattened group-major).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

# --------------------------------------------------------------------------- #
# Names that the config schema validates against (kept here so that the list  #
# of valid choices lives next to the code that implements them).               #
# --------------------------------------------------------------------------- #
LOSS_AGG_MODES = (
    "seq-mean-token-mean",  # GRPO: (1/G) sum_i (1/|o_i|) sum_t l_it
    "token-mean",  # DAPO Eq. 12: sum_i sum_t l_it / sum_i |o_i|
    "seq-mean-token-sum-norm",  # Dr.GRPO: sum_i sum_t l_it / (B * L_max)
    "group-token-mean",  # DAPO Eq. 12 read per prompt group, then mean over groups
)
KL_ESTIMATORS = ("k1", "k2", "k3")
OVERLONG_PUNISHMENT_MODES = (
    "none",  # no shaping
    "soft",  # DAPO Eq. 13 (the paper's)
    "linear_ramp",  # seed 000: ramp from a threshold to L_max, not the paper's
    "beyond_max",  # seed 001: linear in (L - L_max) / L_max beyond L_max, not the paper's
)


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; valid choices: {', '.join(choices)}")


# --------------------------------------------------------------------------- #
# Advantages                                                                    #
# --------------------------------------------------------------------------- #
def group_advantages(rewards: Tensor, norm_std: bool = True, eps: float = 1e-6) -> Tensor:
    """Group-relative advantages of GRPO (DAPO Eq. 9).

    ``A_i = (R_i - mean(R_1..R_G)) / (std(R_1..R_G) + eps)``; the same value is
    later broadcast to every token of response ``i``.

    Args:
        rewards: ``(N, G)`` rewards, one row per prompt group.
        norm_std: divide by the group's standard deviation (GRPO, DAPO). ``False``
            gives the Dr.GRPO advantage ``R_i - mean``.
        eps: added to the std to avoid division by zero.

    Returns:
        ``(N, G)`` advantages. The std is the unbiased one (``torch.std``, as verl
        and TRL compute it). A group whose rewards are all equal gets exactly 0
        (not a rounding residue, never NaN), also for ``G = 1``.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be (N, G), got shape {tuple(rewards.shape)}")
    rewards = rewards.float()
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if norm_std:
        g = rewards.shape[1]
        std = rewards.std(dim=1, keepdim=True) if g > 1 else torch.zeros_like(rewards[:, :1])
        centred = centred / (std + eps)
    degenerate = (rewards == rewards[:, :1]).all(dim=1, keepdim=True)
    return torch.where(degenerate, torch.zeros_like(centred), centred)


# --------------------------------------------------------------------------- #
# Clip-Higher                                                                   #
# --------------------------------------------------------------------------- #
class SurrogateOut(NamedTuple):
    """Result of :func:`clipped_surrogate`; all ``(B, T)``."""

    loss: Tensor  # per-token loss l_t = -surrogate (minimise)
    ratio: Tensor  # r_t = exp(logp - old_logp)
    clipped_high: Tensor  # bool: A > 0 and r > 1 + eps_high (upper bound active)
    clipped_low: Tensor  # bool: A < 0 and r < 1 - eps_low (lower bound active)
    clipped_dual: Tensor  # bool: A < 0 and r > c (dual-clip bound active)
    selected: Tensor | None = None  # bool: tokens treated apart (Clip-Cov: detached; KL-Cov: penalised); None: none


def clipped_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
    mask: Tensor | None = None,
) -> SurrogateOut:
    """PPO clipped surrogate with decoupled bounds (DAPO Eq. 10, Clip-Higher).

    ``l_t = -min(r_t A, clip(r_t, 1 - eps_low, 1 + eps_high) A)``. Clip-Higher is
    ``eps_high > eps_low`` (paper: 0.2 / 0.28); ``eps_low == eps_high`` is PPO's
    symmetric clip. With ``dual_clip = c`` (> 1, Ye et al. 2020; the released DAPO
    script uses 10) the loss of a negative-advantage token is further bounded by
    ``-c A``: ``l_t = min(l_t, -c A)`` when ``A < 0``.

    Args:
        logp, old_logp: ``(B, T)`` log-probabilities of the sampled tokens under
            the current and the rollout (old) policy. ``old_logp`` carries no grad.
        advantages: ``(B, T)`` or ``(B, 1)`` / ``(B,)`` (broadcast over tokens).
        eps_low, eps_high: lower and upper clip ranges, ``>= 0``.
        dual_clip: ``None`` or a bound ``c > 1``.
        mask: unused (every surrogate takes it, so that those that need ``|o_i|`` can).

    Returns:
        :class:`SurrogateOut` with the per-token loss and where each bound clipped.
        Padding is not handled here: masks are applied by :func:`aggregate_loss`.
    """
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"eps_low and eps_high must be >= 0, got {eps_low}, {eps_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None), got {dual_clip}")
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    advantages = advantages.to(logp.dtype)
    # the log-ratio is clamped to +-20 (as verl) so that exp() cannot overflow to inf,
    # whose product with a 0 mask would be NaN; no realistic ratio comes near exp(20)
    ratio = torch.exp((logp - old_logp).clamp(-20.0, 20.0))
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    neg = advantages < 0
    clipped_high = (advantages > 0) & (ratio > 1.0 + eps_high)
    clipped_low = neg & (ratio < 1.0 - eps_low)
    if dual_clip is not None:
        bound = -dual_clip * advantages  # positive where A < 0
        clipped_dual = neg & (loss > bound)
        loss = torch.where(neg, torch.minimum(loss, bound), loss)
    else:
        clipped_dual = torch.zeros_like(clipped_high)
    return SurrogateOut(loss, ratio, clipped_high, clipped_low, clipped_dual)


# --------------------------------------------------------------------------- #
# Token-level loss: aggregation modes                                           #
# --------------------------------------------------------------------------- #
def loss_normaliser(
    mask: Tensor,
    mode: str,
    group_index: Tensor | None = None,
    max_len: int | None = None,
) -> Tensor:
    """The normaliser of ``mode`` for a whole mini-batch, one weight per token row.

    Every mode is a weighted sum ``sum_i w_i sum_t mask_it l_it``; this returns
    the ``(B,)`` weights ``w_i`` computed from the *whole* mini-batch, so that a
    micro-batch's contribution ``sum_i w_i sum_t mask_it l_it`` adds up exactly to
    the mini-batch loss. That is what makes gradient accumulation invariant.

    Args:
        mask: ``(B, T)`` 0/1 mask of the tokens that count (response tokens, minus
            overlong-filtered responses).
        mode: one of :data:`LOSS_AGG_MODES`.
        group_index: ``(B,)`` prompt-group id of each row; needed by ``group-token-mean``.
        max_len: the constant ``L_max`` of ``seq-mean-token-sum-norm`` (defaults to ``T``).

    Returns:
        ``(B,)`` float64 weights (exact for any loss dtype: :func:`weighted_token_sum` casts them to
        the loss's, so a float64 loss is not normalised in float32). Rows whose mask is all zero get
        weight 0; modes that average over sequences count only rows with at least one token.

    Modes (``|o_i|`` = ``mask[i].sum()``, ``B'`` = rows with ``|o_i| > 0``):
        - ``seq-mean-token-mean``: ``w_i = 1 / (B' |o_i|)`` (GRPO, Eq. 9 aggregation)
        - ``token-mean``: ``w_i = 1 / sum_j |o_j|`` (DAPO Eq. 12)
        - ``seq-mean-token-sum-norm``: ``w_i = 1 / (B * L_max)`` (Dr.GRPO; constant)
        - ``group-token-mean``: ``w_i = 1 / (N' * sum_{j in g(i)} |o_j|)``: token
          mean inside each prompt group, then mean over the ``N'`` groups with tokens.
    """
    _check_choice("loss_agg mode", mode, LOSS_AGG_MODES)
    mask = mask.to(torch.float64)
    lengths = mask.sum(dim=1)
    has_tokens = lengths > 0
    zeros = torch.zeros_like(lengths)
    if mode == "token-mean":
        total = lengths.sum()
        return zeros if total == 0 else torch.where(has_tokens, 1.0 / total, zeros)
    if mode == "seq-mean-token-mean":
        n_seq = has_tokens.sum()
        if n_seq == 0:
            return zeros
        return torch.where(has_tokens, 1.0 / (n_seq * lengths.clamp(min=1.0)), zeros)
    if mode == "seq-mean-token-sum-norm":
        denom = mask.shape[0] * (max_len if max_len is not None else mask.shape[1])
        return torch.full_like(lengths, 1.0 / denom)
    # group-token-mean
    if group_index is None:
        raise ValueError("group-token-mean needs group_index (the prompt group of each row)")
    _, inverse = torch.unique(group_index, return_inverse=True)
    n_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
    group_tokens = torch.zeros(n_groups, dtype=lengths.dtype).index_add_(0, inverse, lengths)
    n_nonempty = (group_tokens > 0).sum()
    if n_nonempty == 0:
        return zeros
    per_row = group_tokens[inverse]
    return torch.where(per_row > 0, 1.0 / (n_nonempty * per_row.clamp(min=1.0)), zeros)


def aggregate_loss(
    loss: Tensor,
    mask: Tensor,
    mode: str | None = None,
    group_index: Tensor | None = None,
    max_len: int | None = None,
    weights: Tensor | None = None,
) -> Tensor:
    """Reduce a per-token loss to a scalar with a named mode (Token-level Loss switch).

    ``seq-mean-token-mean`` is GRPO's sample-level loss, ``token-mean`` is DAPO's
    token-level loss (Eq. 12); see :func:`loss_normaliser` for all modes.

    Args:
        loss: ``(B, T)`` per-token loss.
        mask: ``(B, T)`` 0/1 mask of the tokens that count.
        mode: one of :data:`LOSS_AGG_MODES` (not needed when ``weights`` are given).
        group_index, max_len: as in :func:`loss_normaliser`.
        weights: ``(B,)`` precomputed mini-batch weights (from :func:`loss_normaliser`
            on the whole mini-batch). Pass them when ``loss`` is one micro-batch of
            a larger mini-batch: the micro-batch results then sum to the mini-batch
            loss exactly. ``None`` computes them from this batch alone.

    Returns:
        scalar tensor. A batch with no counted token gives 0 (with a grad path).
    """
    if weights is None:
        if mode is None:
            raise ValueError("aggregate_loss needs a mode or precomputed weights")
        weights = loss_normaliser(mask, mode, group_index, max_len)
    return weighted_token_sum(loss, mask, weights)


def weighted_token_sum(values: Tensor, mask: Tensor, weights: Tensor) -> Tensor:
    """``sum_i weights_i * sum_t mask_it * values_it`` for ``(B, T)`` values, ``(B,)`` weights."""
    per_row = (values * mask.to(values.dtype)).sum(dim=1)
    return (per_row * weights.to(values.dtype)).sum()


# --------------------------------------------------------------------------- #
# KL against a reference policy (removed in DAPO; available for GRPO studies)  #
# --------------------------------------------------------------------------- #
def kl_penalty(logp: Tensor, ref_logp: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token KL estimate of ``KL(pi || pi_ref)`` from sampled tokens (Schulman 2020).

    With ``d = logp - ref_logp``: ``k1 = d``, ``k2 = d^2 / 2``, ``k3 = exp(-d) + d - 1``.
    Aggregate the ``(B, T)`` result with :func:`aggregate_loss` in the same mode as
    the policy loss. DAPO removes this term (``algo.kl_coef = 0``).
    """
    _check_choice("kl_estimator", estimator, KL_ESTIMATORS)
    d = logp - ref_logp
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d * d
    return torch.exp(-d) + d - 1.0


# --------------------------------------------------------------------------- #
# Overlong Filtering                                                            #
# --------------------------------------------------------------------------- #
def overlong_filtering(mask: Tensor, truncated: Tensor) -> Tensor:
    """Mask out truncated responses entirely (DAPO §3.4, Overlong Filtering).

    A response is truncated when it hit the length cap without emitting EOS. Its
    tokens leave both the numerator and the denominator of every aggregation mode
    (the returned mask is what :func:`loss_normaliser` counts). Its reward still
    enters its group's advantage statistics (semantic choice 4: mask, not drop).

    Args:
        mask: ``(B, T)`` response-token mask.
        truncated: ``(B,)`` bool.

    Returns:
        ``(B, T)`` mask with truncated rows zeroed.
    """
    keep = (~truncated.bool()).to(mask.dtype)[:, None]
    return mask * keep


# --------------------------------------------------------------------------- #
# Overlong Reward Shaping                                                       #
# --------------------------------------------------------------------------- #
def overlong_punishment(
    lengths: Tensor,
    max_len: int,
    cache_len: int,
    factor: float = 1.0,
    mode: str = "soft",
) -> Tensor:
    """Length-based reward term, added to the correctness reward.

    ``mode="soft"`` is the paper's Soft Overlong Punishment (DAPO Eq. 13), with
    ``L_max = max_len`` and ``L_cache = cache_len``::

        0                                  if |y| <= L_max - L_cache
        ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
        -1                                 if |y| > L_max

    times ``factor`` (1.0 in the paper). The other modes are the seed documents'
    readings, kept as named options; they are **not** the paper's:

    - ``"linear_ramp"`` (seed 000): ``-clamp((|y| - T0) / (L_max - T0), 0, 1)``
      with the threshold ``T0 = L_max - L_cache``; equal to ``soft`` up to L_max,
      and -1 (not a jump) beyond.
    - ``"beyond_max"`` (seed 001): ``-max(0, |y| - L_max) / L_max``: nothing up to
      L_max, then linear. Note: if ``L_max`` is the generation cap nothing is ever
      beyond it, so this mode expects a soft ``max_len`` below the cap.
    - ``"none"``: zeros.

    Args:
        lengths: ``(B,)`` response lengths in tokens (EOS included).
        max_len: ``L_max``; cache_len: ``L_cache`` (``0 <= cache_len <= max_len``).

    Returns:
        ``(B,)`` float penalties (``<= 0``).
    """
    _check_choice("overlong_punishment mode", mode, OVERLONG_PUNISHMENT_MODES)
    if not 0 <= cache_len <= max_len:
        raise ValueError(f"need 0 <= cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}")
    lengths = lengths.float()
    if mode == "none":
        return torch.zeros_like(lengths)
    if mode == "beyond_max":
        return -factor * (lengths - max_len).clamp(min=0.0) / max_len
    start = max_len - cache_len
    if cache_len == 0:
        ramp = torch.zeros_like(lengths)
    else:
        ramp = ((start - lengths) / cache_len).clamp(max=0.0)
    if mode == "soft":
        out = torch.where(lengths > max_len, torch.full_like(lengths, -1.0), ramp)
    else:  # linear_ramp
        out = ramp.clamp(min=-1.0)
    return factor * out


# --------------------------------------------------------------------------- #
# Dynamic Sampling                                                              #
# --------------------------------------------------------------------------- #
def dynamic_sampling_keep(signal: Tensor) -> Tensor:
    """Dynamic Sampling's group predicate (DAPO Eq. 11: ``0 < #correct < G``).

    Args:
        signal: ``(N, G)`` per-response filter signal: accuracy (0/1, the default,
            as verl) or the shaped reward (an option; semantic choice 3).

    Returns:
        ``(N,)`` bool: keep a group iff its values are not all equal.
    """
    if signal.dim() != 2:
        raise ValueError(f"signal must be (N, G), got shape {tuple(signal.shape)}")
    return ~(signal == signal[:, :1]).all(dim=1)


# --------------------------------------------------------------------------- #
# Truncated importance sampling (rollout-vs-trainer mismatch; off in DAPO)      #
# --------------------------------------------------------------------------- #
def truncated_is_weights(trainer_old_logp: Tensor, engine_logp: Tensor, cap: float) -> Tensor:
    """Per-token truncated importance weights ``min(exp(old_trainer - engine), cap)``.

    Tokens were drawn from the rollout engine's distribution but the loss treats them
    as drawn from the trainer's ``pi_old`` (Yao et al. 2025; verl ``tis_imp_ratio_cap``,
    TRL ``vllm_importance_sampling_cap``). The trainer multiplies each token's advantage
    by ``w_t`` (equivalently its loss, since ``w_t > 0``); no grad flows through it.

    Args:
        trainer_old_logp: ``(B, T)`` the trainer's log-probs of the sampled tokens.
        engine_logp: ``(B, T)`` the engine's log-probs of the same tokens.
        cap: ``C >= 1`` (verl / TRL default 2).

    Returns:
        ``(B, T)`` detached weights in ``(0, cap]``, in ``trainer_old_logp``'s dtype.
        Padding positions hold whatever the inputs hold there; the loss mask drops them.
    """
    if cap < 1.0:
        raise ValueError(f"tis cap must be >= 1, got {cap}")
    if trainer_old_logp.shape != engine_logp.shape:
        raise ValueError(f"shapes differ: {tuple(trainer_old_logp.shape)} vs {tuple(engine_logp.shape)}")
    w = torch.exp(trainer_old_logp.detach() - engine_logp.detach().to(trainer_old_logp.dtype))
    return w.clamp(max=cap)


# --------------------------------------------------------------------------- #
# Composition used by the trainer: one mini-batch from micro-batches            #
# --------------------------------------------------------------------------- #
def policy_loss(
    *,
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    weights: Tensor,
    surrogate: Callable[[Tensor, Tensor, Tensor], SurrogateOut],
    ref_logp: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    keep: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """One micro-batch's share of the mini-batch loss, plus its statistics.

    ``weights`` are the mini-batch weights of :func:`loss_normaliser`, sliced to
    this micro-batch's rows: summing the returned losses over the micro-batches of
    a mini-batch gives exactly the mini-batch loss, so calling ``backward()`` on
    each accumulates exactly the mini-batch gradient.

    ``surrogate(logp, old_logp, advantages, mask=mask)`` gives the per-token loss and clip flags
    (the ``surrogate`` slot, :mod:`dapo_exp.fixes`: :func:`clipped_surrogate` with its clip
    ranges bound unless a fix fills the slot). The aggregation is
    :func:`aggregate_loss` with the mini-batch ``weights``.

    ``keep`` (``(B, T)``; None = all) selects the tokens whose policy-gradient term counts (e.g.
    :func:`top_entropy_mask`), in the numerator only: the surrogate, the ``weights`` and the KL term
    still see all of ``mask`` (the 80/20 paper's Eq. 3 and TRL's ``top_entropy_quantile``).

    Returns:
        ``(loss, stats)``: scalar loss; ``stats`` holds this micro-batch's share of
        the policy-gradient loss and KL (they add up over micro-batches to the
        mini-batch values) and plain counts over the masked tokens (``n_tokens``,
        ``n_clipped_high``, ``n_clipped_low``, ``n_clipped_dual``, ``ratio_sum``),
        from which the trainer computes token fractions.
    """
    out = surrogate(logp, old_logp, advantages, mask=mask)
    m = mask.to(logp.dtype)
    pg_mask = mask if keep is None else m * keep.to(m.dtype)
    pg = aggregate_loss(out.loss, pg_mask, weights=weights)
    loss = pg

    def count(x: Tensor) -> Tensor:
        return (x.to(logp.dtype) * m).sum().detach()

    stats = {
        "pg_loss": pg.detach(),
        "n_tokens": m.sum().detach(),
        "n_clipped_high": count(out.clipped_high),
        "n_clipped_low": count(out.clipped_low),
        "n_clipped_dual": count(out.clipped_dual),
        "ratio_sum": count(out.ratio),
    }
    if keep is not None:
        stats["n_kept"] = (pg_mask.to(logp.dtype) * m).sum().detach()
    if ref_logp is not None and kl_coef != 0.0:
        kl = aggregate_loss(kl_penalty(logp, ref_logp, kl_estimator), mask, weights=weights)
        loss = loss + kl_coef * kl
        stats["kl"] = kl.detach()
    return loss, stats


# =========================================================================== #
# The GRPO family after DAPO                                        #
# =========================================================================== #
# Pure functions of the later members of the family, in the same style as above:
# tensors and scalars in, tensors out; scalars keyword-only, defaults the papers'.
# Every surrogate returns a :class:`SurrogateOut` whose ``loss`` is ``(B, T)``, so it
# plugs into :func:`policy_loss` (``surrogate=``) and is reduced by
# :func:`aggregate_loss` like the PPO/DAPO surrogate. Those that need the response
# mask take it as the keyword ``mask``: ``functools.partial(f, eps_low=..., ...)``
# leaves ``(logp, old_logp, advantages, *, mask)``, and the trainer binds ``mask``
# (and a seeded ``generator`` for Clip-Cov) per micro-batch.
#
# ============================  ==================================  ===========================
# method                        function                            verl 0.9.1 counterpart
# ============================  ==================================  ===========================
# Dr. GRPO                      :func:`group_advantages` (no std),  ``compute_grpo_outcome_
#                               ``seq-mean-token-sum-norm``          advantage``, ``agg_loss``
# GSPO / GSPO-token             :func:`gspo_surrogate`              loss_mode ``gspo``
# CISPO                         :func:`cispo_surrogate`             loss_mode ``cispo``
# GMPO                          :func:`gmpo_surrogate`              loss_mode ``geo_mean``
# Clip-Cov                      :func:`clip_cov_surrogate`          loss_mode ``clip_cov``
# KL-Cov                        :func:`kl_cov_surrogate`            loss_mode ``kl_cov``
# Beyond the 80/20 rule         :func:`top_entropy_mask`            (TRL ``top_entropy_quantile``)
# sequence-level TIS            :func:`sequence_is_weights`         ``rollout_is="sequence"``
# rejection / IcePop band       :func:`rollout_band_mask`           ``rollout_rs=*_k1``, IcePop
# rollout correction (both)     :func:`rollout_correction_weights`  ``algorithm.rollout_correction``
# ============================  ==================================  ===========================
#
# Numerical guards: like :func:`clipped_surrogate` (and verl's vanilla / cispo losses),
# token log-ratios are clamped to +-20 before ``exp`` so that no padding position can
# overflow to ``inf`` (``inf * 0`` = NaN in the masked sum). verl's clip_cov, kl_cov and
# geo_mean exponentiate unclamped, so they differ from ours only where ``|log r| > 20``;
# GSPO clamps the log sequence ratio from above at 10, as verl does.
GSPO_FORMS = ("token", "sequence")
SEQUENCE_IS_AGGREGATIONS = ("product", "geometric")
BAND_LEVELS = ("token", "sequence", "geometric")
LOG_RATIO_GUARD = 20.0
GSPO_LOG_RATIO_MAX = 10.0


def _token_advantages(advantages: Tensor, like: Tensor) -> Tensor:
    """``(B,)`` / ``(B, 1)`` / ``(B, T)`` advantages as a ``(B, T)`` tensor in ``like``'s dtype."""
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    return advantages.to(like.dtype).expand_as(like)


def _row_mean(values: Tensor, mask: Tensor) -> Tensor:
    """``(B,)`` mean of ``values`` over each row's masked tokens; 0 for a row without tokens."""
    m = mask.to(values.dtype)
    return (values * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)


def _check_eps(eps_low: float, eps_high: float) -> None:
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"eps_low and eps_high must be >= 0, got {eps_low}, {eps_high}")


# --------------------------------------------------------------------------- #
# GSPO (Zheng et al. 2025, arXiv 2507.18071)                                    #
# --------------------------------------------------------------------------- #
def _gspo_ratio(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
                form: str) -> tuple[Tensor, Tensor]:
    """GSPO's ``(B, T)`` ratio (``s_it`` for ``token``, ``s_i`` broadcast for ``sequence``) and advantages."""
    m = mask.to(logp.dtype)
    log_s = ((logp - old_logp) * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)  # (B,)
    if form == "token":
        log_sit = (logp - logp.detach() + log_s.detach()[:, None]).clamp(max=GSPO_LOG_RATIO_MAX)
        return torch.exp(log_sit), _token_advantages(advantages, logp)
    if advantages.dim() == 2 and advantages.shape[1] != 1:
        adv = _row_mean(advantages.to(logp.dtype), mask)[:, None].expand_as(logp)
    else:
        adv = _token_advantages(advantages, logp)
    return torch.exp(log_s.clamp(max=GSPO_LOG_RATIO_MAX))[:, None].expand_as(logp), adv


def gspo_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    *,
    mask: Tensor,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    form: str = "token",
) -> SurrogateOut:
    """Group Sequence Policy Optimization: a clipped *sequence-level* ratio (GSPO Eqs. 5-7, 10-11).

    The length-normalised sequence ratio over the response's masked tokens (Eq. 7)::

        s_i = (pi(y_i|x) / pi_old(y_i|x))^(1/|y_i|) = exp( (1/|y_i|) sum_t (logp_it - old_logp_it) )

    ``form="sequence"`` is GSPO (Eq. 5): one loss per response,
    ``l_i = -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)``, written on every
    masked token of row ``i`` (so that ``seq-mean-token-mean`` gives the paper's
    ``(1/G) sum_i l_i``). ``A_i`` is the row's advantage (the masked row mean when
    ``advantages`` is ``(B, T)``).

    ``form="token"`` is GSPO-token (Eqs. 10-11), what verl implements as loss_mode ``gspo``:
    ``s_it = sg[s_i] * pi(y_it) / sg[pi(y_it)]`` (value ``s_i``, gradient that of ``logp_it``
    scaled by ``s_i``), ``l_it = -min(s_it A_it, clip(s_it, ...) A_it)`` with per-token
    advantages allowed. With one advantage per response the two forms have the same
    per-token loss values and the same gradient under *every* aggregation mode (the
    sequence form's ``d s_i / d logp_it = s_i / |y_i|`` is spread over ``|y_i|`` equal
    terms); they differ only when the advantage varies along the response.

    The log sequence ratio is clamped from above at ``GSPO_LOG_RATIO_MAX = 10`` (verl's
    guard; no gradient beyond). A row without tokens has ``s_i = 1``.

    Args:
        logp, old_logp: ``(B, T)`` log-probs of the sampled tokens (``old_logp`` without grad).
        advantages: ``(B,)``, ``(B, 1)`` or ``(B, T)``.
        mask: ``(B, T)`` 0/1 response mask (needed for ``|y_i|``; keyword, bound per call).
        eps_low, eps_high: the sequence clip range; the paper uses 3e-4 / 4e-4 (much
            narrower than token-level ranges since ``s_i`` is a per-token geometric mean).
        form: ``"token"`` (GSPO-token, default, as verl) or ``"sequence"`` (GSPO).

    Returns:
        :class:`SurrogateOut`, all ``(B, T)``: ``ratio`` is ``s_i`` on every token of row
        ``i``; ``clipped_high`` = ``A > 0 and s > 1 + eps_high``, ``clipped_low`` =
        ``A < 0 and s < 1 - eps_low``; ``clipped_dual`` all False.
    """
    _check_choice("gspo form", form, GSPO_FORMS)
    _check_eps(eps_low, eps_high)
    ratio, adv = _gspo_ratio(logp, old_logp, advantages, mask, form)
    loss = -torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv)
    r = ratio.detach()
    clipped_high = (adv > 0) & (r > 1.0 + eps_high)
    clipped_low = (adv < 0) & (r < 1.0 - eps_low)
    return SurrogateOut(loss, ratio, clipped_high, clipped_low, torch.zeros_like(clipped_high))


# --------------------------------------------------------------------------- #
# CISPO (MiniMax-M1, arXiv 2506.13585)                                          #
# --------------------------------------------------------------------------- #
def cispo_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    *,
    eps_low: float = 1.0,
    eps_high: float = 4.0,
    mask: Tensor | None = None,
) -> SurrogateOut:
    """Clipped IS-weight Policy Optimization (MiniMax-M1 Eqs. 4-5).

    ``l_t = -sg(clip(r_t, 1 - eps_low, 1 + eps_high)) * A_t * logp_t`` with
    ``r_t = exp(logp_t - old_logp_t)``: the importance weight is truncated and detached,
    and *every* token keeps a REINFORCE gradient ``-w_t A_t grad logp_t`` (no token is
    dropped, unlike the PPO clip). The paper aggregates with ``token-mean``
    (``1 / sum_i |o_i|``, as DAPO).

    Defaults: the paper imposes no lower bound ("we set eps_low^IS to a large value"):
    ``eps_low = 1`` makes the lower bound 0, which no ratio can cross. The paper does
    not print its ``eps_high^IS``; the default ``eps_high = 4`` caps the weight at
    ``1 + 4 = 5``, ScaleRL's (arXiv 2510.13786) ``eps_max = 5`` that TRL recommends for
    ``loss_type="cispo"`` (TRL clamps at ``epsilon_high`` itself). verl's cispo takes the
    actor's ``clip_ratio_low / clip_ratio_high``, 0.2 / 0.2 unless set: with those values
    ours is verl's exactly (tests/test_verl_parity.py).

    Args:
        logp, old_logp: ``(B, T)``; advantages: ``(B,)``, ``(B, 1)`` or ``(B, T)``.
        eps_low, eps_high: the weight's clip range, ``>= 0``.

    Returns:
        :class:`SurrogateOut`: ``ratio`` = ``r_t`` (log-ratio clamped to +-20 as verl);
        ``clipped_high`` = ``r > 1 + eps_high`` and ``clipped_low`` = ``r < 1 - eps_low``
        whatever the sign of ``A`` (the weight is truncated there, the token still
        counts); ``clipped_dual`` all False.
    """
    _check_eps(eps_low, eps_high)
    adv = _token_advantages(advantages, logp)
    ratio = torch.exp((logp - old_logp).clamp(-LOG_RATIO_GUARD, LOG_RATIO_GUARD))
    weight = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high).detach()
    loss = -weight * adv * logp
    r = ratio.detach()
    clipped_high = r > 1.0 + eps_high
    clipped_low = r < 1.0 - eps_low
    return SurrogateOut(loss, ratio, clipped_high, clipped_low, torch.zeros_like(clipped_high))


# --------------------------------------------------------------------------- #
# GMPO (Zhao et al. 2025, arXiv 2507.20673)                                     #
# --------------------------------------------------------------------------- #
def gmpo_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    *,
    mask: Tensor,
    eps_low: float = 0.4,
    eps_high: float = 0.4,
) -> SurrogateOut:
    """Geometric-Mean Policy Optimization (GMPO Eq. 4, sign-aware token clipping in log space).

    ``J_i = { prod_t |min(r_it A_i, clip(r_it, e^-eps_low, e^eps_high) A_i)| }^(1/|o_i|) sgn(A_i)``,
    computed as in the paper's code and verl's ``geo_mean``: with ``d_t = logp_t - old_logp_t``
    and ``c_t = clamp(d_t, -eps_low, eps_high)``, the sign-aware clipped log-ratio is
    ``d~_t = sgn(A_t) min(sgn(A_t) d_t, sgn(A_t) c_t)`` (``A > 0``: capped above at
    ``eps_high``; ``A < 0``: floored at ``-eps_low``), the sequence ratio is the geometric
    mean ``R_i = exp(mean_t d~_t)`` over the masked tokens, and ``l_i = -A_i R_i`` with
    ``A_i`` the masked row mean of the advantages. The paper's clip range is
    ``(e^-0.4, e^0.4)``, i.e. ``eps_low = eps_high = 0.4`` in log space (verl reads them
    from ``clip_ratio_low / clip_ratio_high`` in the same log space).

    ``l_i`` is written on every masked token of row ``i``; aggregate with
    ``seq-mean-token-mean`` to get the paper's ``(1/G) sum_i l_i``. verl's ``geo_mean``
    ignores ``loss_agg_mode`` and takes ``mean_i l_i`` over *all* ``B`` rows, rows without
    tokens included (they contribute 0): it equals ours times ``B' / B`` (``B'`` = rows
    with tokens).

    Args:
        logp, old_logp: ``(B, T)``; advantages: ``(B,)``, ``(B, 1)`` or ``(B, T)``.
        mask: ``(B, T)`` response mask (keyword, bound per call).
        eps_low, eps_high: log-space clip range, ``>= 0``.

    Returns:
        :class:`SurrogateOut`: ``ratio`` = ``R_i`` on every token of row ``i``;
        ``clipped_high`` = ``A > 0 and d > eps_high``, ``clipped_low`` = ``A < 0 and
        d < -eps_low`` (token level: where the sign-aware bound is active).
    """
    _check_eps(eps_low, eps_high)
    adv = _token_advantages(advantages, logp)
    d = (logp - old_logp).clamp(-LOG_RATIO_GUARD, LOG_RATIO_GUARD)
    c = d.clamp(-eps_low, eps_high)
    sgn = torch.sign(adv)
    d_clip = sgn * torch.minimum(sgn * d, sgn * c)
    seq_ratio = torch.exp(_row_mean(d_clip, mask))
    seq_adv = _row_mean(adv, mask)
    loss = (-seq_adv * seq_ratio)[:, None].expand_as(logp)
    dd = d.detach()
    clipped_high = (adv > 0) & (dd > eps_high)
    clipped_low = (adv < 0) & (dd < -eps_low)
    ratio = seq_ratio[:, None].expand_as(logp)
    return SurrogateOut(loss, ratio, clipped_high, clipped_low, torch.zeros_like(clipped_high))


# --------------------------------------------------------------------------- #
# Clip-Cov and KL-Cov (Cui et al. 2025, arXiv 2505.22617)                       #
# --------------------------------------------------------------------------- #
def token_covariance(advantages: Tensor, logp: Tensor, mask: Tensor) -> Tensor:
    """Per-token covariance of log-prob and advantage (Cui et al. 2025, Eq. 10 / §4.1).

    ``cov_t = (A_t - mean(A)) * (logp_t - mean(logp))`` with both means over the masked
    tokens of the whole (micro-)batch passed in; computed without grad.

    Returns:
        ``(B, T)``; 0 at positions outside ``mask`` (and everywhere if no token is masked in).
    """
    adv = _token_advantages(advantages, logp).detach()
    lp = logp.detach()
    m = mask.bool()
    zeros = torch.zeros_like(lp)
    if not bool(m.any()):
        return zeros
    cov = (adv - adv[m].mean()) * (lp - lp[m].mean())
    return torch.where(m, cov, zeros)


def clip_cov_selection(
    cov: Tensor,
    mask: Tensor,
    *,
    clip_ratio: float,
    cov_lb: float,
    cov_ub: float,
    exclude: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """The tokens Clip-Cov detaches: a random ``clip_ratio`` share with ``cov_lb < cov < cov_ub``.

    ``n = max(int(clip_ratio * N), 1)`` tokens (``N`` = masked tokens) are drawn uniformly
    without replacement from the candidates (masked, not in ``exclude``, covariance strictly
    inside the bounds), all of them if fewer: candidates are listed in row-major order and
    the first ``n`` of ``torch.randperm(#candidates, generator=generator)`` are taken, as verl
    does (so a generator seeded like verl's global RNG draws the same tokens).

    Returns:
        ``(B, T)`` bool.
    """
    m = mask.bool()
    cand = m & (cov > cov_lb) & (cov < cov_ub)
    if exclude is not None:
        cand = cand & ~exclude.bool()
    selected = torch.zeros_like(m)
    flat = torch.nonzero(cand.reshape(-1), as_tuple=True)[0]
    if flat.numel() == 0:
        return selected
    n_clip = max(int(clip_ratio * int(m.sum().item())), 1)
    if generator is None:
        perm = torch.randperm(flat.numel())
    else:
        perm = torch.randperm(flat.numel(), generator=generator, device=generator.device)
    chosen = flat[perm.to(flat.device)[: min(n_clip, flat.numel())]]
    selected.view(-1)[chosen] = True
    return selected


def clip_cov_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    *,
    mask: Tensor,
    generator: torch.Generator | None = None,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    clip_ratio: float = 2e-4,
    cov_lb: float = 1.0,
    cov_ub: float = 5.0,
) -> SurrogateOut:
    """Clip-Cov (Cui et al. 2025, Eq. 11): PPO's clipped surrogate, with the gradient of a
    few high-covariance tokens cut.

    ``l_t = -min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t)`` (:func:`clipped_surrogate`),
    except on ``I_clip``: a random ``clip_ratio`` share of the masked tokens (at least one)
    among those the PPO clip left active whose covariance :func:`token_covariance` lies
    strictly in ``(cov_lb, cov_ub)`` (:func:`clip_cov_selection`); there ``l_t`` is detached
    (stop-gradient: value kept, no gradient). Defaults are the paper's and verl's:
    ``clip_ratio = 2e-4``, ``cov_lb = 1``, ``cov_ub = 5``, PPO's ``eps = 0.2``.

    Documented difference: verl's ``clip_cov`` multiplies the selected tokens' loss by 0
    (value *and* gradient 0); ours keeps the value (so a logged pg loss stays the PPO
    surrogate's), with the same gradient. The share is taken over the tokens passed in
    (verl: per micro-batch as well).

    Args:
        logp, old_logp, advantages: as :func:`clipped_surrogate`.
        mask: ``(B, T)`` response mask (keyword, bound per call).
        generator: the random draw's ``torch.Generator``, seeded by the caller from the
            run's seed (``None``: torch's global generator, as verl).
        eps_low, eps_high: PPO clip range; clip_ratio, cov_lb, cov_ub: as above.

    Returns:
        :class:`SurrogateOut` of the PPO clip (its flags), the detached tokens as ``selected``.
    """
    if not 0 < clip_ratio <= 1:
        raise ValueError(f"clip_ratio must be in (0, 1], got {clip_ratio}")
    base = clipped_surrogate(logp, old_logp, advantages, eps_low, eps_high)
    cov = token_covariance(advantages, logp, mask)
    selected = clip_cov_selection(cov, mask, clip_ratio=clip_ratio, cov_lb=cov_lb, cov_ub=cov_ub,
                                  exclude=base.clipped_high | base.clipped_low, generator=generator)
    loss = torch.where(selected, base.loss.detach(), base.loss)
    return base._replace(loss=loss, selected=selected)


def kl_cov_selection(cov: Tensor, mask: Tensor, *, k_ratio: float) -> Tensor:
    """The tokens KL-Cov penalises: the top ``max(int(k_ratio * N), 1)`` masked tokens by covariance.

    ``N`` = masked tokens (none selected when ``N = 0``); ``torch.topk`` over the masked
    tokens in row-major order (ties broken as verl's ``kl_cov``).

    Returns:
        ``(B, T)`` bool.
    """
    m = mask.bool()
    selected = torch.zeros_like(m)
    flat = torch.nonzero(m.reshape(-1), as_tuple=True)[0]
    if flat.numel() == 0:
        return selected
    k = max(1, int(flat.numel() * k_ratio))
    top = torch.topk(cov.reshape(-1)[flat], k, largest=True).indices
    selected.view(-1)[flat[top]] = True
    return selected


def kl_cov_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    *,
    mask: Tensor,
    k_ratio: float = 2e-4,
    kl_coef: float = 1.0,
) -> SurrogateOut:
    """KL-Cov (Cui et al. 2025, Eq. 12): the unclipped surrogate plus a KL penalty on the
    top-covariance tokens.

    ``l_t = -r_t A_t + kl_coef * |logp_t - old_logp_t| * [t in I_KL]`` where ``I_KL`` is the
    top ``k_ratio`` share (at least one) of the masked tokens by :func:`token_covariance`
    (:func:`kl_cov_selection`); no ratio clipping anywhere. ``k_ratio = 2e-4`` is verl's
    default and the authors' setting for Qwen2.5-32B (2e-3 for 7B); ``kl_coef = 1`` is the
    authors' (and verl's ``kl_cov`` fallback) value. verl's ``PolicyLossConfig.ppo_kl_coef``
    defaults to 0.1: a deliberate difference, pass ``kl_coef`` explicitly to match a verl run.

    Args:
        logp, old_logp, advantages: as :func:`clipped_surrogate`.
        mask: ``(B, T)`` response mask (keyword, bound per call).
        k_ratio: share of penalised tokens, in ``(0, 1]``; kl_coef: ``kappa >= 0``.

    Returns:
        :class:`SurrogateOut`: ``ratio`` = ``r_t`` (log-ratio clamped to +-20), flags all
        False (nothing is clipped), the penalised tokens (:func:`kl_cov_selection`) as ``selected``.
    """
    if not 0 < k_ratio <= 1:
        raise ValueError(f"k_ratio must be in (0, 1], got {k_ratio}")
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
    adv = _token_advantages(advantages, logp)
    log_r = logp - old_logp
    ratio = torch.exp(log_r.clamp(-LOG_RATIO_GUARD, LOG_RATIO_GUARD))
    loss = -adv * ratio
    selected = kl_cov_selection(token_covariance(advantages, logp, mask), mask, k_ratio=k_ratio)
    loss = torch.where(selected, loss + kl_coef * log_r.abs(), loss)
    none = torch.zeros_like(selected)
    return SurrogateOut(loss, ratio, none, none.clone(), none.clone(), selected)


# --------------------------------------------------------------------------- #
# High-entropy minority tokens (Wang et al. 2025, "Beyond the 80/20 rule")      #
# --------------------------------------------------------------------------- #
def top_entropy_mask(entropy: Tensor, mask: Tensor, *, rho: float = 0.2) -> Tensor:
    """Keep only the top-``rho`` share of tokens by entropy (Wang et al. 2025, arXiv 2506.01939, Eq. 3).

    ``keep_t = mask_t and H_t >= tau_rho``, with ``tau_rho`` the ``(1 - rho)``-quantile of the
    entropies of the masked tokens of the (mini-)batch passed in (linear interpolation
    between order statistics, as ``torch.quantile``). The paper updates on the top 20 %
    (``rho = 0.2``); tokens tied at the threshold are all kept, so slightly more than
    ``rho`` can survive. This is TRL's ``GRPOTrainer.get_high_entropy_mask`` rule
    (``top_entropy_quantile = rho``) on one process; TRL casts the entropies to float32
    before the quantile, ours keeps their dtype (equal for float32 input). The quantile is
    computed by sorting, so it has no input-size limit (``torch.quantile`` stops at 2^24).

    Args:
        entropy: ``(B, T)`` per-token entropies (no grad needed).
        mask: ``(B, T)`` response mask.
        rho: share kept, in ``(0, 1]`` (1 keeps every masked token).

    Returns:
        ``(B, T)`` bool, False outside ``mask``; all False when nothing is masked in. Multiply
        it into the loss mask (numerator only, or the normaliser too: the caller's choice).
    """
    if not 0 < rho <= 1:
        raise ValueError(f"rho must be in (0, 1], got {rho}")
    m = mask.bool()
    values = entropy.detach()[m]
    if values.numel() == 0:
        return torch.zeros_like(m)
    if not values.is_floating_point():
        values = values.float()
    ordered, _ = torch.sort(values)
    q = torch.tensor(1.0 - rho, dtype=ordered.dtype, device=ordered.device)
    rank = q * (ordered.numel() - 1)
    below = rank.floor()
    lo = ordered[below.long()]
    hi = ordered[rank.ceil().long()]
    threshold = torch.lerp(lo, hi, rank - below)
    return m & (entropy.detach() >= threshold)


# --------------------------------------------------------------------------- #
# Sequence-level rollout correction (trainer-old vs engine log-probs)           #
# --------------------------------------------------------------------------- #
def sequence_is_weights(
    trainer_old_logp: Tensor,
    engine_logp: Tensor,
    mask: Tensor,
    *,
    cap: float = 2.0,
    aggregation: str = "product",
) -> Tensor:
    """Sequence-level truncated importance weights of the rollout mismatch.

    With ``d_t = trainer_old_logp_t - engine_logp_t`` over the response's masked tokens:

    - ``"product"``: ``w_i = min(exp(sum_t d_t), cap)``, the sequence likelihood ratio
      ``pi_old(y_i) / pi_engine(y_i)`` (unbiased before truncation; verl
      ``rollout_is="sequence"``, Seq-TIS);
    - ``"geometric"``: ``w_i = min(exp(mean_t d_t), cap)``, the per-token geometric mean
      (length-normalised, as GSPO's ratio).

    The log of the sequence ratio is clamped to +-20 before ``exp`` (verl's ``SAFETY_BOUND``).
    The token-level weight is :func:`truncated_is_weights`. Default ``cap = 2`` is verl's
    ``rollout_is_threshold`` default (its docs suggest 2-10 at sequence level).

    Args:
        trainer_old_logp, engine_logp: ``(B, T)``; mask: ``(B, T)`` response mask.
        cap: truncation ``C >= 1``; aggregation: one of :data:`SEQUENCE_IS_AGGREGATIONS`.

    Returns:
        ``(B, T)`` detached weights, row ``i`` holding ``w_i`` at every position (padding
        included; the loss mask drops it); a row without tokens gets 1.
    """
    _check_choice("aggregation", aggregation, SEQUENCE_IS_AGGREGATIONS)
    if cap < 1.0:
        raise ValueError(f"sequence IS cap must be >= 1, got {cap}")
    if trainer_old_logp.shape != engine_logp.shape:
        raise ValueError(f"shapes differ: {tuple(trainer_old_logp.shape)} vs {tuple(engine_logp.shape)}")
    d = trainer_old_logp.detach() - engine_logp.detach().to(trainer_old_logp.dtype)
    m = mask.to(d.dtype)
    s = (d * m).sum(dim=1)
    if aggregation == "geometric":
        s = s / m.sum(dim=1).clamp(min=1.0)
    w = torch.exp(s.clamp(-LOG_RATIO_GUARD, LOG_RATIO_GUARD)).clamp(max=cap)
    return w[:, None].expand_as(d).clone()


def rollout_band_mask(
    trainer_old_logp: Tensor,
    engine_logp: Tensor,
    mask: Tensor,
    *,
    low: float = 0.5,
    high: float = 5.0,
    level: str = "token",
) -> Tensor:
    """Mask out tokens / sequences whose trainer-vs-engine ratio lies outside ``[low, high]``.

    With ``d_t = clamp(trainer_old_logp_t - engine_logp_t, -20, 20)`` the statistic is
    ``rho_t = exp(d_t)`` (``"token"``), ``exp(sum_t d_t)`` (``"sequence"``, the product
    ratio) or ``exp(mean_t d_t)`` (``"geometric"``); a token is kept iff its statistic
    (its row's, for the sequence levels) lies in ``[low, high]``. This is rejection
    sampling against the mismatch (verl ``rollout_rs`` = ``token_k1`` / ``seq_sum_k1`` /
    ``seq_mean_k1``) and the masking half of IcePop (Ling team 2025, bounds ``[0.5, 5]``,
    the default; verl ``RolloutCorrectionConfig.decoupled_token_icepop``): IcePop's weight is
    ``truncated_is_weights(old, engine, cap=high) * rollout_band_mask(old, engine, mask,
    low=low, high=high)`` (inside the band the cap never binds).

    Documented difference: verl's ``*_k1`` rejection reads ``"lo_hi"`` as bounds on
    ``-log rho`` (``log lo <= -log rho <= log hi``), i.e. it keeps ``rho`` in ``[1/hi, 1/lo]``;
    ours with ``(low, high)`` equals verl's with ``f"{1/high}_{1/low}"`` (the same for a
    symmetric band ``low = 1/high``). verl's IcePop IS threshold ``"lo_hi"`` bounds ``rho``
    itself, as ours.

    Args:
        trainer_old_logp, engine_logp: ``(B, T)``; mask: ``(B, T)`` response mask.
        low, high: ``0 < low <= high``; level: one of :data:`BAND_LEVELS`.

    Returns:
        ``mask`` (same dtype) with the rejected tokens set to 0.
    """
    _check_choice("band level", level, BAND_LEVELS)
    if not 0 < low <= high:
        raise ValueError(f"need 0 < low <= high, got low={low}, high={high}")
    d = (trainer_old_logp.detach() - engine_logp.detach().to(trainer_old_logp.dtype))
    d = d.clamp(-LOG_RATIO_GUARD, LOG_RATIO_GUARD)
    if level == "token":
        stat = d
    else:
        m = mask.to(d.dtype)
        stat = (d * m).sum(dim=1, keepdim=True)
        if level == "geometric":
            stat = stat / m.sum(dim=1, keepdim=True).clamp(min=1.0)
    log_low = torch.tensor(low, dtype=torch.float64).log().item()
    log_high = torch.tensor(high, dtype=torch.float64).log().item()
    keep = (stat >= log_low) & (stat <= log_high)
    return mask * keep.expand_as(d).to(mask.dtype)


ROLLOUT_CORRECTION_LEVELS = ("token", "sequence")


def rollout_correction_weights(
    trainer_old_logp: Tensor,
    engine_logp: Tensor,
    mask: Tensor,
    *,
    level: str = "sequence",
    aggregation: str = "product",
    cap: float | None = 2.0,
    band_low: float | None = None,
    band_high: float | None = None,
) -> Tensor:
    """The rollout-correction weight of every token: truncated IS at token or sequence level, times
    a band mask.

    ``w_t = IS_t * keep_t`` with

    - ``IS_t``: ``level="token"``: :func:`truncated_is_weights` ``min(exp(d_t), cap)``;
      ``level="sequence"``: :func:`sequence_is_weights` of ``aggregation`` (``product``:
      ``min(exp(sum_t d_t), cap)``, ``geometric``: ``min(exp(mean_t d_t), cap)``) on every token of
      the row; ``cap=None``: ``IS_t = 1`` (the band alone);
    - ``keep_t``: 1 when no band is given, else :func:`rollout_band_mask` with ``[band_low,
      band_high]`` at the same statistic (``token``; ``sequence`` for the product;
      ``geometric`` for the geometric mean), 0 outside.

    ``d_t = trainer_old_logp_t - engine_logp_t``. With ``level="token"``, a cap and no band it
    equals :func:`truncated_is_weights`; a band with the cap at or above ``band_high`` is IcePop
    (verl ``rollout_is_threshold="low_high"``): the cap never binds inside the band.

    Returns:
        ``(B, T)`` detached weights ``>= 0`` (padding holds whatever the formula gives there; the
        loss mask drops it).
    """
    _check_choice("rollout correction level", level, ROLLOUT_CORRECTION_LEVELS)
    _check_choice("aggregation", aggregation, SEQUENCE_IS_AGGREGATIONS)
    if (band_low is None) != (band_high is None):
        raise ValueError(f"give both band bounds or neither, got low={band_low}, high={band_high}")
    if cap is None:
        w = torch.ones_like(trainer_old_logp).detach()
    elif level == "token":
        w = truncated_is_weights(trainer_old_logp, engine_logp, cap)
    else:
        w = sequence_is_weights(trainer_old_logp, engine_logp, mask, cap=cap, aggregation=aggregation)
    if band_low is None:
        return w
    band_level = "token" if level == "token" else ("sequence" if aggregation == "product" else "geometric")
    if band_level == "token":
        keep = rollout_band_mask(trainer_old_logp, engine_logp, torch.ones_like(w), low=band_low, high=band_high)
    else:  # the row's verdict on every position of the row (padding included; a row without tokens is kept)
        m = mask.to(w.dtype)
        kept = rollout_band_mask(trainer_old_logp, engine_logp, m, low=band_low, high=band_high, level=band_level)
        keep = (kept.sum(dim=1, keepdim=True) == m.sum(dim=1, keepdim=True)).to(w.dtype).expand_as(w)
    return w * keep
