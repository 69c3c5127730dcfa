"""Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs", §4): detach a few high-covariance tokens.

Entropy falls where a token's log-probability and its advantage covary. Clip-Cov computes the
per-token covariance ``(A_t - mean A)(logp_t - mean logp)`` over the batch's tokens and detaches
(no gradient) a random share ``clip_cov_ratio`` (paper: 2e-4) of the tokens whose covariance lies
in ``[clip_cov_lb, clip_cov_ub]`` (1, 5); the rest is PPO's clipped surrogate with the run's
``eps_low`` / ``eps_high`` (so Clip-Higher combines with it). It fills the ``surrogate`` slot with
:func:`dapo_exp.objective.clip_cov_surrogate`, and logs the tokens it detached per optimizer step
(``clip_cov/detached_tokens``). The random choice draws from torch's global generator:
seeded by the run's seed at its start and saved in every checkpoint (:func:`dapo_exp.checkpoint.rng_state`),
so a killed and resumed run draws the same tokens as an uninterrupted one (an exact resume; a private
generator re-seeded at each start would not be).
"""

from __future__ import annotations

from dapo_exp.errors import ConfigError
from dapo_exp.fixes.base import Fix, Key, binds, check_range, logs_selected, register_fix
from dapo_exp.fixes.verl_rules import A, Rule, read_by, surrogate


def _check(algo, run):
    check_range(algo, ("clip_cov_ratio", "in [0, 1]", lambda v: 0 <= v <= 1))
    if algo.clip_cov_lb > algo.clip_cov_ub:
        raise ConfigError(f"algo.clip_cov_lb / clip_cov_ub: need lb <= ub, got {algo.clip_cov_lb}, {algo.clip_cov_ub}")


FIX = register_fix(Fix(
    name="clip_cov", short="ccov", title="Clip-Cov", paper="Entropy Mechanism §4.2, Eq. 11",
    schema=(
        Key("clip_cov", bool, False,
            'Clip-Cov: detach a random share of tokens with covariance in [lb, ub] (Cui et al. 2025)'),
        Key("clip_cov_ratio", float, 2e-4, 'share of tokens detached, and the covariance band (paper: 2e-4, 1, 5)'),
        Key("clip_cov_lb", float, 1.0, 'share of tokens detached, and the covariance band (paper: 2e-4, 1, 5)'),
        Key("clip_cov_ub", float, 5.0, 'share of tokens detached, and the covariance band (paper: 2e-4, 1, 5)'),
    ), is_on=lambda a: bool(a.clip_cov),
    slots=("surrogate",), check=_check, metrics=("actor/entropy", "clip_cov/detached_tokens"),
    # no generator bound: the global one, checkpointed with the run
    bind=logs_selected(binds("surrogate", "clip_cov_surrogate", eps_low="eps_low", eps_high="eps_high",
                             clip_ratio="clip_cov_ratio", cov_lb="clip_cov_lb", cov_ub="clip_cov_ub"),
                       "clip_cov/detached_tokens"),
    verl={"clip_cov": Rule(f"`{A}policy_loss.loss_mode=clip_cov` + `policy_loss.clip_cov_ratio/lb/ub`",
                           surrogate("clip_cov", extra=lambda a: {A + "policy_loss.clip_cov_ratio": a.clip_cov_ratio,
                                                                  A + "policy_loss.clip_cov_lb": a.clip_cov_lb,
                                                                  A + "policy_loss.clip_cov_ub": a.clip_cov_ub})),
          **read_by("clip_cov", "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub")},
))
