"""The composition layer: the run's config bound once into the plain callables the steps take.

:func:`compose` reads ``algo`` (and the few run values a fix binds, :class:`RunInfo`),
checks every fix's values and the combination of the fixes that are on, and returns
:class:`Hooks`: each slot of :data:`dapo_exp.fixes.SLOTS` filled by the fixes that are on,
or by GRPO's own piece where none is. Below this layer (``steps``, ``rollout``,
``objective``) nothing sees a config object.

GRPO's own pieces, chosen by name:

- :data:`ADVANTAGE_ESTIMATORS` (``algo.adv_estimator``): ``fn(algo) -> (rewards (N, G) -> (N, G))``;
  ``grpo`` is :func:`dapo_exp.objective.group_advantages` (DAPO Eq. 9; Dr. GRPO's advantage is
  the fix ``dr_grpo_adv``, an ``advantage`` transform).
- :data:`POLICY_LOSSES` (``algo.policy_loss``): ``fn(algo) -> surrogate``, the surrogate when no
  fix fills the slot; ``clipped`` is PPO's clipped surrogate (:func:`dapo_exp.fixes.clip_higher.ppo_clip`).
- The normaliser when no fix fills the slot: GRPO's ``seq-mean-token-mean``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dapo_exp import fixes, objective
from dapo_exp.config import ConfigError
from dapo_exp.fixes import clip_higher, token_level_loss
from dapo_exp.fixes.base import GroupFilter, RunInfo
from dapo_exp.registry import Registry

ADVANTAGE_ESTIMATORS: Registry[Callable[[Any], Callable]] = Registry("advantage estimator", "algo.adv_estimator")
POLICY_LOSSES: Registry[Callable[[Any], Callable]] = Registry("policy loss", "algo.policy_loss")


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo_advantages(algo: Any) -> Callable:
    """Group-relative advantages (DAPO Eq. 9); Dr. GRPO's (no std) is a fix (``dr_grpo_adv``)."""
    return functools.partial(objective.group_advantages, norm_std=True, eps=algo.adv_eps)


POLICY_LOSSES.register("clipped", clip_higher.ppo_clip)


@dataclass(frozen=True)
class Hooks:
    """The slots of one run, bound: what the loop hands to the steps."""

    reward_terms: dict[str, Callable]  # fix name -> (*, lengths, correct) -> (B,), the fixes on
    reward_metrics: dict[str, str]  # fix name -> its metric, every registered reward fix (0 when off)
    advantage: Callable  # rewards (N, G) -> advantages (N, G)
    group_filter: GroupFilter | None  # None: every group is kept
    token_mask: Callable | None  # (mask (B, T), truncated (B,)) -> (B, T); None: every response token
    surrogate: Callable  # (logp, old_logp, advantages, *, mask) -> objective.SurrogateOut
    normaliser: Callable  # (mask (B, T), group_index (B,)) -> (B,)
    metrics: dict[str, tuple[str, ...]]  # fix name -> the metrics it declares, the fixes on
    update_mask: Callable | None = None  # (entropy (B, T), mask (B, T)) -> (B, T) bool; None: every token
    rollout_weight: Callable | None = None  # (old_logp, engine_logp, mask) -> (B, T) x advantages; None: 1


def run_info(cfg: Any) -> RunInfo:
    return RunInfo(max_response_len=cfg.rollout.max_response_len, group_size=cfg.rollout.n, seed=cfg.seed)


def check(algo: Any, run: RunInfo) -> None:
    """Every fix's own checks (on or off: its values must be valid), extension keys, the combination."""
    for fix in fixes.FIXES.values():
        if fix.check is not None:
            fix.check(algo, run)
    declared = fixes.declared_ext_keys()
    unknown = sorted(set(algo.ext) - declared)
    if unknown:
        raise ConfigError(f"algo.ext.{unknown[0]} is read by no registered fix (declared extension keys: "
                          f"{', '.join(sorted(declared)) or 'none'}); register the fix first (dapo_exp.fixes)")
    ADVANTAGE_ESTIMATORS.pick(algo.adv_estimator)
    POLICY_LOSSES.pick(algo.policy_loss)
    fixes.check_combination(algo)


def compose(algo: Any, run: RunInfo) -> Hooks:
    """Check, then bind the hooks of the fixes that are on (GRPO's pieces in the slots none fills)."""
    check(algo, run)
    bound: dict[str, list[tuple[str, Any]]] = {slot: [] for slot in fixes.SLOTS}
    for fix in fixes.active(algo):
        hooks = fix.bind(algo, run)
        if set(hooks) != set(fix.slots):
            raise ValueError(f"fix {fix.name!r} declares slots {sorted(fix.slots)} but bound {sorted(hooks)}")
        for slot, hook in hooks.items():
            bound[slot].append((fix.name, hook))
    estimator = ADVANTAGE_ESTIMATORS.pick(algo.adv_estimator)(algo)
    return Hooks(
        reward_terms=dict(bound["reward"]),
        reward_metrics={f.name: f.metrics[0] for f in fixes.FIXES.values() if "reward" in f.slots},
        advantage=_chain_advantages(estimator, [h for _, h in bound["advantage"]]),
        group_filter=_one(bound["group_filter"], None),
        token_mask=_chain_masks([h for _, h in bound["token_mask"]]),
        surrogate=_one(bound["surrogate"], POLICY_LOSSES.pick(algo.policy_loss)(algo)),
        normaliser=_one(bound["normaliser"], token_level_loss.normaliser(token_level_loss.GRPO_MODE, run)),
        metrics={f.name: f.metrics for f in fixes.active(algo)},
        update_mask=_and_masks([h for _, h in bound["update_mask"]]),
        rollout_weight=_one(bound["rollout_weight"], None),
    )


def _one(hooks: list[tuple[str, Any]], default: Any) -> Any:
    return hooks[0][1] if hooks else default  # exclusive slots hold one (check_combination)


def _chain_advantages(estimator: Callable, transforms: list[Callable]) -> Callable:
    if not transforms:
        return estimator

    def advantage(rewards: Any) -> Any:
        adv = estimator(rewards)
        for t in transforms:
            adv = t(adv, rewards)
        return adv

    return advantage


def _chain_masks(masks: list[Callable]) -> Callable | None:
    if not masks:
        return None

    def token_mask(mask: Any, truncated: Any) -> Any:
        for m in masks:
            mask = m(mask, truncated)
        return mask

    return token_mask


def _and_masks(masks: list[Callable]) -> Callable | None:
    if len(masks) <= 1:
        return masks[0] if masks else None

    def update_mask(entropy: Any, mask: Any) -> Any:
        keep = mask.bool()
        for m in masks:
            keep = keep & m(entropy, mask).bool()
        return keep

    return update_mask


def check_logged(hooks: Hooks, row: dict[str, Any]) -> None:
    """Refuse a trained step's metrics ``row`` that lacks a metric a fix that is on declares."""
    missing = [f"{m} (fix {name})" for name, ms in hooks.metrics.items() for m in ms if m not in row]
    if missing:
        raise RuntimeError(f"metrics declared by a fix that is on were not logged: {', '.join(missing)}")
