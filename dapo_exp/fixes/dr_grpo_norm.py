"""Dr. GRPO's constant loss normaliser (Liu et al. 2025, §3.1): sum of token losses / (responses x L_max).

GRPO's per-response mean makes a long wrong response's tokens weigh less than a short one's
(a length bias); DAPO's token mean removes that across responses but still changes with the
batch's lengths. Dr. GRPO divides by a constant, the number of responses in the mini-batch
times the generation cap ``L_max``. It fills the ``normaliser`` slot with
:func:`dapo_exp.fixes.grpo.normaliser` in ``seq-mean-token-sum-norm`` mode (verl's name),
so it excludes the Token-level Loss, which fills the same slot.
"""

from __future__ import annotations

from typing import Any

from dapo_exp.fixes.base import Fix, Key, register_fix
from dapo_exp.fixes.grpo import normaliser
from dapo_exp.fixes.verl_rules import A, Rule

MODE = "seq-mean-token-sum-norm"  # verl's name of the constant normaliser (dapo_exp.objective.loss_normaliser)

def _dr_grpo_norm(v: bool, ctx: Any) -> dict[str, Any]:
    if not v:
        return {}
    return {A + "loss_agg_mode": MODE, A + "loss_scale_factor": ctx.cfg.rollout.max_response_len}

FIX = register_fix(Fix(
    name="dr_grpo_norm", short="cnorm", title="Dr. GRPO constant normaliser", paper="Dr. GRPO §3.1, Eq. 4",
    schema=(
        Key("dr_grpo_norm", bool, False,
            "Dr. GRPO's constant normaliser: token losses / (responses x rollout.max_response_len)"),
    ), is_on=lambda a: bool(a.dr_grpo_norm), slots=("normaliser",),
    bind=lambda algo, run: {"normaliser": normaliser(MODE, run)},
    metrics=("actor/pg_loss", "response_length/mean"),
    verl={"dr_grpo_norm": Rule(f"`{A}loss_agg_mode=seq-mean-token-sum-norm` + `{A}loss_scale_factor` = "
                               "`rollout.max_response_len`", _dr_grpo_norm)},
))
