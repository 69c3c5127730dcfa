"""GPG's advantage estimator (Chu et al. 2025, arXiv 2504.02546), as verl 0.9.1 computes it (``adv_estimator=gpg``).

``A_i = alpha (R_i - mean(R of i's group)) / F_norm`` with ``F_norm = 1`` and one ``alpha`` for the whole
batch, ``alpha = B / M``: ``B`` responses, ``M`` of them with a non-zero reward (at least 1), verl's
``compute_gpg_outcome_advantage``. The paper's alpha rescales the gradient by the share of responses that
carry one; verl counts the responses whose *reward* is non-zero instead, so with rewards of +-1 (the
correctness reward here) ``M = B``, ``alpha = 1`` and the estimator is Dr. GRPO's ``R_i - mean``; with
rewards in {0, 1} ``alpha`` is the inverse of the batch's accuracy. A group of one response has mean 0
(verl), so ``A = alpha R``. No std division: ``algo.adv_norm_std`` is a value of GRPO's estimator, which this
one replaces, so it excludes ``dr_grpo_adv``. It fills the ``estimator`` slot with :func:`estimator` and
logs ``gpg/alpha``.
"""

from __future__ import annotations

from typing import Any

from dapo_exp.fixes.base import Fix, Key, Out, RunInfo, register_fix
from dapo_exp.fixes.verl_rules import Rule


def estimator(rewards: Any, *, lengths: Any = None, parts: Any = None) -> Out:
    """GPG's advantages of ``rewards (N, G)``: ``alpha (R - group mean)``, ``alpha = N G / max(#(R != 0), 1)``;
    a group of one has mean 0. ``lengths`` and ``parts`` are not read. Returns ``Out(advantages, {"gpg/alpha":
    alpha})``."""
    import torch

    alpha = rewards.numel() / torch.count_nonzero(rewards).clamp(min=1)
    mean = rewards.mean(dim=1, keepdim=True) if rewards.shape[1] > 1 else torch.zeros_like(rewards[:, :1])
    return Out(alpha * (rewards - mean), {"gpg/alpha": float(alpha)})


def _bind(algo: Any, run: RunInfo) -> dict[str, Any]:
    return {"estimator": estimator}


def _verl(v: bool, ctx: Any) -> dict[str, Any]:
    return {"algorithm.adv_estimator": "gpg"} if v else {}


FIX = register_fix(Fix(
    name="gpg_adv", short="gpgadv", title="GPG advantage", paper="GPG (arXiv 2504.02546) §3, verl adv_estimator=gpg",
    schema=(
        Key("gpg_adv", bool, False, "GPG's estimator: alpha (R - group mean), alpha = B / #(non-zero rewards) (verl)"),
    ), is_on=lambda a: bool(a.gpg_adv), slots=("estimator",), bind=_bind,
    excludes=("dr_grpo_adv",),
    why_excluded=(("dr_grpo_adv", "GPG's estimator never divides by the std; algo.adv_norm_std is a value of GRPO's "
                                  "estimator, which gpg_adv replaces"),),
    metrics=("gpg/alpha",),
    verl={"gpg_adv": Rule("`algorithm.adv_estimator=gpg`", _verl)},
))
