"""Token-level policy-gradient loss (DAPO §3.3, Eq. 12): every token of the mini-batch weighs the same.

GRPO averages inside each response, then over responses (``seq-mean-token-mean``), so a
token of a long response weighs less than one of a short response. ``token-mean`` divides
the mini-batch's summed token losses by its token count. It fills the ``normaliser`` slot
with :func:`dapo_exp.fixes.grpo.normaliser` in the mode ``algo.loss_agg`` (also
``group-token-mean``, Eq. 12 read per prompt group). Dr. GRPO's constant ``B * L_max``
(``seq-mean-token-sum-norm``) is refused here: it is the ``dr_grpo_norm`` switch, and one
behaviour has one label, so that a run's switches say what it trained with. The normaliser is the whole mini-batch's, so how a
mini-batch is split into micro-batches never changes the gradient.
"""

from __future__ import annotations

from typing import Any

from dapo_exp import rundir
from dapo_exp.errors import ConfigError
from dapo_exp.fixes.base import Fix, Judged, Key, RunInfo, register_fix
from dapo_exp.fixes.grpo import MODE as GRPO_MODE
from dapo_exp.fixes.grpo import normaliser
from dapo_exp.fixes.verl_rules import A, Rule, fail, on


def _check(algo: Any, run: RunInfo) -> None:
    from dapo_exp.fixes.dr_grpo_norm import MODE as DR_GRPO_MODE  # Dr. GRPO's constant normaliser: its switch's
    from dapo_exp.objective import LOSS_AGG_MODES

    if algo.loss_agg == DR_GRPO_MODE:
        raise ConfigError(f"algo.loss_agg={DR_GRPO_MODE} is Dr. GRPO's constant normaliser, the dr_grpo_norm switch: "
                          "use dr_grpo_norm=enabled token_level_loss=disabled (one behaviour, one label in the run's "
                          "switches and the table)")
    if algo.loss_agg not in LOSS_AGG_MODES:
        raise ConfigError(f"algo.loss_agg={algo.loss_agg!r} is not valid; choose one of: "
                          f"{', '.join(m for m in LOSS_AGG_MODES if m != DR_GRPO_MODE)}")


def _loss_agg(v: str, ctx: Any) -> dict[str, Any]:
    from dapo_exp.fixes.dr_grpo_norm import MODE as DR_GRPO_MODE

    if on(ctx, "dr_grpo_norm"):  # its normaliser replaces this one (they exclude each other natively)
        return {}
    if v in ("token-mean", "seq-mean-token-mean"):
        return {A + "loss_agg_mode": v}
    if v == DR_GRPO_MODE:
        fail("algo.loss_agg", v, "Dr. GRPO's constant normaliser is the dr_grpo_norm switch (dr_grpo_norm=enabled)")
    fail("algo.loss_agg", v, "verl's agg_loss has no per-prompt-group mode")

FIX = register_fix(Fix(
    name="token_level_loss", short="tl", title="Token-level Policy Gradient Loss", paper="DAPO §3.3, Eq. 12",
    schema=(
        Key("loss_agg", str, "seq-mean-token-mean",
            "loss aggregation (GRPO: seq-mean-token-mean; DAPO: token-mean; group-token-mean; Dr. GRPO's seq-mean-token-sum-norm is the dr_grpo_norm switch, refused here)"),
    ), is_on=lambda a: a.loss_agg != GRPO_MODE,
    slots=("normaliser",), bind=lambda algo, run: {"normaliser": normaliser(algo.loss_agg, run)},
    metrics=("actor/entropy", "response_length/mean"), check=_check,
    study=Judged("toy_degeneration", (
        ("avg/diag/degenerate", -1, "share of samples in a repetition loop"),
        (f"avg/{rundir.RESP_LEN}", -1, "mean response length (tokens)"))),
    verl={"loss_agg": Rule(f"`{A}loss_agg_mode` (`token-mean`, `seq-mean-token-mean`; `group-token-mean` fails; "
                           "Dr. GRPO's `seq-mean-token-sum-norm` is `algo.dr_grpo_norm`)", _loss_agg)},
))
