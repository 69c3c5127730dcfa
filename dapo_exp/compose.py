"""The composition layer: the run's fixes bound once into one plan that the steps call.

:func:`compose` reads ``algo`` (and the few run values a fix binds, :class:`RunInfo`), checks
GRPO's values, every fix's values and the combination of the fixes that are on, and returns a
:class:`Plan`: one method per point of the training step where a fix acts (:meth:`Plan.advantage`: the
estimator, then the advantage transforms; :meth:`Plan.token_mask`; :meth:`Plan.weights`: the normaliser;
:meth:`Plan.keep`: the update masks; :meth:`Plan.token_weight`: the rollout weight; :meth:`Plan.token_losses`:
the surrogate; :meth:`Plan.loss`: the surrogate, GRPO's KL term and the loss terms), each with GRPO's own piece
(:mod:`dapo_exp.fixes.grpo`) where no fix that is on fills the slot. The rollout step's two slots are plan
methods too: the reward terms (:meth:`Plan.reward`, which :func:`dapo_exp.rollout.groups.score_groups` calls
and adds to the correctness reward) and the group filter (:meth:`Plan.keep_groups` with its refill policy
:attr:`Plan.refill`, which :func:`dapo_exp.rollout.dynamic_sampling.collect_groups` calls); when an estimator
fix asks for a greedy baseline (:attr:`Plan.greedy_baseline`, ReMax) the rollout also decodes and scores one greedy
response per prompt, and :meth:`Plan.advantage` hands its reward to the estimator. Every hook may
return ``Out(value, metrics)``, and every method that calls hooks returns one, but :meth:`Plan.loss`, which
returns the micro-batch's loss and its statistics (the surrogate's and the loss terms' metrics among them, as
``FIX_METRIC + name``): the hooks' metrics reach the step's row. :meth:`Plan.reward_logged` returns the reward
terms' means to log, :meth:`Plan.check_logged` nothing (it raises when a declared metric is missing).
Below this layer (``steps``, ``rollout``, ``objective``) nothing sees a config object.

Adding a slot is five edits (docs: how-to/extend.md): its declaration in :data:`dapo_exp.fixes.SLOTS`; its
field and method of :class:`Plan` here; its keyword in the ``Plan(...)`` call that ends :func:`compose`
(``one(slot, default)`` for an exclusive slot, ``chain(slot)`` or ``named(slot)`` for a combined one:
:func:`compose` collects the hooks of every slot and refuses, before any compute, a slot of ``SLOTS`` that call
does not pass on); the one call site of the method (in
:mod:`dapo_exp.steps` for a point of the update, in the rollout for one of the rollout); and a fix of the slot
in ``tests/test_extension.py`` (``EXTENSIONS`` and ``VALUES``: its test wants one fix per slot).

GRPO's own pieces (:mod:`dapo_exp.fixes.grpo`) fill the slots that no fix that is on fills: the estimator
(group-relative, DAPO Eq. 9), the surrogate (PPO's clipped one) and the normaliser (``seq-mean-token-mean``).
A fix changes GRPO one way only: it sets GRPO's explicit values (``algo.adv_norm_std``, ``algo.eps_low/high``,
``algo.dual_clip``, the KL's) or it fills a slot.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dapo_exp import fixes, objective
from dapo_exp.config import ConfigError
from dapo_exp.fixes import grpo
from dapo_exp.fixes.base import GroupFilter, Out, RunInfo, unpack

FIX_METRIC = "fix:"  # prefix of a fix's own metric in the update's sums (a surrogate's or a loss term's; dapo_exp.steps)


@dataclass(frozen=True)
class Plan:
    """One run's pipeline: GRPO's pieces and the hooks of the fixes that are on, behind one method per point.

    Fields hold what :func:`compose` bound (tests build a plan directly); the steps call the methods.
    """

    surrogate: Callable  # (logp, old_logp, advantages, *, mask) -> objective.SurrogateOut, one slot's
    normaliser: Callable  # (mask (B, T), group_index (B,)) -> (B,) weights of a mini-batch
    estimator: Callable = grpo.group_relative  # (rewards (N, G), *, lengths, parts) -> advantages (N, G) | Out
    advantage_transforms: tuple[Callable, ...] = ()  # (advantages, rewards) -> (N, G) | Out, in registry order
    reward_terms: Mapping[str, Callable] = field(default_factory=dict)  # fix -> (*, lengths, correct, texts) -> (B,)
    reward_metrics: Mapping[str, str] = field(default_factory=dict)  # every registered reward fix -> its metric
    group_filter: GroupFilter | None = None  # None: every group is kept
    token_masks: tuple[Callable, ...] = ()  # (mask, truncated) -> (B, T) | Out, chained
    update_masks: tuple[Callable, ...] = ()  # (entropy, mask) -> (B, T) bool, and-ed
    rollout_weight: Callable | None = None  # (old_logp, engine_logp, mask) -> (B, T), the slot's
    loss_terms: Mapping[str, Callable] = field(default_factory=dict)  # fix -> (*, logp, ...) -> scalar | Out
    kl_coef: float = 0.0  # GRPO's KL penalty against the reference (0: off)
    kl_estimator: str = "k3"
    declared: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # fix on -> the metrics it declares
    greedy_baseline: bool = False  # the estimator reads the reward of a greedy response per prompt (ReMax)

    def reward(self, *, lengths: Any, correct: Any, texts: list[str]) -> Out:
        """Each reward term's ``(B,)`` values, ``{fix name: values}`` (added to the correctness reward by the
        rollout), from the responses' ``lengths`` (B,), ``correct`` (B,) bool and decoded ``texts``; and the
        terms' own metrics."""
        values, metrics = {}, {}
        for name, term in self.reward_terms.items():
            values[name], m = unpack(term(lengths=lengths, correct=correct, texts=texts))
            metrics.update(m)
        return Out(values, metrics)

    def reward_logged(self, shaping: list[Mapping[str, list[float]]]) -> dict[str, float]:
        """Each registered reward fix's metric over the trained groups' ``shaping`` (each group's
        ``{fix name: its G values}``): the term's mean, 0 for a term that is off (so arms compare)."""
        import numpy as np

        return {metric: float(np.mean([v for g in shaping for v in g[name]])) if shaping and name in shaping[0]
                else 0.0 for name, metric in self.reward_metrics.items()}

    @property
    def refill(self) -> GroupFilter | None:
        """The group filter's refill policy (rounds, cap, surplus, over-sampling), or None: no filter, one
        round, every group kept."""
        return self.group_filter

    def keep_groups(self, correct: Any, reward: Any) -> Out:
        """``(N,)`` bool: of a round's groups (``correct``, ``reward``: ``(N, G)`` float) those the batch
        keeps (every one without a filter); and the filter's metrics."""
        if self.group_filter is None:
            return Out(correct.new_ones(correct.shape[0], dtype=bool), {})
        keep, metrics = unpack(self.group_filter.keep(correct, reward))
        return Out(keep, metrics)

    def advantage(self, rewards: Any, *, lengths: Any = None, parts: Mapping[str, Any] | None = None,
                  baseline: Any = None) -> Out:
        """``(N, G)`` advantages of the groups' ``rewards`` (``lengths``: the responses' token counts, ``(N, G)``;
        ``parts``: the reward's components, default ``{"accuracy": rewards}``; ``baseline``: ``(N,)`` rewards of the
        prompts' greedy responses, passed to the estimator when :attr:`greedy_baseline`, required then): the
        estimator (GRPO's where no fix fills the slot), then each fix's transform; and their metrics."""
        if lengths is None:
            lengths = rewards.new_ones(rewards.shape)
        extra = {}
        if self.greedy_baseline:
            if baseline is None:
                raise ValueError("the estimator reads a greedy baseline (ReMax) but none was passed: the rollout "
                                 "must decode one greedy response per prompt (Group.baseline)")
            extra["baseline"] = baseline
        adv, metrics = unpack(self.estimator(rewards, lengths=lengths, parts=dict(parts or {"accuracy": rewards}),
                                             **extra))
        for transform in self.advantage_transforms:
            adv, m = unpack(transform(adv, rewards))
            metrics.update(m)
        return Out(adv, metrics)

    def token_mask(self, mask: Any, truncated: Any) -> Out:
        """``(B, T)`` tokens that count in the loss (``mask`` itself when no fix masks); and their metrics."""
        metrics: dict[str, Any] = {}
        for hook in self.token_masks:
            mask, m = unpack(hook(mask, truncated))
            metrics.update(m)
        return Out(mask, metrics)

    def weights(self, mask: Any, group_index: Any) -> Out:
        """``(B,)`` loss weights of a mini-batch (the normaliser); and its metrics."""
        return Out(*unpack(self.normaliser(mask, group_index)))

    @property
    def masks_updates(self) -> bool:
        return bool(self.update_masks)

    def keep(self, entropy: Any, mask: Any) -> Out:
        """``(B, T)`` bool: of ``mask``'s tokens those whose policy-gradient term counts (every update mask's);
        and their metrics."""
        keep, metrics = mask.bool(), {}
        for hook in self.update_masks:
            mine, m = unpack(hook(entropy, mask))
            keep = keep & mine.bool()
            metrics.update(m)
        return Out(keep, metrics)

    @property
    def weighs_tokens(self) -> bool:
        return self.rollout_weight is not None

    def token_weight(self, old_logp: Any, engine_logp: Any, mask: Any) -> Out:
        """``(B, T)`` detached weights multiplied into the per-token advantages (the rollout weight); and its
        metrics."""
        return Out(*unpack(self.rollout_weight(old_logp, engine_logp, mask)))

    @property
    def needs_entropy(self) -> bool:
        """Does the loss read the policy's per-token entropy (with its gradient)?"""
        return bool(self.loss_terms)

    def token_losses(self, logp: Any, old_logp: Any, advantages: Any, *, mask: Any) -> Out:
        """The surrogate slot: ``(B, T)`` per-token losses and clip flags (:class:`dapo_exp.objective.SurrogateOut`,
        GRPO's clipped surrogate where no fix fills the slot); and the surrogate's own metrics."""
        return Out(*unpack(self.surrogate(logp, old_logp, advantages, mask=mask)))

    def loss(self, *, logp: Any, old_logp: Any, entropy: Any, advantages: Any, mask: Any, weights: Any,
             ref_logp: Any = None, keep: Any = None) -> tuple[Any, dict[str, Any]]:
        """A micro-batch's share of the mini-batch loss and its statistics: the surrogate's policy-gradient
        term and GRPO's KL term (:func:`dapo_exp.objective.policy_loss`) plus the fixes' loss terms; the
        surrogate's and the loss terms' own metrics come back as ``FIX_METRIC + name`` (summed over
        micro-batches by the update)."""
        own: dict[str, Any] = {}

        def surrogate(*args: Any, **kwargs: Any) -> Any:
            out, metrics = self.token_losses(*args, **kwargs)
            own.update(metrics)
            return out

        loss, stats = objective.policy_loss(
            logp=logp, old_logp=old_logp, advantages=advantages, mask=mask, weights=weights, surrogate=surrogate,
            kl_coef=self.kl_coef, kl_estimator=self.kl_estimator, ref_logp=ref_logp, keep=keep)
        for term in self.loss_terms.values():
            value, metrics = unpack(term(logp=logp, old_logp=old_logp, entropy=entropy, mask=mask, weights=weights))
            loss = loss + value
            own.update(metrics)
        stats.update({FIX_METRIC + k: v.detach() if hasattr(v, "detach") else v for k, v in own.items()})
        return loss, stats

    def check_logged(self, row: dict[str, Any]) -> None:
        """Refuse a trained step's metrics ``row`` that lacks a metric a fix that is on declares."""
        missing = [f"{m} (fix {name})" for name, ms in self.declared.items() for m in ms if m not in row]
        if missing:
            raise RuntimeError(f"metrics declared by a fix that is on were not logged: {', '.join(missing)}")


