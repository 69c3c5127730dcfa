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

Adding a slot is three edits (docs: how-to/extend.md): its declaration in :data:`dapo_exp.fixes.SLOTS`; a method
of :class:`Plan` here that reads the slot's hooks (:meth:`Plan.one` for an exclusive slot, :meth:`Plan.chain` or
:meth:`Plan.named` for a combined one: :func:`compose` hands every slot's hooks to the plan, none to name) and returns
``Out(value, metrics)``; and the one call site of the method (in :mod:`dapo_exp.steps` for a point of the update,
in the rollout for one of the rollout). Its test is a fix of the slot in ``tests/test_extension.py``
(``EXTENSIONS`` and ``VALUES``: its test wants one fix per slot, its hook called and its metric logged).

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

    ``hooks`` holds every slot's bound hooks as :func:`compose` collected them, ``{slot: ((fix name, hook), ...)}``
    in registry order (a slot no fix that is on fills: empty or absent); ``defaults`` GRPO's piece of an exclusive
    slot that none fills (the estimator, the surrogate, the normaliser). A method reads its slot's hooks with
    :meth:`one` (an exclusive slot: the hook, else the default), :meth:`chain` (the hooks in order) or
    :meth:`named` (``{fix: hook}``); the steps call the methods. :meth:`of` builds a plan by hand (tests).
    """

    hooks: Mapping[str, tuple[tuple[str, Callable], ...]] = field(default_factory=dict)
    defaults: Mapping[str, Any] = field(default_factory=dict)  # exclusive slot -> GRPO's piece where none is on
    reward_metrics: Mapping[str, str] = field(default_factory=dict)  # every registered reward fix -> its metric
    kl_coef: float = 0.0  # GRPO's KL penalty against the reference (0: off)
    kl_estimator: str = "k3"
    declared: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # fix on -> the metrics it declares
    greedy_baseline: bool = False  # the estimator reads the reward of a greedy response per prompt (ReMax)

    @classmethod
    def of(cls, **kwargs: Any) -> Plan:
        """A plan built by hand: a keyword named after a slot of :data:`dapo_exp.fixes.SLOTS` gives its hook (or
        a tuple of hooks, in order; None: none), bound as fix ``"<slot>"``; the other keywords are fields."""
        hooks = {}
        for slot in [k for k in kwargs if k in fixes.SLOTS]:
            value = kwargs.pop(slot)
            chained = value if isinstance(value, tuple) else () if value is None else (value,)
            hooks[slot] = tuple((slot, h) for h in chained)
        return cls(hooks=hooks, **kwargs)

    def one(self, slot: str) -> Any:
        """An exclusive slot's hook (:func:`dapo_exp.fixes.check_combination` lets one fix fill it), else its
        default (GRPO's piece, or None)."""
        bound = self.hooks.get(slot)
        return bound[0][1] if bound else self.defaults.get(slot)

    def chain(self, slot: str) -> tuple[Callable, ...]:
        """A combined slot's hooks, in registry order."""
        return tuple(h for _, h in self.hooks.get(slot, ()))

    def named(self, slot: str) -> dict[str, Callable]:
        """A combined slot's hooks by fix name."""
        return dict(self.hooks.get(slot, ()))

    def reward(self, *, lengths: Any, correct: Any, texts: list[str]) -> Out:
        """Each reward term's ``(B,)`` values, ``{fix name: values}`` (added to the correctness reward by the
        rollout), from the responses' ``lengths`` (B,), ``correct`` (B,) bool and decoded ``texts``; and the
        terms' own metrics."""
        values, metrics = {}, {}
        for name, term in self.named("reward").items():
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
        return self.one("group_filter")

    def keep_groups(self, correct: Any, reward: Any) -> Out:
        """``(N,)`` bool: of a round's groups (``correct``, ``reward``: ``(N, G)`` float) those the batch
        keeps (every one without a filter); and the filter's metrics."""
        group_filter = self.one("group_filter")
        if group_filter is None:
            return Out(correct.new_ones(correct.shape[0], dtype=bool), {})
        keep, metrics = unpack(group_filter.keep(correct, reward))
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
        estimator = self.one("estimator") or grpo.group_relative
        adv, metrics = unpack(estimator(rewards, lengths=lengths, parts=dict(parts or {"accuracy": rewards}),
                                             **extra))
        for transform in self.chain("advantage"):
            adv, m = unpack(transform(adv, rewards))
            metrics.update(m)
        return Out(adv, metrics)

    def token_mask(self, mask: Any, truncated: Any) -> Out:
        """``(B, T)`` tokens that count in the loss (``mask`` itself when no fix masks); and their metrics."""
        metrics: dict[str, Any] = {}
        for hook in self.chain("token_mask"):
            mask, m = unpack(hook(mask, truncated))
            metrics.update(m)
        return Out(mask, metrics)

    def weights(self, mask: Any, group_index: Any) -> Out:
        """``(B,)`` loss weights of a mini-batch (the normaliser); and its metrics."""
        return Out(*unpack(self.one("normaliser")(mask, group_index)))

    @property
    def masks_updates(self) -> bool:
        return bool(self.chain("update_mask"))

    def keep(self, entropy: Any, mask: Any) -> Out:
        """``(B, T)`` bool: of ``mask``'s tokens those whose policy-gradient term counts (every update mask's);
        and their metrics."""
        keep, metrics = mask.bool(), {}
        for hook in self.chain("update_mask"):
            mine, m = unpack(hook(entropy, mask))
            keep = keep & mine.bool()
            metrics.update(m)
        return Out(keep, metrics)

    @property
    def weighs_tokens(self) -> bool:
        return self.one("rollout_weight") is not None

    def token_weight(self, old_logp: Any, engine_logp: Any, mask: Any) -> Out:
        """``(B, T)`` detached weights multiplied into the per-token advantages (the rollout weight); and its
        metrics."""
        return Out(*unpack(self.one("rollout_weight")(old_logp, engine_logp, mask)))

    @property
    def needs_entropy(self) -> bool:
        """Does the loss read the policy's per-token entropy (with its gradient)?"""
        return bool(self.chain("loss_term"))

    def token_losses(self, logp: Any, old_logp: Any, advantages: Any, *, mask: Any) -> Out:
        """The surrogate slot: ``(B, T)`` per-token losses and clip flags (:class:`dapo_exp.objective.SurrogateOut`,
        GRPO's clipped surrogate where no fix fills the slot); and the surrogate's own metrics."""
        return Out(*unpack(self.one("surrogate")(logp, old_logp, advantages, mask=mask)))

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
        for term in self.chain("loss_term"):
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

    return Plan(
        hooks={slot: tuple(hooks) for slot, hooks in bound.items()},
        defaults={"estimator": grpo.advantage(algo), "surrogate": grpo.surrogate(algo),
                  "normaliser": grpo.normaliser(grpo.MODE, run)},
        reward_metrics={f.name: f.metrics[0] for f in fixes.FIXES.values() if "reward" in f.slots},
        kl_coef=algo.kl_coef, kl_estimator=algo.kl_estimator,
        declared={f.name: f.metrics for f in fixes.active(algo)},
        greedy_baseline=any(f.greedy_baseline for f in fixes.active(algo)),
    )
