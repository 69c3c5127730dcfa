"""GMPO (Zhao et al. 2025, "Geometric-Mean Policy Optimization"): the geometric mean of clipped token ratios.

Per response, the geometric mean of the sign-aware clipped token ratios replaces their
arithmetic mean, so one outlier token ratio moves the objective less; the clip range is in log
space, ``(e^-eps_low, e^eps_high)`` (paper: 0.4 / 0.4). It fills the ``surrogate`` slot with
:func:`dapo_exp.objective.gmpo_surrogate` (verl's ``geo_mean``) and excludes Clip-Higher, whose
range it does not use. Its objective is a mean over responses of one loss per response, which GRPO's
per-response aggregation gives: a token-level (DAPO) or constant (Dr. GRPO) normaliser would weight
each response's loss by its length, neither GMPO's objective nor verl's (whose ``geo_mean`` ignores the
aggregation mode), so it excludes those two as well.
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
    slots=("surrogate",), bind=_bind, check=_check, excludes=("clip_higher", "token_level_loss", "dr_grpo_norm"),
    why_excluded=tuple((name, "GMPO's objective is a mean over responses of one loss each; a token-level or constant "
                        "normaliser would weight each response by its length, neither GMPO's objective nor verl's")
                       for name in ("token_level_loss", "dr_grpo_norm")),
    metrics=("actor/pg_clipfrac_higher", "actor/pg_clipfrac_lower"),
))
