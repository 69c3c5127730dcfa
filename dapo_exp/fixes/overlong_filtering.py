"""Overlong Filtering (DAPO §3.4, Table 1 row 2): truncated responses leave the loss.

A response truncated at the length cap (no EOS) is masked out of the loss, numerator and
denominator; its reward still counts in its group's advantage statistics (mask, not drop).
It fills the ``token_mask`` slot with :func:`dapo_exp.objective.overlong_filtering`.
"""

from __future__ import annotations

from typing import Any

from dapo_exp import rundir
from dapo_exp.fixes.base import Fix, Judged, Key, Out, register_fix
from dapo_exp.fixes.verl_rules import R, Rule


def _bind(algo, run):
    from dapo_exp import objective

    def token_mask(mask, truncated):  # logs the share of the batch's responses it masked out of the loss
        return Out(objective.overlong_filtering(mask, truncated),
                   {"overlong_filtering/masked_frac": float(truncated.float().mean())})

    return {"token_mask": token_mask}


def _filtering(v: bool, ctx: Any) -> dict[str, Any]:
    """verl has no switch for it: the backend's own agent loop masks the truncated responses."""
    if not v:
        return {R + "agent.default_agent_loop": "single_turn_agent"}
    return {R + "agent.default_agent_loop": ctx.agent_loop, "actor_rollout_ref.model.external_lib": ctx.ext_module}

FIX = register_fix(Fix(
    name="overlong_filtering", short="of", title="Overlong Filtering", paper="DAPO §3.4, Table 1 row 2",
    schema=(Key("overlong_filtering", bool, False,
                "mask truncated responses out of the loss (Table 1 ladder: on; released script: off)"),),
    is_on=lambda a: bool(a.overlong_filtering), slots=("token_mask",), bind=_bind,
    metrics=("overlong_filtering/masked_frac", "actor/masked_token_frac"),
    study=Judged("toy_overlong", (
        ("avg/diag/style_step_long", +1, "step-by-step share on long problems (5+ operands), whose solutions the "
                                         "cap truncates: the push to short guesses"),
        (f"avg/{rundir.RESP_LEN}", +1, "mean response length (tokens)"))),
    verl={"overlong_filtering": Rule(f"`{R}agent.default_agent_loop` = the backend's agent loop + "
                                     "`actor_rollout_ref.model.external_lib` = its module (dapo_exp.backends.verl's "
                                     "OF_AGENT_LOOP, EXT_MODULE)", _filtering)},
))
