"""SAPO (Gao et al. 2025, "Soft Adaptive Policy Optimization", arXiv 2511.20347): a soft gate instead of the clip.

The token's ratio ``r_t = exp(logp_t - old_logp_t)`` enters through a sigmoid gate,
``f(r) = (4 / tau) sigmoid(tau (r - 1))``, and the per-token loss is ``l_t = -f(r_t) A_t`` with
``tau = sapo_tau_pos`` where ``A_t > 0`` and ``sapo_tau_neg`` elsewhere (verl's defaults 1.0 / 1.05, the
paper's: a negative temperature above the positive one damps the negative tokens' updates faster).
Its gradient, ``-4 sigmoid(x)(1 - sigmoid(x)) r_t A_t grad logp_t`` with ``x = tau (r_t - 1)``, is the
on-policy gradient at ``r = 1`` and decays smoothly as the ratio leaves 1, where PPO's clip drops it at a
hard edge: no clip range, so Clip-Higher has nothing to act on (they exclude each other).

SAPO's objective is a mean over responses of each response's token mean (verl's ``sapo`` aggregates in
``seq-mean-token-mean`` whatever its ``loss_agg_mode``): GRPO's normaliser, so it excludes the token-level
(DAPO) and constant (Dr. GRPO) normalisers, which would weight each response by its length. It fills the
``surrogate`` slot with :func:`surrogate` and logs ``sapo/damped_tokens``, the loss-mask tokens per
optimizer step whose gradient weight ``4 sigmoid(x)(1 - sigmoid(x)) r_t`` is below 1/2 (half the on-policy
one): the tokens the gate has mostly switched off, as a clip would.
"""

from __future__ import annotations

import functools
from typing import Any

from dapo_exp.fixes.base import Fix, Key, RunInfo, check_range, logs_selected, register_fix
from dapo_exp.fixes.verl_rules import A, Rule, read_by
from dapo_exp.fixes.verl_rules import surrogate as verl_surrogate

DAMPED = 0.5  # a token's gradient weight below this share of the on-policy one counts as damped


def surrogate(logp: Any, old_logp: Any, advantages: Any, *, mask: Any = None, tau_pos: float = 1.0,
              tau_neg: float = 1.05) -> Any:
    """SAPO's per-token loss ``-(4 / tau) sigmoid(tau (r - 1)) A`` (verl ``compute_policy_loss_sapo``).

    Args:
        logp, old_logp: ``(B, T)`` log-probabilities (``old_logp`` without grad); advantages ``(B,)``,
            ``(B, 1)`` or ``(B, T)``; ``mask`` is not read (the gate is per token).
        tau_pos, tau_neg: the gate's temperature where ``A > 0`` and where ``A <= 0`` (``> 0``).

    Returns:
        :class:`dapo_exp.objective.SurrogateOut`: ``ratio`` with the log-ratio clamped to +-20 (verl's guard);
        no bound is clipped (``clipped_*`` all False); ``selected``: the damped tokens (gradient weight
        ``4 sigmoid(x)(1 - sigmoid(x)) r < 1/2``).
    """
    import torch

    from dapo_exp.objective import LOG_RATIO_GUARD, SurrogateOut, _token_advantages

    adv = _token_advantages(advantages, logp)
    ratio = torch.exp((logp - old_logp).clamp(-LOG_RATIO_GUARD, LOG_RATIO_GUARD))
    tau = torch.where(adv > 0, torch.as_tensor(tau_pos, dtype=logp.dtype), torch.as_tensor(tau_neg, dtype=logp.dtype))
    loss = -torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau) * adv
    with torch.no_grad():
        s = torch.sigmoid(tau * (ratio - 1.0))
        damped = 4.0 * s * (1.0 - s) * ratio < DAMPED
    none = torch.zeros_like(damped)
    return SurrogateOut(loss, ratio, none, none, none, selected=damped)


def _bind(algo: Any, run: RunInfo) -> dict[str, Any]:
    return {"surrogate": functools.partial(surrogate, tau_pos=algo.sapo_tau_pos, tau_neg=algo.sapo_tau_neg)}


WHY = ("SAPO's objective is a mean over responses of each one's token mean (verl's sapo aggregates so whatever "
       "its loss_agg_mode); a token-level or constant normaliser would weight each response by its length")

FIX = register_fix(Fix(
    name="sapo", short="sapo", title="SAPO", paper="SAPO (arXiv 2511.20347), verl loss_mode=sapo",
    schema=(
        Key("sapo", bool, False, "SAPO: a sigmoid gate of the token ratio instead of PPO's clip (Gao et al. 2025)"),
        Key("sapo_tau_pos", float, 1.0, "SAPO's gate temperatures where A > 0 / A <= 0 (paper, verl: 1.0 / 1.05)"),
        Key("sapo_tau_neg", float, 1.05, "SAPO's gate temperatures where A > 0 / A <= 0 (paper, verl: 1.0 / 1.05)"),
    ), is_on=lambda a: bool(a.sapo),
    slots=("surrogate",), bind=logs_selected(_bind, "sapo/damped_tokens"),
    check=lambda algo, run: check_range(algo, *((k, "> 0", lambda v: v > 0) for k in ("sapo_tau_pos", "sapo_tau_neg"))),
    excludes=("clip_higher", "token_level_loss", "dr_grpo_norm"),
    why_excluded=(("clip_higher", "SAPO has no clip range: its gate replaces PPO's clip"),
                  ("token_level_loss", WHY), ("dr_grpo_norm", WHY)),
    metrics=("sapo/damped_tokens", "actor/ppo_ratio_mean"),
    verl={"sapo": Rule(f"`{A}policy_loss.loss_mode=sapo`, `{A}tau_pos/tau_neg` = `algo.sapo_tau_pos/neg`",
                       verl_surrogate("sapo", extra=lambda a: {A + "tau_pos": a.sapo_tau_pos,
                                                               A + "tau_neg": a.sapo_tau_neg})),
          **read_by("sapo", "sapo_tau_pos", "sapo_tau_neg")},
))
