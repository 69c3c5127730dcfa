"""DRO's loss (Direct Reward Optimisation: Richemond et al. 2024, arXiv 2405.19107; the per-token form of Kimi
k1.5, arXiv 2501.12599, as verl 0.9.1's ``dro`` and Tinker's ``dro`` losses write it).

``l_t = -(A_t logp_t - (beta / 2) (logp_t - old_logp_t)^2)``: the policy gradient ``-A_t grad logp_t`` plus
a quadratic penalty on the token's log-ratio that pulls it back to the sampling policy with strength
``beta`` (a soft trust region in place of PPO's clip, so Clip-Higher has nothing to act on: they exclude
each other). verl has no default for ``beta`` (its ``policy_loss.dro_beta`` must be set > 0) and neither
paper gives one for this per-token form; ours is 0.05, the value Tinker's documentation of the same loss
uses. It fills the ``surrogate`` slot with :func:`surrogate`; the normaliser is the run's (verl's dro reads
its ``loss_agg_mode``).
"""

from __future__ import annotations

import functools
from typing import Any

from dapo_exp.fixes.base import Fix, Key, RunInfo, check_range, register_fix
from dapo_exp.fixes.verl_rules import A, Rule, read_by
from dapo_exp.fixes.verl_rules import surrogate as verl_surrogate


def surrogate(logp: Any, old_logp: Any, advantages: Any, *, mask: Any = None, beta: float = 0.05) -> Any:
    """DRO's per-token loss ``-(A logp - beta/2 (logp - old_logp)^2)`` (verl ``compute_policy_loss_dro``).

    The penalty uses the raw log-ratio (verl clamps nothing here); the logged ``ratio`` clamps it to +-20.
    ``mask`` is not read; nothing is clipped (``clipped_*`` all False).
    """
    import torch

    from dapo_exp.objective import LOG_RATIO_GUARD, SurrogateOut, _token_advantages

    adv = _token_advantages(advantages, logp)
    d = logp - old_logp
    loss = -(logp * adv - 0.5 * beta * d.square())
    ratio = torch.exp(d.clamp(-LOG_RATIO_GUARD, LOG_RATIO_GUARD))
    none = torch.zeros_like(logp, dtype=torch.bool)
    return SurrogateOut(loss, ratio, none, none, none)


def _bind(algo: Any, run: RunInfo) -> dict[str, Any]:
    return {"surrogate": functools.partial(surrogate, beta=algo.dro_beta)}


FIX = register_fix(Fix(
    name="dro", short="dro", title="DRO (quadratic log-ratio penalty)",
    paper="DRO (arXiv 2405.19107), Kimi k1.5 (arXiv 2501.12599), verl loss_mode=dro",
    schema=(
        Key("dro", bool, False, "DRO: -A logp + beta/2 (logp - old_logp)^2 per token, no clip (verl's dro)"),
        Key("dro_beta", float, 0.05, "DRO's penalty strength beta > 0 (verl: no default; Tinker's example: 0.05)"),
    ), is_on=lambda a: bool(a.dro), slots=("surrogate",), bind=_bind,
    check=lambda algo, run: check_range(algo, ("dro_beta", "> 0 (verl refuses beta <= 0)", lambda v: v > 0)),
    excludes=("clip_higher",),
    why_excluded=(("clip_higher", "DRO's trust region is its quadratic penalty: no clip range to widen"),),
    metrics=("actor/ppo_ratio_mean",),
    verl={"dro": Rule(f"`{A}policy_loss.loss_mode=dro`, `{A}policy_loss.dro_beta` = `algo.dro_beta`",
                      verl_surrogate("dro", extra=lambda a: {A + "policy_loss.dro_beta": a.dro_beta})),
          **read_by("dro", "dro_beta")},
))
