"""REINFORCE++ (Hu 2025, arXiv 2501.03262): the batch-whitened return, no critic; its baseline variant.

REINFORCE++ takes each token's return (our rewards are outcome-only, so with ``gamma = 1`` every token of
response ``i`` has the return ``R_i``) and whitens the returns over the whole batch's tokens. REINFORCE++-baseline
(``algo.reinforce_pp_baseline``, the option ``reinforce_pp=baseline``) first subtracts the group's mean reward,
then whitens the same way. verl whitens over tokens (``verl_F.masked_whiten``: the masked mean, the *unbiased*
masked variance, ``(x - mean) * rsqrt(var + 1e-8)``), so a response weighs as many times as it has tokens:
:func:`length_whiten` is that whitening of per-response values with the responses' ``lengths`` as weights, with
verl's constants (``1e-8`` in the mean's denominator and under the square root, Bessel's ``n / (n - 1)`` over
the batch's token count). No std division of GRPO's (``algo.adv_norm_std`` is not read: ``dr_grpo_adv``
excluded). It fills the ``estimator`` slot; verl's ``algorithm.adv_estimator=reinforce_plus_plus`` (or
``reinforce_plus_plus_baseline``) with ``algorithm.gamma=1.0``. A discount ``gamma < 1`` is not expressed
(outcome rewards would reach earlier tokens discounted, a per-token advantage the estimator slot does not give).
"""

from __future__ import annotations

from typing import Any

from dapo_exp.fixes.base import Fix, Key, Out, register_fix
from dapo_exp.fixes.verl_rules import Context, Rule, fail, on, read_by

ZERO = "estimator/zero_adv_frac"  # the share of the batch's responses whose advantage is exactly 0
STD = "estimator/whiten_std"  # the token-weighted std the batch's values were divided by (sqrt of the variance)
EPS = 1e-8  # verl_F.masked_mean's (denominator) and masked_whiten's (under the square root)


def length_whiten(values: Any, lengths: Any) -> tuple[Any, Any]:
    """``(whitened values, their std)``: ``values`` (any shape, one per response) whitened over the batch's
    tokens, each response weighted by its token count ``lengths`` (same shape), exactly as
    ``verl_F.masked_whiten`` of the values broadcast over each response's tokens: mean
    ``m = sum(L v) / (sum(L) + 1e-8)``, variance ``sum(L (v - m)^2) / (sum(L) + 1e-8) * n / (n - 1)`` with
    ``n = sum(L)`` (verl refuses ``n <= 1``; so does this), result ``(v - m) * rsqrt(var + 1e-8)``."""
    import torch

    w = lengths.to(values.dtype)
    n = w.sum()
    if n <= 1:
        raise ValueError(f"whitening over the batch's tokens needs more than one token, got {float(n)}")
    mean = (w * values).sum() / (n + EPS)
    var = (w * (values - mean) ** 2).sum() / (n + EPS) * (n / (n - 1))
    return (values - mean) * torch.rsqrt(var + EPS), var.sqrt()


def reinforce_pp(rewards: Any, *, lengths: Any, parts: Any = None, baseline: bool = False) -> Out:
    """REINFORCE++'s advantages of ``rewards (N, G)``: the rewards (minus each group's mean with ``baseline``;
    a group of one keeps its reward, as verl's), whitened over the batch's tokens (:func:`length_whiten`);
    ``parts`` is not read."""
    if baseline and rewards.shape[1] > 1:
        rewards = rewards - rewards.mean(dim=1, keepdim=True)
    adv, std = length_whiten(rewards, lengths)
    return Out(adv, {ZERO: (adv == 0).float().mean(), STD: std})


def _bind(algo: Any, run: Any) -> dict[str, Any]:
    import functools

    return {"estimator": functools.partial(reinforce_pp, baseline=bool(algo.reinforce_pp_baseline))}


def _verl(v: bool, ctx: Context) -> dict[str, Any]:
    if not v:
        return {}
    if on(ctx, "overlong_filtering"):
        fail("algo.reinforce_pp", v, "verl whitens over its response mask, from which Overlong Filtering removed the "
             "truncated responses; ours over every response's tokens (switch one off)")
    name = "reinforce_plus_plus_baseline" if ctx.cfg.algo.reinforce_pp_baseline else "reinforce_plus_plus"
    return {"algorithm.adv_estimator": name, "algorithm.gamma": 1.0}


FIX = register_fix(Fix(
    name="reinforce_pp", short="rpp", title="REINFORCE++", paper="Hu 2025 (arXiv 2501.03262)",
    schema=(
        Key("reinforce_pp", bool, False,
            "REINFORCE++: each response's reward whitened over the batch's tokens, no critic (Hu 2025)"),
        Key("reinforce_pp_baseline", bool, False,
            "REINFORCE++-baseline: subtract the group's mean reward before the whitening"),
    ),
    is_on=lambda a: bool(a.reinforce_pp), slots=("estimator",), bind=_bind, metrics=(ZERO, STD),
    options=("disabled", "enabled", "baseline"), excludes=("dr_grpo_adv",),
    why_excluded=(("dr_grpo_adv", "REINFORCE++ divides by the batch's std, not the group's: algo.adv_norm_std is "
                                  "not read (verl's reinforce_plus_plus ignores norm_adv_by_std_in_grpo)"),),
    verl={"reinforce_pp": Rule("`algorithm.adv_estimator=reinforce_plus_plus` (`reinforce_plus_plus_baseline` with "
                               "algo.reinforce_pp_baseline), `algorithm.gamma=1.0`; with overlong_filtering it fails "
                               "(verl whitens over the filtered mask)", _verl),
          **read_by("reinforce_pp", "reinforce_pp_baseline")},
))
