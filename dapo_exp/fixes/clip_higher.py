"""Clip-Higher (DAPO §3.1, Eq. 10): the clip range of PPO's surrogate decoupled, ``eps_high > eps_low``.

The ratio of a token with a positive advantage may rise to ``1 + eps_high`` (paper: 0.28)
before it is clipped, against ``1 - eps_low`` (0.2) below, so that rare tokens can grow
(the paper's argument against entropy collapse). Off, the range is symmetric, as GRPO's.
Its behaviour is the range of the surrogates that use PPO's clip: GRPO's own
(:func:`ppo_clip`, :func:`dapo_exp.objective.clipped_surrogate` bound to ``eps_low`` /
``eps_high``, ``algo.policy_loss=clipped``) and Clip-Cov's, so it fills no slot of its own.
The surrogates with a range or weight of their own (GSPO, CISPO, GMPO) and KL-Cov (no clip)
exclude it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dapo_exp.config import ConfigError
from dapo_exp.fixes.base import Fix, RunInfo, register_fix


def ppo_clip(algo: Any) -> Callable:
    """PPO's clipped surrogate with the range ``[1 - eps_low, 1 + eps_high]`` and the dual clip of ``algo``."""
    import functools

    from dapo_exp import objective

    return functools.partial(objective.clipped_surrogate, eps_low=algo.eps_low, eps_high=algo.eps_high,
                             dual_clip=algo.dual_clip)


def _check(algo: Any, run: RunInfo) -> None:
    for key, ok, msg in (
        ("eps_low", algo.eps_low >= 0, "must be >= 0"),
        ("eps_high", algo.eps_high >= 0, "must be >= 0"),
        ("eps_low", algo.eps_low < 1, "must be < 1 (ratio lower bound 1 - eps_low > 0)"),
        ("dual_clip", algo.dual_clip is None or algo.dual_clip > 1, "must be > 1 or null"),
    ):
        if not ok:
            raise ConfigError(f"algo.{key}: {msg}, got {algo[key]}")


FIX = register_fix(Fix(
    name="clip_higher", short="clip", title="Clip-Higher", paper="DAPO §3.1, Eq. 10",
    keys=("eps_low", "eps_high"), is_on=lambda a: a.eps_high > a.eps_low,
    slots=(), bind=lambda algo, run: {},
    metrics=("actor/pg_clipfrac_higher", "actor/pg_clipfrac_lower"), check=_check,
))
