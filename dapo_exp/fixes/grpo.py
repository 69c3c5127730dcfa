"""GRPO itself: the baseline pieces that every switch transforms or replaces.

Not a switch (no config group turns GRPO off): the pieces a run uses where no fix that is on fills
the slot, bound from ``algo`` by :mod:`dapo_exp.compose`:

- the advantage: group-relative, ``(R_i - mean) / (std + eps)`` (DAPO Eq. 9, :func:`advantage`);
  advantage fixes transform it, in registry order (Dr. GRPO's ``dr_grpo_adv`` multiplies the std back);
- the per-token surrogate: PPO's clipped one over ``[1 - eps_low, 1 + eps_high]`` with the optional
  dual clip (:func:`surrogate`; Clip-Higher is the same surrogate with ``eps_high > eps_low``);
- the normaliser: the sample-level ``seq-mean-token-mean`` (:data:`MODE`; :func:`normaliser` binds any
  mode, the token-level loss's and Dr. GRPO's constant one included);
- the KL penalty against a frozen reference when ``algo.kl_coef > 0`` (off in DAPO).

Like every fix module it reaches only the objective and the schema's error.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from dapo_exp.errors import ConfigError
from dapo_exp.fixes.base import Key, RunInfo, check_range

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
    Key("tis_cap", float | None, None, "null: truncated importance sampling is rollout correction's token level "
        "(rollout_correction=enabled algo.rc_level=token algo.rc_cap=C); a value is refused, naming that"),
)


def advantage(algo: Any) -> Callable:
    """``rewards (N, G) -> (N, G)``: group-relative advantages with the std (DAPO Eq. 9)."""
    from dapo_exp import objective

    return functools.partial(objective.group_advantages, norm_std=True, eps=algo.adv_eps)


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
    """The clip range and dual clip every surrogate of the PPO form reads; ``algo.tis_cap`` refused (one behaviour,
    one label: the token-level weight is the ``rollout_correction`` switch's)."""
    if algo.tis_cap is not None:
        c = algo.tis_cap
        raise ConfigError(f"algo.tis_cap={c} is rollout correction's token-level weight: use rollout_correction=enabled "
                          f"algo.rc_level=token algo.rc_cap={c} (one behaviour, one label in the run's switches and "
                          "the table)")
    check_range(algo, ("eps_low", ">= 0", lambda v: v >= 0), ("eps_high", ">= 0", lambda v: v >= 0),
                ("eps_low", "< 1 (ratio lower bound 1 - eps_low > 0)", lambda v: v < 1),
                ("dual_clip", "> 1 or null", lambda v: v is None or v > 1))
