"""Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs", §4): detach a few high-covariance tokens.

Entropy falls where a token's log-probability and its advantage covary. Clip-Cov computes the
per-token covariance ``(A_t - mean A)(logp_t - mean logp)`` over the batch's tokens and detaches
(no gradient) a random share ``clip_cov_ratio`` (paper: 2e-4) of the tokens whose covariance lies
in ``[clip_cov_lb, clip_cov_ub]`` (1, 5); the rest is PPO's clipped surrogate with the run's
``eps_low`` / ``eps_high`` (so Clip-Higher combines with it). It fills the ``surrogate`` slot with
:func:`dapo_exp.objective.clip_cov_surrogate`. The random choice draws from torch's global generator:
seeded by the run's seed at its start and saved in every checkpoint (:func:`dapo_exp.checkpoint.rng_state`),
so a killed and resumed run draws the same tokens as an uninterrupted one (an exact resume; a private
generator re-seeded at each start would not be).
"""

from __future__ import annotations

import functools

from dapo_exp.config import ConfigError
from dapo_exp.fixes.base import Fix, register_fix


def _bind(algo, run):
    from dapo_exp import objective

    return {"surrogate": functools.partial(  # generator=None: the global one, checkpointed with the run
        objective.clip_cov_surrogate, generator=None, eps_low=algo.eps_low,
        eps_high=algo.eps_high, clip_ratio=algo.clip_cov_ratio, cov_lb=algo.clip_cov_lb, cov_ub=algo.clip_cov_ub)}


def _check(algo, run):
    if not (0 <= algo.clip_cov_ratio <= 1 and algo.clip_cov_lb <= algo.clip_cov_ub):
        raise ConfigError(f"algo.clip_cov_ratio / clip_cov_lb / clip_cov_ub: need 0 <= ratio <= 1 and lb <= ub, got "
                          f"{algo.clip_cov_ratio}, {algo.clip_cov_lb}, {algo.clip_cov_ub}")


FIX = register_fix(Fix(
    name="clip_cov", short="ccov", title="Clip-Cov", paper="Entropy Mechanism §4.2, Eq. 11",
    keys=("clip_cov", "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub"), is_on=lambda a: bool(a.clip_cov),
    slots=("surrogate",), bind=_bind, check=_check, metrics=("actor/entropy",),
))
