"""RLOO (Ahmadian et al. 2024, "Back to Basics", arXiv 2402.14740): the leave-one-out baseline.

Each of a group's ``G`` responses is compared with the mean reward of the other ``G - 1``:
``A_i = R_i - (sum_j R_j - R_i) / (G - 1) = G / (G - 1) (R_i - mean(R))``. No std division (the key
``algo.adv_norm_std`` of Dr. GRPO's ``dr_grpo_adv`` is not read, so the two exclude each other), no whitening.
It fills the ``estimator`` slot with :func:`leave_one_out`; verl's ``algorithm.adv_estimator=rloo``
(``compute_rloo_outcome_advantage``; ``rloo_vectorized`` computes the same for ``G >= 2``). A group of one
response has no other response to compare with (verl's ``rloo`` passes ``R`` through there, its
``rloo_vectorized`` gives 0): the switch refuses ``rollout.n < 2``.
"""

from __future__ import annotations

from typing import Any

from dapo_exp.errors import ConfigError
from dapo_exp.fixes.base import Fix, Key, Out, RunInfo, register_fix
from dapo_exp.fixes.verl_rules import Rule

ZERO = "estimator/zero_adv_frac"  # the share of the batch's responses whose advantage is exactly 0


def leave_one_out(rewards: Any, *, lengths: Any = None, parts: Any = None) -> Out:
    """``(N, G)`` leave-one-out advantages ``G / (G - 1) (R_i - mean(R))`` of ``rewards`` (N groups of G >= 2),
    and the share of zeros; ``lengths`` and ``parts`` are not read."""
    g = rewards.shape[1]
    adv = (rewards * g - rewards.sum(dim=1, keepdim=True)) / (g - 1)
    return Out(adv, {ZERO: (adv == 0).float().mean()})


def _check(algo: Any, run: RunInfo) -> None:
    if algo.rloo and run.group_size < 2:
        raise ConfigError(f"rloo: its leave-one-out baseline needs rollout.n >= 2 responses per prompt, got "
                          f"{run.group_size}")


FIX = register_fix(Fix(
    name="rloo", short="rloo", title="RLOO (leave-one-out baseline)", paper="Ahmadian et al. 2024 (arXiv 2402.14740)",
    schema=(Key("rloo", bool, False,
                "RLOO: advantage R_i - mean of the group's other rewards (Ahmadian et al. 2024)"),),
    is_on=lambda a: bool(a.rloo), slots=("estimator",), check=_check,
    bind=lambda algo, run: {"estimator": leave_one_out}, metrics=(ZERO,),
    excludes=("dr_grpo_adv",),
    why_excluded=(("dr_grpo_adv", "RLOO divides by no std: algo.adv_norm_std is not read (verl's rloo ignores "
                                  "norm_adv_by_std_in_grpo)"),),
    verl={"rloo": Rule("`algorithm.adv_estimator=rloo`", lambda v, ctx: {"algorithm.adv_estimator": "rloo"} if v
                       else {})},
))