def run_info(cfg: Any) -> RunInfo:
    return RunInfo(max_response_len=cfg.rollout.max_response_len, group_size=cfg.rollout.n, seed=cfg.seed)


def check(algo: Any, run: RunInfo) -> None:
    """GRPO's values, every fix's own checks (on or off: its values must be valid), extension keys, the
    combination."""
    grpo.check(algo, run)
    for fix in fixes.FIXES.values():
        if fix.check is not None:
            fix.check(algo, run)
    declared = fixes.declared_ext_keys()
    unknown = sorted(set(algo.ext) - declared)
    if unknown:
        raise ConfigError(f"algo.ext.{unknown[0]} is read by no registered fix (declared extension keys: "
                          f"{', '.join(sorted(declared)) or 'none'}); register the fix first (dapo_exp.fixes)")
    fixes.check_combination(algo)


def compose(algo: Any, run: RunInfo) -> Plan:
    """Check, then bind the hooks of the fixes that are on into the run's :class:`Plan` (GRPO's pieces in the
    slots none fills)."""
    check(algo, run)
    bound: dict[str, list[tuple[str, Any]]] = {slot: [] for slot in fixes.SLOTS}
    for fix in fixes.active(algo):
        hooks = fix.bind(algo, run)
        if set(hooks) != set(fix.slots):
            raise ValueError(f"fix {fix.name!r} declares slots {sorted(fix.slots)} but bound {sorted(hooks)}")
        for slot, hook in hooks.items():
            bound[slot].append((fix.name, hook))

    passed: set[str] = set()  # the slots whose hooks reach the Plan below

    def one(slot: str, default: Any) -> Any:
        passed.add(slot)
        return bound[slot][0][1] if bound[slot] else default  # exclusive slots hold one (check_combination)

    def chain(slot: str) -> tuple[Callable, ...]:
        passed.add(slot)
        return tuple(h for _, h in bound[slot])

    def named(slot: str) -> dict[str, Callable]:
        passed.add(slot)
        return dict(bound[slot])

    # one keyword per slot of fixes.SLOTS (a slot this call does not pass is refused below, not dropped)
    plan = Plan(
        surrogate=one("surrogate", grpo.surrogate(algo)),
        normaliser=one("normaliser", grpo.normaliser(grpo.MODE, run)),
        estimator=one("estimator", grpo.advantage(algo)), advantage_transforms=chain("advantage"),
        reward_terms=named("reward"),
        reward_metrics={f.name: f.metrics[0] for f in fixes.FIXES.values() if "reward" in f.slots},
        group_filter=one("group_filter", None), token_masks=chain("token_mask"), update_masks=chain("update_mask"),
        rollout_weight=one("rollout_weight", None), loss_terms=named("loss_term"),
        kl_coef=algo.kl_coef, kl_estimator=algo.kl_estimator,
        declared={f.name: f.metrics for f in fixes.active(algo)},
        greedy_baseline=any(f.greedy_baseline for f in fixes.active(algo)),
    )
    if missing := [slot for slot in fixes.SLOTS if slot not in passed]:
        raise ValueError(f"slot(s) {', '.join(missing)} of fixes.SLOTS reach no Plan field: compose() must pass each "
                         "slot's hooks to Plan(...) (docs/how-to/extend.md, a new slot)")
    return plan
