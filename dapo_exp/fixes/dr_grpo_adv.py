"""Dr. GRPO's advantage (Liu et al. 2025, "Understanding R1-Zero-Like Training", §3.1): no std division.

GRPO divides a group's centred rewards by their standard deviation, which weighs questions
whose rewards barely vary (nearly all right or all wrong) more: a difficulty bias. Dr. GRPO
keeps ``A_i = R_i - mean(R)``. It fills the ``advantage`` slot with
:func:`dapo_exp.objective.group_advantages` without the std (``algo.adv_norm_std=false``).
The paper's other change, the constant loss normaliser, is its own switch (``dr_grpo_norm``)
so that the two can be attributed apart.
"""

from __future__ import annotations

import functools

from dapo_exp.fixes.base import Fix, register_fix


def _bind(algo, run):
    from dapo_exp import objective

    centred = functools.partial(objective.group_advantages, norm_std=False, eps=algo.adv_eps)
    return {"advantage": lambda advantages, rewards: centred(rewards)}


FIX = register_fix(Fix(
    name="dr_grpo_adv", short="nostd", title="Dr. GRPO advantage (no std)", paper="Dr. GRPO §3.1, Eq. 3",
    keys=("adv_norm_std",), is_on=lambda a: not a.adv_norm_std, slots=("advantage",), bind=_bind,
    metrics=("actor/effective_batch_frac",),
))
