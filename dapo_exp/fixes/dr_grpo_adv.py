"""Dr. GRPO's advantage (Liu et al. 2025, "Understanding R1-Zero-Like Training", §3.1): no std division.

GRPO divides a group's centred rewards by their standard deviation, which weighs questions
whose rewards barely vary (nearly all right or all wrong) more: a difficulty bias. Dr. GRPO
keeps ``A_i = R_i - mean(R)``. It is a value of GRPO's advantage, ``algo.adv_norm_std=false``
(:func:`dapo_exp.fixes.grpo.advantage` computes ``R_i - mean`` then, exactly verl's
``norm_adv_by_std_in_grpo=false``; the key, its check and its verl rule are GRPO's, :mod:`dapo_exp.fixes.grpo`),
so it declares no key and fills no slot, as Clip-Higher is a value of GRPO's clip range.
The paper's other change, the constant loss normaliser, is its own switch (``dr_grpo_norm``)
so that the two can be attributed apart.
"""

from __future__ import annotations

from dapo_exp.fixes.base import Fix, register_fix

FIX = register_fix(Fix(
    name="dr_grpo_adv", short="nostd", title="Dr. GRPO advantage (no std)", paper="Dr. GRPO §3.1, Eq. 3",
    sets=("adv_norm_std",), is_on=lambda a: not a.adv_norm_std, slots=(), bind=lambda algo, run: {},
    metrics=("actor/effective_batch_frac",),
))
