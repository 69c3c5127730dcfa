"""KL-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs", §4): a KL penalty on the top-covariance tokens.

The policy-gradient loss of every token, plus ``kl_cov_coef * |logp - old_logp|`` on the share
``kl_cov_ratio`` (paper: 2e-4) of the batch's tokens with the largest covariance between
advantage and log-probability (the tokens that drive entropy down). No ratio clip: Clip-Higher's
range has nothing to act on, so the two exclude each other. It fills the ``surrogate`` slot with
:func:`dapo_exp.objective.kl_cov_surrogate` (coefficient 1, the authors' scripts; verl's default
is 0.1), and logs the tokens it penalised per optimizer step (``kl_cov/penalised_tokens``).
"""

from __future__ import annotations

from dapo_exp.fixes.base import Fix, Key, binds, check_range, logs_selected, register_fix
from dapo_exp.fixes.verl_rules import A, Rule, read_by, surrogate

FIX = register_fix(Fix(
    name="kl_cov", short="klcov", title="KL-Cov", paper="Entropy Mechanism §4.2, Eq. 12",
    schema=(
        Key("kl_cov", bool, False,
            'KL-Cov: kappa |logp - old_logp| on the top share of tokens by covariance (Cui et al. 2025)'),
        Key("kl_cov_ratio", float, 2e-4,
            "share of tokens penalised (paper: 2e-4) and kappa (authors' scripts: 1; verl's default 0.1)"),
        Key("kl_cov_coef", float, 1.0,
            "share of tokens penalised (paper: 2e-4) and kappa (authors' scripts: 1; verl's default 0.1)"),
    ), is_on=lambda a: bool(a.kl_cov),
    slots=("surrogate",),
    bind=logs_selected(binds("surrogate", "kl_cov_surrogate", k_ratio="kl_cov_ratio", kl_coef="kl_cov_coef"),
                       "kl_cov/penalised_tokens"),
    check=lambda algo, run: check_range(algo, ("kl_cov_ratio", "in [0, 1]", lambda v: 0 <= v <= 1),
                                        ("kl_cov_coef", ">= 0", lambda v: v >= 0)),
    excludes=("clip_higher",), metrics=("actor/entropy", "kl_cov/penalised_tokens"),
    verl={"kl_cov": Rule(f"`{A}policy_loss.loss_mode=kl_cov` + `policy_loss.kl_cov_ratio`, `policy_loss.ppo_kl_coef`",
                         surrogate("kl_cov", extra=lambda a: {A + "policy_loss.kl_cov_ratio": a.kl_cov_ratio,
                                                              A + "policy_loss.ppo_kl_coef": a.kl_cov_coef})),
          **read_by("kl_cov", "kl_cov_ratio", "kl_cov_coef")},
))
