"""GAE (PPO with a critic): refused, it needs a critic.

Generalised advantage estimation (Schulman et al. 2016; verl's ``gae``, PPO's estimator) sums the
discounted temporal differences of a value model's per-token predictions, ``delta_t = r_t + gamma V_t+1 - V_t``,
with weight ``(gamma lambda)^k``. The trainer has no value model (the GRPO family drops the critic).
A switch of its own (:func:`dapo_exp.fixes.base.refused`) so that asking for it fails before any compute,
naming why: its check raises :class:`~dapo_exp.errors.ConfigError` when ``algo.gae`` is true; it would fill
the ``estimator`` slot. On verl the rule fails for ``true`` too (verl's ``gae`` would build a critic the native
trainer lacks).
"""

from __future__ import annotations

from dapo_exp.fixes.base import refused, register_fix
from dapo_exp.fixes.verl_rules import only

FIX = register_fix(refused(
    name="gae", short="gae", title="GAE (PPO with a critic)", paper="Schulman et al. 2016 (arXiv 1506.02438)",
    slot="estimator", only=only,
    needs="it needs a critic",
    why=("GAE's advantages come from a learnt value model (a critic) trained alongside the policy, which the "
         "trainer does not have"),
    doc="GAE: generalised advantage estimation from a learnt critic (PPO)",
))
