"""CISPO (MiniMax-M1, 2025): clip the importance weight, never the token's gradient.

``l_t = -sg(clip(r_t, 1 - eps_low, 1 + eps_high)) A_t logp_t``: the weight is truncated and
detached, and every token keeps its REINFORCE gradient (PPO's clip drops the gradient of the
tokens it clips, often the rare reflective ones). ``cispo_eps_low = 1`` means no lower bound (the
paper sets none); the upper bound 4 (a weight cap of 5) is the value used since (ScaleRL, TRL).
It fills the ``surrogate`` slot with :func:`dapo_exp.objective.cispo_surrogate`; Clip-Higher's
range does not apply to its weight, so the two exclude each other.
"""

from __future__ import annotations

from dapo_exp.fixes.base import Fix, Key, binds, check_range, register_fix
from dapo_exp.fixes.verl_rules import A, Rule, read_by, surrogate

FIX = register_fix(Fix(
    name="cispo", short="cispo", title="CISPO", paper="MiniMax-M1 §3.1, Eq. 4",
    schema=(
        Key("cispo", bool, False, 'CISPO: the clipped, detached importance weight times log pi (MiniMax-M1)'),
        Key("cispo_eps_low", float, 1.0,
            "CISPO's weight bounds: 1 - low (1 = no lower bound, the paper) and 1 + high (4: a cap of 5)"),
        Key("cispo_eps_high", float, 4.0,
            "CISPO's weight bounds: 1 - low (1 = no lower bound, the paper) and 1 + high (4: a cap of 5)"),
    ), is_on=lambda a: bool(a.cispo),
    slots=("surrogate",), bind=binds("surrogate", "cispo_surrogate", eps_low="cispo_eps_low", eps_high="cispo_eps_high"),
    check=lambda algo, run: check_range(algo, ("cispo_eps_low", "in [0, 1]", lambda v: 0 <= v <= 1),
                                        ("cispo_eps_high", ">= 0", lambda v: v >= 0)),
    excludes=("clip_higher",), metrics=("actor/pg_clipfrac_higher", "actor/ppo_ratio_mean"),
    verl={"cispo": Rule(f"`{A}policy_loss.loss_mode=cispo`, `{A}clip_ratio_low/high` = `algo.cispo_eps_low/high`",
                        surrogate("cispo", "cispo_eps_low", "cispo_eps_high")),
          **read_by("cispo", "cispo_eps_low", "cispo_eps_high")},
))
