"""GDPO (arXiv 2601.05242, as verl cites it): each reward component normalised in its group, then summed and whitened.

GRPO normalises the summed reward, so a component with a large spread (the correctness reward's +-1) drowns one with
a small spread (the overlong penalty). GDPO applies GRPO's group-relative advantage to each component of the reward
on its own (``parts``: ``accuracy`` and each reward fix's term, e.g. ``overlong_punishment``), adds them with weight 1
each (verl's default, ``gdpo_reward_weights`` unset), then whitens the sum over the batch's tokens (verl's
``masked_whiten``: :func:`dapo_exp.fixes.reinforce_pp.length_whiten`). GRPO's std division and epsilon apply to
each component (``algo.adv_norm_std``, ``algo.adv_eps``: Dr. GRPO's ``dr_grpo_adv`` composes). With no reward
fix on there is one component and GDPO is GRPO's advantage whitened over the batch. It fills the ``estimator`` slot
with :func:`decoupled`.

verl (``algorithm.adv_estimator=gdpo``) reads the components from ``algorithm.gdpo_reward_keys`` in its batch's
non-tensor fields; the batch its V1 trainer (the one this backend runs) gives the estimator carries only ``uid``
there (the reward is the summed ``rm_scores``), and our reward function on verl returns no such components
(``score``, ``acc``, ``pred``): the verl rule refuses it.
"""

from __future__ import annotations

import functools
from typing import Any

from dapo_exp.fixes.base import Fix, Key, Out, register_fix
from dapo_exp.fixes.reinforce_pp import length_whiten
from dapo_exp.fixes.verl_rules import Rule, fail

ZERO = "estimator/zero_adv_frac"  # the share of the batch's responses whose advantage is exactly 0
STD = "estimator/whiten_std"  # the token-weighted std the summed advantages were divided by
PARTS = "estimator/components"  # how many reward components were normalised apart


def decoupled(rewards: Any, *, lengths: Any, parts: Any, norm_std: bool = True, eps: float = 1e-6) -> Out:
    """GDPO's ``(N, G)`` advantages: the sum over the reward's components ``parts`` ({name: (N, G)}) of each one's
    group-relative advantage (:func:`dapo_exp.objective.group_advantages` with ``norm_std``, ``eps``), whitened over
    the batch's tokens with the responses' ``lengths``; ``rewards`` (their sum) is not read."""
    from dapo_exp import objective

    total = sum(objective.group_advantages(parts[k].to(rewards.dtype), norm_std=norm_std, eps=eps).to(rewards.dtype)
                for k in sorted(parts))
    adv, std = length_whiten(total, lengths)
    return Out(adv, {ZERO: (adv == 0).float().mean(), STD: std, PARTS: float(len(parts))})


def _verl(v: bool, ctx: Any) -> dict[str, Any]:
    if v:
        fail("algo.gdpo", v, "verl's gdpo reads each component from algorithm.gdpo_reward_keys in the batch's "
             "non-tensor fields; its V1 trainer passes the estimator only uid and the summed reward, and our verl "
             "reward returns no components (run it with backend=native)")
    return {}


FIX = register_fix(Fix(
    name="gdpo", short="gdpo", title="GDPO (decoupled reward normalisation)", paper="arXiv 2601.05242 (verl gdpo)",
    schema=(Key("gdpo", bool, False,
                "GDPO: GRPO's advantage of each reward component apart, summed, whitened over the batch's tokens"),),
    is_on=lambda a: bool(a.gdpo), slots=("estimator",),
    bind=lambda algo, run: {"estimator": functools.partial(decoupled, norm_std=algo.adv_norm_std, eps=algo.adv_eps)},
    metrics=(ZERO, STD, PARTS),
    verl={"gdpo": Rule("none: fails when on (verl's V1 trainer passes gdpo no reward components)", _verl)},
))
