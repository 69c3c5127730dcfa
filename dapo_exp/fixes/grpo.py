"""GRPO itself: the baseline pieces that every switch transforms or replaces.

Not a switch (no config group turns GRPO off): the pieces a run uses where no fix that is on fills
the slot, bound from ``algo`` by :mod:`dapo_exp.compose`:

- the advantage: group-relative, ``(R_i - mean) / (std + eps)`` (DAPO Eq. 9, :func:`advantage`), without the
  std division when ``algo.adv_norm_std=false`` (Dr. GRPO's ``dr_grpo_adv``: a value of GRPO's, as Clip-Higher's
  range is); advantage fixes transform it, in registry order;
- the per-token surrogate: PPO's clipped one over ``[1 - eps_low, 1 + eps_high]`` with the optional
  dual clip (:func:`surrogate`; Clip-Higher is the same surrogate with ``eps_high > eps_low``);
- the normaliser: the sample-level ``seq-mean-token-mean`` (:data:`MODE`; :func:`normaliser` binds any
  mode, the token-level loss's and Dr. GRPO's constant one included);
- the KL penalty against a frozen reference when ``algo.kl_coef > 0`` (off in DAPO).

GRPO's own checks (:func:`check`) and verl rules (:data:`VERL`) live here, as a fix's live in its module. Like
every fix module it reaches only the objective and the schema's error.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from dapo_exp.errors import ConfigError
from dapo_exp.fixes.base import FIXES, Key, RunInfo, check_range
from dapo_exp.fixes.verl_rules import A, Context, Rule, fail, on, only

MODE = "seq-mean-token-mean"  # GRPO's loss aggregation: the mean over responses of each one's token mean

# GRPO's own algo keys, first in the schema's algo section (dapo_exp.config assembles it: these, then each fix's)
SCHEMA: tuple[Key, ...] = (
    Key("adv_estimator", str, "grpo", "advantage estimator, a name in dapo_exp.compose.ADVANTAGE_ESTIMATORS "
        "(grpo: DAPO Eq. 9)"),
    Key("adv_eps", float, 1e-6, "added to the std in the advantage's denominator"),
    Key("policy_loss", str, "clipped", "GRPO's per-token surrogate when no fix fills the slot, a name in "
        "dapo_exp.compose.POLICY_LOSSES (clipped: PPO's clipped surrogate, Eq. 10)"),
    Key("dual_clip", float | None, None, "dual-clip bound c > 1 on the loss of A < 0 tokens, null = off "
        "(released script: 10)"),
    Key("kl_coef", float, 0.0, "KL penalty coefficient against the initial policy, 0 = off (DAPO: removed)"),
    Key("kl_estimator", str, "k3", "KL estimator: k1 | k2 | k3"),
)
# verl always applies its dual clip (clip_ratio_c > 1 is asserted). With c above exp(20), the bound of
# its clamped log-ratio, the bound -c A never binds: algo.dual_clip=null is exactly this.
NO_DUAL_CLIP = 1e10
VERL_ADV_EPS = 1e-6  # compute_grpo_outcome_advantage's epsilon; V1 never passes another one


def advantage(algo: Any) -> Callable:
    """``rewards (N, G) -> (N, G)``: group-relative advantages, divided by the group's std (DAPO Eq. 9) unless
    ``algo.adv_norm_std`` is false (Dr. GRPO Eq. 3: ``R_i - mean``, as verl's ``norm_adv_by_std_in_grpo=false``)."""
    from dapo_exp import objective

    return functools.partial(objective.group_advantages, norm_std=algo.adv_norm_std, eps=algo.adv_eps)


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
def _default_surrogate(v: str, ctx: Context) -> dict[str, Any]:
    """GRPO's own surrogate (``algo.policy_loss``): verl's vanilla loss, unless a surrogate fix sets its own."""
    if v != "clipped":
        fail("algo.policy_loss", v, "our clipped surrogate is verl's vanilla loss")
    surrogates = [f.name for f in FIXES.values() if "surrogate" in f.slots]
    return {} if on(ctx, *surrogates) else {A + "policy_loss.loss_mode": "vanilla"}


def _kl(v: float, ctx: Context) -> dict[str, Any]:
    return {A + "use_kl_loss": v > 0, A + "kl_loss_coef": v, "algorithm.use_kl_in_reward": False}


VERL: dict[str, Rule] = {
    "adv_estimator": only("algo.adv_estimator", "grpo", "verl runs our registry's grpo as its own grpo",
                          {"algorithm.adv_estimator": "grpo"}),
    "adv_eps": only("algo.adv_eps", VERL_ADV_EPS, "verl's GRPO advantage hard-codes epsilon=1e-6"),
    "policy_loss": Rule(f"`{A}policy_loss.loss_mode=vanilla` (only `clipped`; a surrogate fix sets its own "
                        "loss_mode)", _default_surrogate),
    "dual_clip": Rule(f"`{A}clip_ratio_c` (null: {NO_DUAL_CLIP:g}, which never binds)",
                      lambda v, ctx: {A + "clip_ratio_c": NO_DUAL_CLIP if v is None else v}),
    "kl_coef": Rule(f"`{A}use_kl_loss` (coef > 0), `{A}kl_loss_coef`; `algorithm.use_kl_in_reward=false`", _kl),
    "kl_estimator": Rule(f"`{A}kl_loss_type` (k1, k2, k3: the same names) when kl_coef > 0",
                         lambda v, ctx: {A + "kl_loss_type": v} if ctx.cfg.algo.kl_coef > 0 else {}),
}
