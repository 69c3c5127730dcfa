"""GRPO itself: the baseline pieces that every switch transforms or replaces.

Not a switch (no config group turns GRPO off): the pieces a run uses where no fix that is on fills
the slot, bound from ``algo`` by :mod:`dapo_exp.compose`. A fix changes GRPO in one of two ways: it sets one of
GRPO's explicit values (the std division, the clip range, the dual clip, the KL penalty) or it fills a slot:

- the estimator: group-relative, ``(R_i - mean) / (std + eps)`` (DAPO Eq. 9, :func:`advantage`), without the
  std division when ``algo.adv_norm_std=false`` (Dr. GRPO's ``dr_grpo_adv``: a value of GRPO's, as Clip-Higher's
  range is); an estimator fix (RLOO, REINFORCE++, ...) replaces it; advantage fixes transform it, in registry
  order;
- the per-token surrogate: PPO's clipped one over ``[1 - eps_low, 1 + eps_high]`` with the optional
  dual clip (:func:`surrogate`; Clip-Higher is the same surrogate with ``eps_high > eps_low``);
- the normaliser: the sample-level ``seq-mean-token-mean`` (:data:`MODE`; :func:`normaliser` binds any
  mode, the token-level loss's and Dr. GRPO's constant one included);
- the KL penalty against a frozen reference when ``algo.kl_coef > 0`` (off in DAPO).

GRPO's explicit values are its own keys (:data:`SCHEMA`: the advantage's std division and epsilon, the clip range,
the dual clip, the KL penalty), declared, checked (:func:`check`) and translated to verl (:data:`VERL`) here alone;
the fixes that set them (Clip-Higher's range, Dr. GRPO's advantage) declare no key and fill no slot. Like every
fix module it imports the objective (lazily), the fix contract (:mod:`dapo_exp.fixes.base`), verl's rule
helpers (:mod:`dapo_exp.fixes.verl_rules`) and the schema's error, nothing of the trainer.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from dapo_exp.errors import ConfigError
from dapo_exp.fixes.base import FIXES, Key, RunInfo, check_range
from dapo_exp.fixes.verl_rules import A, Context, Rule, fail, on, to

MODE = "seq-mean-token-mean"  # GRPO's loss aggregation: the mean over responses of each one's token mean

# GRPO's own algo keys, first in the schema's algo section (dapo_exp.config assembles it: these, then each fix's)
SCHEMA: tuple[Key, ...] = (
    Key("adv_norm_std", bool, True,
        'divide group-centred rewards by the group std (GRPO, DAPO: true; Dr. GRPO: false, switch `dr_grpo_adv`)'),
    Key("adv_eps", float, 1e-6, "added to the std in the advantage's denominator"),
    Key("eps_low", float, 0.2, 'lower clip range: ratio >= 1 - eps_low for A < 0 (paper: 0.2)'),
    Key("eps_high", float, 0.2, 'upper clip range: ratio <= 1 + eps_high for A > 0 (paper: 0.28; GRPO: 0.2); above eps_low: switch '
        '`clip_higher`'),
    Key("dual_clip", float | None, None, "dual-clip bound c > 1 on the loss of A < 0 tokens, null = off "
        "(released script: 10)"),
    Key("kl_coef", float, 0.0, "KL penalty coefficient against the initial policy, 0 = off (DAPO: removed)"),
    Key("kl_estimator", str, "k3", "KL estimator: k1 | k2 | k3"),
)
# verl always applies its dual clip (clip_ratio_c > 1 is asserted). With c above exp(20), the bound of
# its clamped log-ratio, the bound -c A never binds: algo.dual_clip=null is exactly this.
NO_DUAL_CLIP = 1e10
OWN_CAP = ("dppo_tv", "dppo_kl")  # surrogates whose truncation cap is verl's clip_ratio_c (they refuse a dual clip)
OWN_RANGE = ("gspo", "cispo", "gmpo", "dppo_tv", "dppo_kl")  # surrogate fixes whose range is their own (verl's clip_ratio_*)
VERL_ADV_EPS = 1e-6  # compute_grpo_outcome_advantage's epsilon; V1 never passes another one


def group_relative(rewards: Any, *, lengths: Any = None, parts: Any = None, norm_std: bool = True,
                   eps: float = VERL_ADV_EPS) -> Any:
    """GRPO's estimator hook (the ``estimator`` slot's signature): ``(R_i - mean) / (std + eps)`` of each group of
    ``rewards (N, G)``, or ``R_i - mean`` without ``norm_std``; ``lengths`` and ``parts`` are not read."""
    from dapo_exp import objective

    return objective.group_advantages(rewards, norm_std=norm_std, eps=eps)


def advantage(algo: Any) -> Callable:
    """GRPO's estimator bound to ``algo``: group-relative advantages, divided by the group's std (DAPO Eq. 9)
    unless ``algo.adv_norm_std`` is false (Dr. GRPO Eq. 3: ``R_i - mean``, as verl's
    ``norm_adv_by_std_in_grpo=false``)."""
    return functools.partial(group_relative, norm_std=algo.adv_norm_std, eps=algo.adv_eps)


def surrogate(algo: Any) -> Callable:
    """PPO's clipped surrogate with the range ``[1 - eps_low, 1 + eps_high]`` and the dual clip of ``algo``."""
    from dapo_exp import objective

    return functools.partial(objective.clipped_surrogate, eps_low=algo.eps_low, eps_high=algo.eps_high,
                             dual_clip=algo.dual_clip)


