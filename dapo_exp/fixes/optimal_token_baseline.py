"""Optimal token baseline: refused, it needs per-token policy statistics.

verl's ``optimal_token_baseline`` gives each token its own baseline, ``B_t = E[G_t W_t] / E[W_t]`` over the
group with ``W_t`` the cumulative sum of ``1 - 2 pi_j + sum_v pi_v^2`` over the response's first ``t`` tokens:
it needs the old policy's probability of every sampled token and the sum of the squared probabilities over
the vocabulary (verl's ``actor.calculate_sum_pi_squared``), per token. The ``estimator`` slot is given
per-response values only, and its advantages are one per response. verl's multi-turn variant,
``tir_optimal_token_baseline``, needs the same statistics (with the rollout weights): this switch's refusal names
both, and no other switch stands for it.
A switch of its own (:func:`dapo_exp.fixes.base.refused`) so that asking for it fails before any compute,
naming why: its check raises :class:`~dapo_exp.errors.ConfigError` when ``algo.optimal_token_baseline`` is
true; it would fill the ``estimator`` slot. On verl the rule fails for ``true`` too.
"""

from __future__ import annotations

from dapo_exp.fixes.base import refused, register_fix
from dapo_exp.fixes.verl_rules import only

FIX = register_fix(refused(
    name="optimal_token_baseline", short="otb", title="Optimal token baseline", paper="verl optimal_token_baseline",
    slot="estimator", only=only,
    needs="it needs per-token policy statistics",
    why=("its per-token baseline (verl's optimal_token_baseline, and tir_optimal_token_baseline, its multi-turn "
         "variant) weighs each group's returns by the policy's per-token statistics (pi of each sampled token and "
         "the sum over the vocabulary of pi squared, from the old policy's forward), which the estimator slot, "
         "given per-response rewards, lengths and reward components, does not receive"),
    doc="optimal token baseline: a per-token baseline weighted by the policy's path variance (verl)",
))
