"""GPG's loss (Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning",
arXiv 2504.02546): the plain policy gradient, ``l_t = -A_t logp_t``.

No importance ratio, no clip, no KL: each token's gradient is ``-A_t grad logp_t`` whatever the old
policy gave it (verl's ``gpg`` loss, which is also the per-token loss of verl's ``reinforce`` without
importance weights). With one optimizer step per batch (``train.updates_per_step=1``) the policy is the old
one and this is the on-policy gradient; over several mini-batches it is not corrected for the drift. It
fills the ``surrogate`` slot with :func:`surrogate`; with no clip range, Clip-Higher has nothing to act on
(they exclude each other). The normaliser is the run's (verl's gpg reads its ``loss_agg_mode``). GPG's
estimator is its own switch, ``gpg_adv``; the ``gpg`` preset turns on both.
"""

from __future__ import annotations

from typing import Any

from dapo_exp.fixes.base import Fix, Key, RunInfo, register_fix
from dapo_exp.fixes.verl_rules import A, Rule
from dapo_exp.fixes.verl_rules import surrogate as verl_surrogate


def surrogate(logp: Any, old_logp: Any, advantages: Any, *, mask: Any = None) -> Any:
    """GPG's per-token loss ``-A logp`` (verl ``compute_policy_loss_gpg``); ``old_logp`` only gives the logged
    ratio (``exp(logp - old_logp)``, log-ratio clamped to +-20), ``mask`` is not read; nothing is clipped."""
    import torch

    from dapo_exp.objective import LOG_RATIO_GUARD, SurrogateOut, _token_advantages

    adv = _token_advantages(advantages, logp)
    ratio = torch.exp((logp - old_logp).clamp(-LOG_RATIO_GUARD, LOG_RATIO_GUARD))
    none = torch.zeros_like(logp, dtype=torch.bool)
    return SurrogateOut(-adv * logp, ratio, none, none, none)


def _bind(algo: Any, run: RunInfo) -> dict[str, Any]:
    return {"surrogate": surrogate}


FIX = register_fix(Fix(
    name="gpg", short="gpg", title="GPG (policy gradient loss)", paper="GPG (arXiv 2504.02546) §3, verl loss_mode=gpg",
    schema=(
        Key("gpg", bool, False, "GPG's loss: the plain policy gradient -A logp, no ratio, no clip (Chu et al. 2025)"),
    ), is_on=lambda a: bool(a.gpg), slots=("surrogate",), bind=_bind,
    excludes=("clip_higher",),
    why_excluded=(("clip_higher", "GPG's loss has no ratio clip for Clip-Higher's range to widen"),),
    metrics=("actor/ppo_ratio_mean",),
    verl={"gpg": Rule(f"`{A}policy_loss.loss_mode=gpg`", verl_surrogate("gpg"))},
))
