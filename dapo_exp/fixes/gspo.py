"""GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): a clipped sequence-level ratio.

The importance ratio of a response is the geometric mean of its token ratios,
``s_i = exp(mean_t (logp - old_logp))``, clipped to ``[1 - eps_low, 1 + eps_high]`` (the paper:
3e-4 / 4e-4, far narrower than a token clip). ``gspo_form=token`` is GSPO-token, the form verl
implements (same loss and gradient with one advantage per response); ``sequence`` is the paper's
Eq. 5. It fills the ``surrogate`` slot with :func:`dapo_exp.objective.gspo_surrogate`, so it
excludes the other surrogates, and Clip-Higher (whose range it does not use).
"""

from __future__ import annotations

from typing import Any

from dapo_exp.errors import ConfigError
from dapo_exp.fixes.base import Fix, Key, binds, check_range, register_fix
from dapo_exp.fixes.verl_rules import A, Rule, fail, read_by, surrogate


def _check(algo, run):
    from dapo_exp.objective import GSPO_FORMS

    if algo.gspo_form not in GSPO_FORMS:
        raise ConfigError(f"algo.gspo_form={algo.gspo_form!r} is not valid; choose one of: {', '.join(GSPO_FORMS)}")
    check_range(algo, ("gspo_eps_low", "in [0, 1)", lambda v: 0 <= v < 1), ("gspo_eps_high", ">= 0", lambda v: v >= 0))


def _gspo_form(v: str, ctx: Any) -> dict[str, Any]:
    if ctx.cfg.algo.gspo and v != "token":
        fail("algo.gspo_form", v, "verl 0.9.1's gspo is the token form (GSPO-token); use algo.gspo_form=token")
    return {}

FIX = register_fix(Fix(
    name="gspo", short="gspo", title="GSPO", paper="GSPO §4, Eqs. 5-7 and 10-11",
    schema=(
        Key("gspo", bool, False, 'GSPO: the clipped sequence-level ratio (Zheng et al. 2025)'),
        Key("gspo_eps_low", float, 3e-4, "GSPO's clip range of the sequence ratio (paper: 3e-4 / 4e-4)"),
        Key("gspo_eps_high", float, 4e-4, "GSPO's clip range of the sequence ratio (paper: 3e-4 / 4e-4)"),
        Key("gspo_form", str, "token",
            "token (GSPO-token, as verl) | sequence (the paper's Eq. 5); equal with one advantage per response"),
    ), is_on=lambda a: bool(a.gspo),
    slots=("surrogate",), bind=binds("surrogate", "gspo_surrogate", eps_low="gspo_eps_low", eps_high="gspo_eps_high",
                                     form="gspo_form"),
    check=_check, excludes=("clip_higher",),
    metrics=("actor/pg_clipfrac_higher", "actor/pg_clipfrac_lower", "actor/ppo_ratio_mean"),
    verl={"gspo": Rule(f"`{A}policy_loss.loss_mode=gspo`, `{A}clip_ratio_low/high` = `algo.gspo_eps_low/high`",
                       surrogate("gspo", "gspo_eps_low", "gspo_eps_high")),
          **read_by("gspo", "gspo_eps_low", "gspo_eps_high"),
          "gspo_form": Rule("none (only `token`: verl's gspo is GSPO-token)", _gspo_form)},
))
