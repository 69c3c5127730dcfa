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

from dapo_exp.fixes.base import Fix, Key, binds, check_range, register_fix
from dapo_exp.fixes.verl_rules import A, Rule, read_by, surrogate

FIX = register_fix(Fix(
    name="gmpo", short="gmpo", title="GMPO", paper="GMPO §3, Eq. 5",
    schema=(
        Key("gmpo", bool, False, 'GMPO: the geometric mean of the clipped token ratios (Zhao et al. 2025)'),
        Key("gmpo_eps_low", float, 0.4, "GMPO's clip range in log space, (e^-low, e^high) (paper: 0.4 / 0.4)"),
        Key("gmpo_eps_high", float, 0.4, "GMPO's clip range in log space, (e^-low, e^high) (paper: 0.4 / 0.4)"),
    ), is_on=lambda a: bool(a.gmpo),
    slots=("surrogate",), bind=binds("surrogate", "gmpo_surrogate", eps_low="gmpo_eps_low", eps_high="gmpo_eps_high"),
    check=lambda algo, run: check_range(algo, *((k, ">= 0 (log space)", lambda v: v >= 0)
                                                for k in ("gmpo_eps_low", "gmpo_eps_high"))),
    excludes=("clip_higher", "token_level_loss", "dr_grpo_norm"),
    why_excluded=tuple((name, "GMPO's objective is a mean over responses of one loss each; a token-level or constant "
                        "normaliser would weight each response by its length, neither GMPO's objective nor verl's")
                       for name in ("token_level_loss", "dr_grpo_norm")),
    metrics=("actor/pg_clipfrac_higher", "actor/pg_clipfrac_lower"),
    verl={"gmpo": Rule(f"`{A}policy_loss.loss_mode=geo_mean`, `{A}clip_ratio_low/high` = `algo.gmpo_eps_low/high`",
                       surrogate("geo_mean", "gmpo_eps_low", "gmpo_eps_high")),
          **read_by("gmpo", "gmpo_eps_low", "gmpo_eps_high")},
))
