"""Rollout correction: weight (and mask) the loss by the trainer-vs-engine ratio, at token or sequence level.

The engine that samples (vLLM, in bf16, with its own kernels) does not give the tokens the
probabilities the trainer's ``pi_old`` gives them. With ``d_t = old_logp_t - engine_logp_t`` each
token's advantage is multiplied by a detached weight (:func:`dapo_exp.objective.rollout_correction_weights`):

- ``rc_level=token``: ``min(exp(d_t), rc_cap)`` (truncated IS, Yao et al. 2025; verl's ``tis_imp_ratio_cap``);
- ``rc_level=sequence``: one weight per response, ``min(exp(sum_t d_t), rc_cap)``
  (``rc_aggregation=product``, the sequence likelihood ratio, verl's Seq-TIS) or
  ``min(exp(mean_t d_t), rc_cap)`` (``geometric``, length-normalised); ``rc_cap=null``: weight 1;
- ``rc_band_low`` / ``rc_band_high`` (null: none): weight 0 for the tokens (token level) or whole
  responses (sequence level, by the same statistic) whose ratio lies outside the band, the form
  verl calls ``rollout_rs`` / IcePop (Ling team 2025: token band [0.5, 5], ``rollout_correction=icepop``).

Masked tokens stay in the normaliser (their weight is 0), as verl's IcePop; verl's ``rollout_rs``
also drops them from the normaliser. It fills the ``rollout_weight`` slot (the token-level weight with no
band is truncated importance sampling: one behaviour, one label). With an engine that reports no log-probs
(``rollout=hf``, which samples with the trainer's own weights) there is nothing to correct and the weight is 1.
"""

from __future__ import annotations

from typing import Any

from dapo_exp.errors import ConfigError
from dapo_exp.fixes.base import Fix, Key, binds, check_range, register_fix
from dapo_exp.fixes.verl_rules import RC, Rule, fail, read_by


def _check(algo, run):
    from dapo_exp.objective import ROLLOUT_CORRECTION_LEVELS, SEQUENCE_IS_AGGREGATIONS

    if algo.rc_level not in ROLLOUT_CORRECTION_LEVELS:
        raise ConfigError(f"algo.rc_level={algo.rc_level!r} is not valid; choose one of: "
                          f"{', '.join(ROLLOUT_CORRECTION_LEVELS)}")
    if algo.rc_aggregation not in SEQUENCE_IS_AGGREGATIONS:
        raise ConfigError(f"algo.rc_aggregation={algo.rc_aggregation!r} is not valid; choose one of: "
                          f"{', '.join(SEQUENCE_IS_AGGREGATIONS)}")
    check_range(algo, ("rc_cap", ">= 1 or null", lambda v: v is None or v >= 1))
    low, high = algo.rc_band_low, algo.rc_band_high
    if (low is None) != (high is None) or (low is not None and not 0 < low <= high):
        raise ConfigError(f"algo.rc_band_low / rc_band_high: need both null, or 0 < low <= high, got {low}, {high}")
    if algo.rollout_correction and algo.rc_cap is None and low is None:
        raise ConfigError("algo.rc_cap / rc_band_low: rollout_correction is on with neither a weight (rc_cap) nor a "
                          "band (rc_band_low, rc_band_high): it would change nothing")


def _verl(v: bool, ctx: Any) -> dict[str, Any]:
    """Our weight (+ band) as verl's decoupled rollout correction: rollout_is at our level, its threshold
    the cap (truncated IS) or ``"low_high"`` (IcePop: the raw ratio inside the band, 0 outside)."""
    if not v:
        return {}
    a = ctx.cfg.algo
    if a.rc_cap is None:
        fail("algo.rc_cap", None, "a band without a weight is verl's rollout_rs, which also drops the rejected "
             "tokens from the loss normaliser (ours weighs them 0); set algo.rc_cap >= algo.rc_band_high to "
             "translate the band as verl's IcePop")
    if a.rc_level == "sequence" and a.rc_aggregation != "product":
        fail("algo.rc_aggregation", a.rc_aggregation, "verl's rollout_is weights are the token ratio or the "
             "sequence product; the geometric mean is only a rejection statistic there (rollout_rs=seq_mean_k1)")
    if a.rc_band_low is None:
        return {RC + "rollout_is": a.rc_level, RC + "rollout_is_threshold": float(a.rc_cap)}
    if a.rc_cap < a.rc_band_high:
        fail("algo.rc_cap", a.rc_cap, f"verl's IcePop (rollout_is_threshold='low_high') keeps the raw ratio inside "
             f"the band; a cap below algo.rc_band_high={a.rc_band_high} has no counterpart")
    return {RC + "rollout_is": a.rc_level, RC + "rollout_is_threshold": f"{a.rc_band_low}_{a.rc_band_high}"}

FIX = register_fix(Fix(
    name="rollout_correction", short="rc", title="Rollout correction (sequence-level IS, band masking)",
    paper="verl rollout correction (Liu et al. 2025), IcePop (Ling team 2025)",
    schema=(
        Key("rollout_correction", bool, False,
            'rollout correction: weight (and band-mask) the tokens by the trainer/engine ratio'),
        Key("rc_level", str, "sequence", 'level of the weight: token | sequence (one weight per response)'),
        Key("rc_aggregation", str, "product",
            'sequence weight: product (the likelihood ratio, verl Seq-TIS) | geometric (per-token geometric mean)'),
        Key("rc_cap", float | None, 2.0,
            "truncation of the weight, null = no weight (band only) (verl's default: 2)"),
        Key("rc_band_low", float | None, None,
            "weight 0 outside [low, high] of the same level's ratio, null = no band (IcePop: 0.5 / 5)"),
        Key("rc_band_high", float | None, None,
            "weight 0 outside [low, high] of the same level's ratio, null = no band (IcePop: 0.5 / 5)"),
    ),
    is_on=lambda a: bool(a.rollout_correction), slots=("rollout_weight",), check=_check,
    bind=binds("rollout_weight", "rollout_correction_weights", level="rc_level", aggregation="rc_aggregation",
               cap="rc_cap", band_low="rc_band_low", band_high="rc_band_high"),
    metrics=("actor/rollout_weight_mean", "actor/rollout_weight_zero_frac"),
    options=("disabled", "enabled", "icepop"),
    verl={"rollout_correction": Rule(f"`{RC}rollout_is` = `algo.rc_level`, `{RC}rollout_is_threshold` = "
                                     "`algo.rc_cap`, or `'<rc_band_low>_<rc_band_high>'` with a band (IcePop; needs "
                                     "rc_cap >= rc_band_high); a band without a weight and the geometric sequence "
                                     "weight fail", _verl),
          **read_by("rollout_correction", "rc_level", "rc_aggregation", "rc_cap", "rc_band_low", "rc_band_high")},
))
