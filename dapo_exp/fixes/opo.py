"""OPO (Hao et al. 2025, "On-Policy RL with Optimal Reward Baseline", arXiv 2505.23585): the length-weighted baseline.

The baseline of a group is the mean of its rewards weighted by the responses' token counts,
``b = sum_j L_j R_j / sum_j L_j``: the paper's variance-minimising baseline with each response's squared gradient
norm approximated by its length; ``A_i = R_i - b``. No std division
(``algo.adv_norm_std`` is not read: ``dr_grpo_adv`` excluded). A group of one response keeps its reward
(baseline 0, as verl's). It fills the ``estimator`` slot with :func:`length_weighted`; verl's
``algorithm.adv_estimator=opo`` (``compute_opo_outcome_advantage``, whose lengths are its response mask's sums).
The paper's other ingredient, exactly on-policy training (one gradient step per batch), is the trainer's
``train`` sizes (``train.mini_batch_size`` equal to the rollout batch), not this switch.
"""

from __future__ import annotations

from typing import Any

from dapo_exp.fixes.base import Fix, Key, Out, register_fix
from dapo_exp.fixes.verl_rules import Context, Rule, fail, on

ZERO = "estimator/zero_adv_frac"  # the share of the batch's responses whose advantage is exactly 0
BASELINE = "estimator/baseline_mean"  # the batch's mean of the groups' length-weighted baselines


def length_weighted(rewards: Any, *, lengths: Any, parts: Any = None) -> Out:
    """``(N, G)`` advantages ``R_i - sum_j L_j R_j / sum_j L_j`` of each group of ``rewards`` with the responses'
    token counts ``lengths`` (N, G) (a group of one: ``R_i``); ``parts`` is not read."""
    w = lengths.to(rewards.dtype)
    base = (w * rewards).sum(dim=1, keepdim=True) / w.sum(dim=1, keepdim=True)
    if rewards.shape[1] == 1:
        base = base * 0
    adv = rewards - base
    return Out(adv, {ZERO: (adv == 0).float().mean(), BASELINE: base.mean()})


def _verl(v: bool, ctx: Context) -> dict[str, Any]:
    if not v:
        return {}
    if on(ctx, "overlong_filtering"):
        fail("algo.opo", v, "verl's OPO weighs by its response mask, from which Overlong Filtering removed the "
             "truncated responses (length 0 there); ours by every response's tokens (switch one off)")
    return {"algorithm.adv_estimator": "opo"}


FIX = register_fix(Fix(
    name="opo", short="opo", title="OPO (length-weighted optimal baseline)", paper="Hao et al. 2025 (arXiv 2505.23585)",
    schema=(Key("opo", bool, False, "OPO: advantage R_i - the group's length-weighted mean reward (Hao et al. 2025)"),),
    is_on=lambda a: bool(a.opo), slots=("estimator",), bind=lambda algo, run: {"estimator": length_weighted},
    metrics=(ZERO, BASELINE), excludes=("dr_grpo_adv",),
    why_excluded=(("dr_grpo_adv", "OPO divides by no std: algo.adv_norm_std is not read (verl's opo ignores "
                                  "norm_adv_by_std_in_grpo)"),),
    verl={"opo": Rule("`algorithm.adv_estimator=opo`; with overlong_filtering it fails (verl weighs by the filtered "
                      "mask)", _verl)},
))
