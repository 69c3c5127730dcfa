"""CISPO (MiniMax-M1, 2025): clip the importance weight, never the token's gradient.

``l_t = -sg(clip(r_t, 1 - eps_low, 1 + eps_high)) A_t logp_t``: the weight is truncated and
detached, and every token keeps its REINFORCE gradient (PPO's clip drops the gradient of the
tokens it clips, often the rare reflective ones). ``cispo_eps_low = 1`` means no lower bound (the
paper sets none); the upper bound 4 (a weight cap of 5) is the value used since (ScaleRL, TRL).
It fills the ``surrogate`` slot with :func:`dapo_exp.objective.cispo_surrogate`; Clip-Higher's
range does not apply to its weight, so the two exclude each other.
"""

from __future__ import annotations

import functools

from dapo_exp.config import ConfigError
from dapo_exp.fixes.base import Fix, register_fix


def _bind(algo, run):
    from dapo_exp import objective

    return {"surrogate": functools.partial(objective.cispo_surrogate, eps_low=algo.cispo_eps_low,
                                           eps_high=algo.cispo_eps_high)}


def _check(algo, run):
    if not (0 <= algo.cispo_eps_low <= 1 and algo.cispo_eps_high >= 0):
        raise ConfigError(f"algo.cispo_eps_low / cispo_eps_high: need 0 <= low <= 1 and high >= 0, got "
                          f"{algo.cispo_eps_low}, {algo.cispo_eps_high}")


FIX = register_fix(Fix(
    name="cispo", short="cispo", title="CISPO", paper="MiniMax-M1 §3.1, Eq. 4",
    keys=("cispo", "cispo_eps_low", "cispo_eps_high"), is_on=lambda a: bool(a.cispo),
    slots=("surrogate",), bind=_bind, check=_check, excludes=("clip_higher",),
    metrics=("actor/pg_clipfrac_higher", "actor/ppo_ratio_mean"),
))
