"""The GRPO / DAPO objective as small pure functions.

Every function here takes tensors and scalars and returns tensors: no config
object, no model, nothing else of the project (``torch`` is the only import).
The composition layer (:mod:`dapo_exp.algorithms` picks the entries by name,
:mod:`dapo_exp.steps` calls them) reads the config and passes the values in;
config keys under ``algo:`` carry the same names as the keyword arguments below.
Which fix selects which function is recorded in :mod:`dapo_exp.fixes`.

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
(rollout mismatch) TIS        :func:`truncated_is_weights`    ``algo.tis_cap``
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

from typing import Callable, NamedTuple

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


def clipped_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
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
        ``(B,)`` float weights. Rows whose mask is all zero get weight 0; modes
        that average over sequences count only rows with at least one token.

    Modes (``|o_i|`` = ``mask[i].sum()``, ``B'`` = rows with ``|o_i| > 0``):
        - ``seq-mean-token-mean``: ``w_i = 1 / (B' |o_i|)`` (GRPO, Eq. 9 aggregation)
        - ``token-mean``: ``w_i = 1 / sum_j |o_j|`` (DAPO Eq. 12)
        - ``seq-mean-token-sum-norm``: ``w_i = 1 / (B * L_max)`` (Dr.GRPO; constant)
        - ``group-token-mean``: ``w_i = 1 / (N' * sum_{j in g(i)} |o_j|)``: token
          mean inside each prompt group, then mean over the ``N'`` groups with tokens.
    """
    _check_choice("loss_agg mode", mode, LOSS_AGG_MODES)
    mask = mask.float()
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
) -> tuple[Tensor, dict[str, Tensor]]:
    """One micro-batch's share of the mini-batch loss, plus its statistics.

    ``weights`` are the mini-batch weights of :func:`loss_normaliser`, sliced to
    this micro-batch's rows: summing the returned losses over the micro-batches of
    a mini-batch gives exactly the mini-batch loss, so calling ``backward()`` on
    each accumulates exactly the mini-batch gradient.

    ``surrogate(logp, old_logp, advantages)`` gives the per-token loss and clip flags
    (:func:`clipped_surrogate` with its clip ranges bound; chosen by ``algo.policy_loss``
    in :data:`dapo_exp.algorithms.POLICY_LOSSES`). The aggregation is
    :func:`aggregate_loss` with the mini-batch ``weights``.

    Returns:
        ``(loss, stats)``: scalar loss; ``stats`` holds this micro-batch's share of
        the policy-gradient loss and KL (they add up over micro-batches to the
        mini-batch values) and plain counts over the masked tokens (``n_tokens``,
        ``n_clipped_high``, ``n_clipped_low``, ``n_clipped_dual``, ``ratio_sum``),
        from which the trainer computes token fractions.
    """
    out = surrogate(logp, old_logp, advantages)
    pg = aggregate_loss(out.loss, mask, weights=weights)
    loss = pg
    m = mask.to(logp.dtype)

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
    if ref_logp is not None and kl_coef != 0.0:
        kl = aggregate_loss(kl_penalty(logp, ref_logp, kl_estimator), mask, weights=weights)
        loss = loss + kl_coef * kl
        stats["kl"] = kl.detach()
    return loss, stats
