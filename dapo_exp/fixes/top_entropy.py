"""Top-entropy tokens (Wang et al. 2025, "Beyond the 80/20 Rule"): the policy gradient of the forking tokens only.

Only the tokens whose entropy is in the top ``top_entropy_rho`` (paper: 0.2) of the mini-batch's
response tokens carry a policy-gradient term; the rest are masked out of the numerator, while the
normaliser still counts every token of the loss mask (the paper's Eq. and TRL's
``top_entropy_quantile``: a masked token weighs 0, it does not shrink the denominator). It fills the
``update_mask`` slot with :func:`dapo_exp.objective.top_entropy_mask`: the entropy is that of the
policy being updated, from a no-grad forward of the whole mini-batch before its gradient passes (so
the threshold is the mini-batch's, whatever its split into micro-batches; one extra forward per
mini-batch). The mask is an indicator: no gradient flows through the entropy.

GMPO, and GSPO in its sequence form, write one sequence loss on every token, whose gradient reaches
every token of the response whichever copies are kept: masking tokens there selects nothing, so
those combinations are refused.
"""

from __future__ import annotations

import functools
from typing import Any

from dapo_exp.errors import ConfigError
from dapo_exp.fixes.base import Fix, Key, check_range, register_fix
from dapo_exp.fixes.verl_rules import Rule, fail, read_by


def _mask(entropy, mask, *, rho):
    from dapo_exp import objective

    return objective.top_entropy_mask(entropy, mask, rho=rho)


def _check(algo, run):
    check_range(algo, ("top_entropy_rho", "in (0, 1]", lambda v: 0 < v <= 1))
    if algo.top_entropy and algo.gspo and algo.gspo_form == "sequence":
        raise ConfigError("fixes gspo and top_entropy cannot be combined with algo.gspo_form=sequence (one sequence "
                          "loss on every token: masking tokens selects no gradient); use algo.gspo_form=token or "
                          "switch one off (gspo=disabled or top_entropy=disabled)")


def _top_entropy_verl(v: bool, ctx: Any) -> dict[str, Any]:
    if v:
        fail("algo.top_entropy", v, "verl's actor has no entropy mask on the policy loss (its entropy keys are "
             "entropy_coeff and calculate_entropy; the mask exists in TRL as top_entropy_quantile)")
    return {}

FIX = register_fix(Fix(
    name="top_entropy", short="ent", title="Top-entropy tokens",
    paper="Beyond the 80/20 Rule §4, Eq. 3",
    schema=(
        Key("top_entropy", bool, False,
            "top-entropy tokens: the policy gradient only on the top rho of the mini-batch's tokens by entropy, the rest masked out of the numerator (Wang et al. 2025)"),
        Key("top_entropy_rho", float, 0.2, 'share of tokens kept (paper: 0.2)'),
    ), is_on=lambda a: bool(a.top_entropy),
    slots=("update_mask",), bind=lambda algo, run: {"update_mask": functools.partial(_mask, rho=algo.top_entropy_rho)},
    check=_check, excludes=("gmpo",),
    metrics=("actor/update_mask_kept_frac", "actor/update_mask_entropy_min"),
    verl={"top_entropy": Rule("none (only `false`: verl 0.9.1 has no entropy mask on the policy loss)",
                              _top_entropy_verl),
          **read_by("top_entropy", "top_entropy_rho")},
))
