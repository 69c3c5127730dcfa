"""The algorithm's pluggable parts, chosen by name from the config.

Each entry adapts config values to the pure functions of :mod:`dapo_exp.objective`
(which never see a config): the composition layer picks an entry by its config key,
the entry reads its values from ``algo`` and calls the function with plain keyword
arguments. Adding an advantage estimator or a policy loss is one function plus one
``register`` line (here or in your own code) plus its config value; a reward
shaping term is switched on by its fix (:mod:`dapo_exp.fixes`).

- :data:`ADVANTAGE_ESTIMATORS` (``algo.adv_estimator``): ``fn(rewards (N, G), *, algo) -> (N, G)``.
- :data:`POLICY_LOSSES` (``algo.policy_loss``): ``fn(*, algo) -> surrogate`` where
  ``surrogate(logp, old_logp, advantages) -> objective.SurrogateOut`` (per-token loss and clip flags).
- :data:`REWARD_SHAPING`: :class:`ShapingTerm` entries; every term whose ``enabled(algo)``
  holds is added to the task's correctness reward (its mean is logged under ``metric``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from torch import Tensor

from dapo_exp import objective
from dapo_exp.registry import Registry

ADVANTAGE_ESTIMATORS: Registry[Callable[..., Tensor]] = Registry("advantage estimator", "algo.adv_estimator")
POLICY_LOSSES: Registry[Callable[..., Callable]] = Registry("policy loss", "algo.policy_loss")


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo_advantages(rewards: Tensor, *, algo: Any) -> Tensor:
    """Group-relative advantages (DAPO Eq. 9); ``algo.adv_norm_std=false`` gives Dr.GRPO's."""
    return objective.group_advantages(rewards, norm_std=algo.adv_norm_std, eps=algo.adv_eps)


@POLICY_LOSSES.register("clipped")
def clipped_loss(*, algo: Any) -> Callable[[Tensor, Tensor, Tensor], objective.SurrogateOut]:
    """PPO's clipped surrogate with decoupled bounds (Clip-Higher) and optional dual clip."""
    return functools.partial(
        objective.clipped_surrogate, eps_low=algo.eps_low, eps_high=algo.eps_high, dual_clip=algo.dual_clip
    )


@dataclass(frozen=True)
class ShapingTerm:
    """A reward term added to the task's correctness reward."""

    metric: str  # metric of the term's batch mean (logged every step, 0 when off)
    enabled: Callable[[Any], bool]  # algo -> is the term on?
    # (*, lengths (B,) float, correct (B,) bool, max_len: int, algo) -> (B,) float
    compute: Callable[..., Tensor]


REWARD_SHAPING: Registry[ShapingTerm] = Registry("reward shaping term")


def _overlong(*, lengths: Tensor, correct: Tensor, max_len: int, algo: Any) -> Tensor:
    del correct  # the paper's term depends on the length alone
    return objective.overlong_punishment(
        lengths,
        max_len=algo.overlong_max_len if algo.overlong_max_len is not None else max_len,
        cache_len=algo.overlong_cache_len,
        factor=algo.overlong_factor,
        mode=algo.overlong_punishment,
    )


REWARD_SHAPING.register("overlong", ShapingTerm(
    metric="reward/overlong_penalty_mean", enabled=lambda a: a.overlong_punishment != "none", compute=_overlong,
))


def active_shaping(algo: Any) -> dict[str, ShapingTerm]:
    """The shaping terms that are on for ``algo``."""
    return {name: term for name, term in REWARD_SHAPING.items() if term.enabled(algo)}
