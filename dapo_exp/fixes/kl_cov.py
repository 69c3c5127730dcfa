"""KL-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs", §4): a KL penalty on the top-covariance tokens.

The policy-gradient loss of every token, plus ``kl_cov_coef * |logp - old_logp|`` on the share
``kl_cov_ratio`` (paper: 2e-4) of the batch's tokens with the largest covariance between
advantage and log-probability (the tokens that drive entropy down). No ratio clip: Clip-Higher's
range has nothing to act on, so the two exclude each other. It fills the ``surrogate`` slot with
:func:`dapo_exp.objective.kl_cov_surrogate` (coefficient 1, the authors' scripts; verl's default
is 0.1).
"""

from __future__ import annotations

import functools

from dapo_exp.config import ConfigError
from dapo_exp.fixes.base import Fix, register_fix


def _bind(algo, run):
    from dapo_exp import objective

    return {"surrogate": functools.partial(objective.kl_cov_surrogate, k_ratio=algo.kl_cov_ratio,
                                           kl_coef=algo.kl_cov_coef)}


def _check(algo, run):
    if not (0 <= algo.kl_cov_ratio <= 1 and algo.kl_cov_coef >= 0):
        raise ConfigError(f"algo.kl_cov_ratio / kl_cov_coef: need 0 <= ratio <= 1 and coef >= 0, got "
                          f"{algo.kl_cov_ratio}, {algo.kl_cov_coef}")


FIX = register_fix(Fix(
    name="kl_cov", short="klcov", title="KL-Cov", paper="Entropy Mechanism §4.2, Eq. 12",
    keys=("kl_cov", "kl_cov_ratio", "kl_cov_coef"), is_on=lambda a: bool(a.kl_cov),
    slots=("surrogate",), bind=_bind, check=_check, excludes=("clip_higher",), metrics=("actor/entropy",),
))
