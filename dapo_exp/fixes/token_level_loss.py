"""Token-level policy-gradient loss (DAPO §3.3, Eq. 12): every token of the mini-batch weighs the same.

GRPO averages inside each response, then over responses (``seq-mean-token-mean``), so a
token of a long response weighs less than one of a short response. ``token-mean`` divides
the mini-batch's summed token losses by its token count. It fills the ``normaliser`` slot
with :func:`dapo_exp.objective.loss_normaliser` in the mode ``algo.loss_agg`` (also
``group-token-mean``, Eq. 12 read per prompt group). Dr. GRPO's constant ``B * L_max``
(``seq-mean-token-sum-norm``) is refused here: it is the ``dr_grpo_norm`` switch, and one
behaviour has one label, so that a run's switches say what it trained with. The normaliser is the whole mini-batch's, so how a
mini-batch is split into micro-batches never changes the gradient.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from dapo_exp.config import ConfigError
from dapo_exp.fixes.base import Fix, RunInfo, register_fix

GRPO_MODE = "seq-mean-token-mean"  # the off state: GRPO's sample-level loss
DR_GRPO_MODE = "seq-mean-token-sum-norm"  # Dr. GRPO's constant normaliser: the dr_grpo_norm switch's, not this one's


def normaliser(mode: str, run: RunInfo) -> Callable:
    """``(mask (B, T), group_index (B,)) -> (B,)`` weights of ``mode``; ``L_max`` is the generation cap."""
    from dapo_exp import objective

    return functools.partial(_weights, objective.loss_normaliser, mode, run.max_response_len)


def _weights(fn: Callable, mode: str, max_len: int, mask: Any, group_index: Any) -> Any:
    return fn(mask, mode, group_index, max_len=max_len)


def _check(algo: Any, run: RunInfo) -> None:
    from dapo_exp.objective import LOSS_AGG_MODES

    if algo.loss_agg == DR_GRPO_MODE:
        raise ConfigError(f"algo.loss_agg={DR_GRPO_MODE} is Dr. GRPO's constant normaliser, the dr_grpo_norm switch: "
                          "use dr_grpo_norm=enabled token_level_loss=disabled (one behaviour, one label in the run's "
                          "switches and the table)")
    if algo.loss_agg not in LOSS_AGG_MODES:
        raise ConfigError(f"algo.loss_agg={algo.loss_agg!r} is not valid; choose one of: "
                          f"{', '.join(m for m in LOSS_AGG_MODES if m != DR_GRPO_MODE)}")


FIX = register_fix(Fix(
    name="token_level_loss", short="tl", title="Token-level Policy Gradient Loss", paper="DAPO §3.3, Eq. 12",
    keys=("loss_agg",), is_on=lambda a: a.loss_agg != GRPO_MODE,
    slots=("normaliser",), bind=lambda algo, run: {"normaliser": normaliser(algo.loss_agg, run)},
    metrics=("actor/entropy", "response_length/mean"), check=_check,
))
