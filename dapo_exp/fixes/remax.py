"""ReMax (Li et al. 2023, arXiv 2310.10505): the reward of a greedy response as the baseline.

Each sampled response's advantage is its reward minus the reward of one greedy (argmax at every token)
response to the same prompt: ``A_i = R_i - R(greedy)``, the same for every token of the response. No group
mean, no std division (the key ``algo.adv_norm_std`` of Dr. GRPO's ``dr_grpo_adv`` is not read, so the two
exclude each other), no whitening; a group of one response works (the baseline is not the group's). The
fix declares ``greedy_baseline``: the rollout then decodes one greedy response per prompt besides the
group (``SamplingSpec(greedy=True)``: transformers' greedy search, vLLM at temperature 0), scores it like
the samples (correctness reward plus the reward terms of the fixes that are on, as verl scores its baseline
batch with the same reward function), and the estimator receives those rewards as ``baseline`` (N,). Cost:
one more response per prompt, ``1 / G`` more generation. It fills the ``estimator`` slot with
:func:`greedy_baseline`, equal to verl 0.9.1's ``compute_remax_outcome_advantage`` (the reward at the last
token, its reverse cumulative sum is ``R`` at every token) in float64 (tests/test_verl_parity_estimators.py).

On verl it fails before any compute: verl 0.9.1 decodes the greedy baseline (``reward_baselines``) only in
its legacy trainer; the V1 trainer this backend runs (``trainer.use_v1=true``, the one with DAPO's group
filter) never does, so ``algorithm.adv_estimator=remax`` would stop at its first step.
"""

from __future__ import annotations

from typing import Any

from dapo_exp.fixes.base import Fix, Key, Out, register_fix
from dapo_exp.fixes.verl_rules import only

ZERO = "estimator/zero_adv_frac"  # the share of the batch's responses whose advantage is exactly 0
BASELINE = "remax/baseline_reward"  # the mean reward of the batch's greedy responses


def greedy_baseline(rewards: Any, *, baseline: Any, lengths: Any = None, parts: Any = None) -> Out:
    """``(N, G)`` advantages ``R_i - baseline`` of ``rewards`` (N groups of G >= 1) against ``baseline`` (N,), the
    reward of each prompt's greedy response; the share of zeros and the baselines' mean. ``lengths`` and
    ``parts`` are not read."""
    adv = rewards - baseline.to(rewards.dtype).unsqueeze(1)
    return Out(adv, {ZERO: (adv == 0).float().mean(), BASELINE: baseline.float().mean()})


WHY_NOT_VERL = ("verl decodes ReMax's greedy baseline (reward_baselines) only in its legacy trainer, not in the V1 "
                "trainer this backend runs (trainer.use_v1=true, the one with DAPO's group filter)")

FIX = register_fix(Fix(
    name="remax", short="remax", title="ReMax", paper="Li et al. 2023 (arXiv 2310.10505)",
    schema=(Key("remax", bool, False,
                "ReMax: advantage R_i - the reward of a greedy response to the same prompt (one more greedy "
                "response decoded per prompt)"),),
    is_on=lambda a: bool(a.remax), slots=("estimator",), greedy_baseline=True,
    bind=lambda algo, run: {"estimator": greedy_baseline}, metrics=(ZERO, BASELINE),
    excludes=("dr_grpo_adv",),
    why_excluded=(("dr_grpo_adv", "ReMax divides by no std: algo.adv_norm_std is not read (verl's remax ignores "
                                  "norm_adv_by_std_in_grpo)"),),
    verl={"remax": only("algo.remax", False, WHY_NOT_VERL)},
))
