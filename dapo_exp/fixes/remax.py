"""ReMax: refused, it needs a greedy baseline rollout.

ReMax (Li et al. 2023) subtracts from each sampled response's reward the reward of a greedy (argmax)
response to the same prompt; verl's ``remax`` generates that extra rollout per prompt
(``reward_baselines``). The trainer's rollout samples the group only, so the baseline does not exist here.
A switch of its own (:func:`dapo_exp.fixes.base.refused`) so that asking for it fails before any compute,
naming why: its check raises :class:`~dapo_exp.errors.ConfigError` when ``algo.remax`` is true; it would fill
the ``estimator`` slot. On verl the rule fails for ``true`` too (verl's ``algorithm.adv_estimator=remax``
would run, but not the run the native trainer would).
"""

from __future__ import annotations

from dapo_exp.fixes.base import refused, register_fix
from dapo_exp.fixes.verl_rules import only

FIX = register_fix(refused(
    name="remax", short="remax", title="ReMax", paper="Li et al. 2023 (arXiv 2310.10505)", slot="estimator", only=only,
    needs="it needs a greedy baseline rollout",
    why=("ReMax's baseline is the reward of one greedy response per prompt, which the trainer does not "
         "generate (its rollout samples the group only)"),
    doc="ReMax: reward minus the reward of a greedy response to the same prompt",
))
