"""Pass@k advantage (verl's ``grpo_passk``, after arXiv 2503.19595 as verl cites it): only the best response learns.

For the pass@k objective only the best of a group's responses counts, so only it gets an advantage: its margin
over the second best, ``A = (r_max - r_second) / (std(R) + eps)`` (without the std division when
``algo.adv_norm_std=false``: Dr. GRPO's ``dr_grpo_adv`` composes, as verl's ``norm_adv_by_std_in_grpo``), every
other response 0. With binary rewards a group learns only when exactly one response is right. A tie at the top
gives 0 to the whole group. ``eps`` is GRPO's ``algo.adv_eps``; the std is the unbiased one (``torch.std``). It
fills the ``estimator`` slot with :func:`best_margin`; verl's ``algorithm.adv_estimator=grpo_passk``
(``compute_grpo_passk_outcome_advantage``, which raises for a group of fewer than 2: the switch refuses
``rollout.n < 2``).
"""

from __future__ import annotations

import functools
from typing import Any

from dapo_exp.errors import ConfigError
from dapo_exp.fixes.base import Fix, Key, Out, RunInfo, register_fix
from dapo_exp.fixes.verl_rules import Rule

ZERO = "estimator/zero_adv_frac"  # the share of the batch's responses whose advantage is exactly 0


def best_margin(rewards: Any, *, lengths: Any = None, parts: Any = None, norm_std: bool = True,
                eps: float = 1e-6) -> Out:
    """``(N, G)`` advantages: in each group of ``rewards`` the best response's margin over the second best, divided
    by ``std + eps`` with ``norm_std`` (a tie at the top: 0); the others 0. ``lengths``, ``parts`` are not read."""
    import torch

    top, idx = torch.topk(rewards, 2, dim=1)
    margin = top[:, 0] - top[:, 1]
    if norm_std:
        margin = margin / (rewards.std(dim=1) + eps)
    adv = torch.zeros_like(rewards).scatter(1, idx[:, :1], margin[:, None])
    return Out(adv, {ZERO: (adv == 0).float().mean()})


def _check(algo: Any, run: RunInfo) -> None:
    if algo.grpo_passk and run.group_size < 2:
        raise ConfigError(f"grpo_passk: the best response's margin over the second best needs rollout.n >= 2, got "
                          f"{run.group_size}")


FIX = register_fix(Fix(
    name="grpo_passk", short="passk", title="Pass@k advantage (best response's margin)",
    paper="verl grpo_passk (arXiv 2503.19595)",
    schema=(Key("grpo_passk", bool, False,
                "Pass@k: only each group's best response learns, its margin over the second best / std"),),
    is_on=lambda a: bool(a.grpo_passk), slots=("estimator",), check=_check,
    bind=lambda algo, run: {"estimator": functools.partial(best_margin, norm_std=algo.adv_norm_std, eps=algo.adv_eps)},
    metrics=(ZERO,),
    verl={"grpo_passk": Rule("`algorithm.adv_estimator=grpo_passk` (its std division: `algo.adv_norm_std`'s "
                             "`algorithm.norm_adv_by_std_in_grpo`)",
                             lambda v, ctx: {"algorithm.adv_estimator": "grpo_passk"} if v else {})},
))