def normaliser(mode: str, run: RunInfo) -> Callable:
    """``(mask (B, T), group_index (B,)) -> (B,)`` weights of ``mode``; ``L_max`` is the generation cap."""
    from dapo_exp import objective

    return functools.partial(_weights, objective.loss_normaliser, mode, run.max_response_len)


def _weights(fn: Callable, mode: str, max_len: int, mask: Any, group_index: Any) -> Any:
    return fn(mask, mode, group_index, max_len=max_len)


def check(algo: Any, run: RunInfo) -> None:
    """GRPO's values: the advantage's epsilon, the clip range and dual clip every surrogate of the PPO form
    reads, the KL penalty's coefficient and estimator."""
    from dapo_exp.objective import KL_ESTIMATORS

    check_range(algo, ("adv_eps", ">= 0", lambda v: v >= 0),
                ("eps_low", ">= 0", lambda v: v >= 0), ("eps_high", ">= 0", lambda v: v >= 0),
                ("eps_low", "< 1 (ratio lower bound 1 - eps_low > 0)", lambda v: v < 1),
                ("dual_clip", "> 1 or null", lambda v: v is None or v > 1),
                ("kl_coef", ">= 0", lambda v: v >= 0))
    if algo.kl_estimator not in KL_ESTIMATORS:
        raise ConfigError(f"algo.kl_estimator={algo.kl_estimator!r} is not valid; choose one of: "
                          f"{', '.join(KL_ESTIMATORS)}")


# --------------------------------------------------------------------------- #
# verl (dapo_exp.backends.verl applies these with the fixes' own)               #
# --------------------------------------------------------------------------- #
def _filling(ctx: Context, slot: str) -> bool:
    """Is a fix that fills ``slot`` on? (Then its own rule sets verl's mode, not GRPO's default.)"""
    return on(ctx, *[f.name for f in FIXES.values() if slot in f.slots])


def _adv_eps(v: float, ctx: Context) -> dict[str, Any]:
    """GRPO's estimator is verl's grpo (epsilon hard-coded to 1e-6), unless an estimator fix sets its own."""
    if v != VERL_ADV_EPS:
        fail("algo.adv_eps", v, "verl's advantage estimators hard-code epsilon=1e-6")
    return {} if _filling(ctx, "estimator") else {"algorithm.adv_estimator": "grpo"}


def _dual_clip(v: float | None, ctx: Context) -> dict[str, Any]:
    """GRPO's surrogate is verl's vanilla loss (unless a surrogate fix sets its own loss_mode), its dual clip
    verl's clip_ratio_c (unless a DPPO switch is on: clip_ratio_c is its truncation cap, set by its rule)."""
    if on(ctx, *OWN_CAP):
        return {}
    out = {A + "clip_ratio_c": NO_DUAL_CLIP if v is None else v}
    return out if _filling(ctx, "surrogate") else {**out, A + "policy_loss.loss_mode": "vanilla"}


def _ppo_range(key: str) -> Callable:
    """eps_low / eps_high: verl's clip range, unless a surrogate with a range of its own sets it."""
    return lambda v, ctx: {} if on(ctx, *OWN_RANGE) else {A + key: v}


def _kl(v: float, ctx: Context) -> dict[str, Any]:
    return {A + "use_kl_loss": v > 0, A + "kl_loss_coef": v, "algorithm.use_kl_in_reward": False}


VERL: dict[str, Rule] = {
    "adv_norm_std": to("algorithm.norm_adv_by_std_in_grpo"),
    "eps_low": Rule(f"`{A}clip_ratio_low` (GSPO, CISPO, GMPO, DPPO set their own)", _ppo_range("clip_ratio_low")),
    "eps_high": Rule(f"`{A}clip_ratio_high` (GSPO, CISPO, GMPO, DPPO set their own)", _ppo_range("clip_ratio_high")),
    "adv_eps": Rule("`algorithm.adv_estimator=grpo` unless an estimator fix sets its own (only 1e-6: verl's "
                    "estimators hard-code epsilon=1e-6)", _adv_eps),
    "dual_clip": Rule(f"`{A}clip_ratio_c` (null: {NO_DUAL_CLIP:g}, which never binds; DPPO's cap where a DPPO switch "
                      f"is on); `{A}policy_loss.loss_mode=vanilla` unless a surrogate fix sets its own", _dual_clip),
    "kl_coef": Rule(f"`{A}use_kl_loss` (coef > 0), `{A}kl_loss_coef`; `algorithm.use_kl_in_reward=false`", _kl),
    "kl_estimator": Rule(f"`{A}kl_loss_type` (k1, k2, k3: the same names) when kl_coef > 0",
                         lambda v, ctx: {A + "kl_loss_type": v} if ctx.cfg.algo.kl_coef > 0 else {}),
}
