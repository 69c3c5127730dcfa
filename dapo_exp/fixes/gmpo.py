"""GMPO (Zhao et al. 2025, "Geometric-Mean Policy Optimization"): the geometric mean of clipped token ratios.

Per response, the geometric mean of the sign-aware clipped token ratios replaces their
arithmetic mean, so one outlier token ratio moves the objective less; the clip range is in log
space, ``(e^-eps_low, e^eps_high)`` (paper: 0.4 / 0.4). It fills the ``surrogate`` slot with
:func:`dapo_exp.objective.gmpo_surrogate` (verl's ``geo_mean``) and excludes Clip-Higher, whose
range it does not use.
"""

from __future__ import annotations

import functools

from dapo_exp.config import ConfigError
from dapo_exp.fixes.base import Fix, register_fix


def _bind(algo, run):
    from dapo_exp import objective

    return {"surrogate": functools.partial(objective.gmpo_surrogate, eps_low=algo.gmpo_eps_low,
                                           eps_high=algo.gmpo_eps_high)}


def _check(algo, run):
    if algo.gmpo_eps_low < 0 or algo.gmpo_eps_high < 0:
        raise ConfigError(f"algo.gmpo_eps_low / gmpo_eps_high: must be >= 0 (log space), got "
                          f"{algo.gmpo_eps_low}, {algo.gmpo_eps_high}")


FIX = register_fix(Fix(
    name="gmpo", short="gmpo", title="GMPO", paper="GMPO §3, Eq. 5",
    keys=("gmpo", "gmpo_eps_low", "gmpo_eps_high"), is_on=lambda a: bool(a.gmpo),
    slots=("surrogate",), bind=_bind, check=_check, excludes=("clip_higher",),
    metrics=("actor/pg_clipfrac_higher", "actor/pg_clipfrac_lower"),
))
