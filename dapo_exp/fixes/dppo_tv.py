"""DPPO-Binary-TV (Qi et al. 2026, "Rethinking the Trust Region in LLM Reinforcement Learning", arXiv 2602.04879).

PPO's trust region is a ratio clip; DPPO's is a bound on an estimate of the policy's divergence. In
its binary total-variation form a token's update is dropped (masked, no gradient) once its probability
has moved past the bound *in the advantage's direction*: ``p - p_old > dppo_tv_high`` where ``A > 0``,
``p - p_old < -dppo_tv_low`` where ``A <= 0`` (``p = exp(logp)``). The kept tokens carry the
importance-weighted policy gradient ``l_t = -A_t sg(min(r_t, cap)) logp_t``, the weight truncated at
``dppo_tv_cap`` (truncated importance sampling instead of PPO's dual clip). Thresholds 0.15 / 0.15: the
authors' script in verl (``examples/dppo_trainer``); the cap 20 is the fallback in verl's function
(``config.get("clip_ratio_c", 20.0)``: verl's actor config always has the key, default 3, and our rule sets it
to the cap); the authors' script sets 1e4, no truncation, for its comparison with GRPO, and the paper (§5.4)
recommends a large cap.

It fills the ``surrogate`` slot with :func:`surrogate` and logs ``dppo/masked_tokens``, the loss-mask tokens
per optimizer step whose update it drops. The thresholds are the loss's own (verl's ``clip_ratio_low/high``,
:data:`dapo_exp.fixes.grpo.OWN_RANGE`) and its cap is verl's ``clip_ratio_c``: it excludes Clip-Higher
and refuses GRPO's dual clip (``algo.dual_clip`` must be null), which it does not apply.
"""

from __future__ import annotations

import functools
from typing import Any

from dapo_exp.errors import ConfigError
from dapo_exp.fixes.base import Fix, Key, RunInfo, check_range, logs_selected, register_fix
from dapo_exp.fixes.verl_rules import A, Rule, read_by
from dapo_exp.fixes.verl_rules import surrogate as verl_surrogate


def truncated_pg(logp: Any, old_logp: Any, adv: Any, valid: Any, cap: float) -> Any:
    """DPPO's loss on the tokens ``valid`` (bool ``(B, T)``) keeps: ``-A sg(min(r, cap)) logp``, 0 elsewhere
    (no gradient); the :class:`dapo_exp.objective.SurrogateOut` with ``clipped_high`` / ``clipped_low`` the
    dropped tokens with ``A > 0`` / ``A < 0``, ``selected`` every dropped token."""
    import torch

    from dapo_exp.objective import LOG_RATIO_GUARD, SurrogateOut

    ratio = torch.exp((logp - old_logp).clamp(-LOG_RATIO_GUARD, LOG_RATIO_GUARD))
    weight = ratio.clamp(max=cap).detach()
    loss = -adv * weight * logp * valid.to(logp.dtype)
    dropped = ~valid
    return SurrogateOut(loss, ratio, dropped & (adv > 0), dropped & (adv < 0), torch.zeros_like(dropped),
                        selected=dropped)


def surrogate(logp: Any, old_logp: Any, advantages: Any, *, mask: Any = None, low: float = 0.15,
              high: float = 0.15, cap: float = 20.0) -> Any:
    """DPPO-Binary-TV's per-token loss (verl ``compute_policy_loss_dppo_tv``): a token is kept where
    ``p - p_old <= high`` (``A > 0``) or ``p - p_old >= -low`` (``A <= 0``); see :func:`truncated_pg`."""
    import torch

    from dapo_exp.objective import _token_advantages

    adv = _token_advantages(advantages, logp)
    with torch.no_grad():
        moved = torch.exp(logp) - torch.exp(old_logp)
        valid = torch.where(adv > 0, moved <= high, moved >= -low)
    return truncated_pg(logp, old_logp, adv, valid, cap)


def check(algo: Any, run: RunInfo, name: str) -> None:
    """A DPPO switch's values: thresholds >= 0, cap > 0, and no dual clip (DPPO truncates instead)."""
    check_range(algo, *((f"{name}_{k}", ">= 0", lambda v: v >= 0) for k in ("low", "high")),
                (f"{name}_cap", "> 0", lambda v: v > 0))
    if getattr(algo, name) and algo.dual_clip is not None:
        raise ConfigError(f"algo.dual_clip={algo.dual_clip}: {name} applies no dual clip (it truncates the ratio at "
                          f"algo.{name}_cap, verl's clip_ratio_c); set algo.dual_clip=null")


def rule(name: str) -> Rule:
    """A DPPO switch's verl rule: its loss_mode, bounds as clip_ratio_low/high, cap as clip_ratio_c."""
    return Rule(f"`{A}policy_loss.loss_mode={name}`, `{A}clip_ratio_low/high` = `algo.{name}_low/high`, "
                f"`{A}clip_ratio_c` = `algo.{name}_cap`",
                verl_surrogate(name, f"{name}_low", f"{name}_high",
                               extra=lambda a: {A + "clip_ratio_c": float(a[f"{name}_cap"])}))


def register(name: str, short: str, title: str, surrogate: Any, measure: str, sides: str, bounds: float) -> Fix:
    """Register a DPPO switch ``name``: its surrogate (``low``, ``high``, ``cap`` from ``algo.<name>_*``), its keys
    (``measure``: what its bounds bound, ``sides``: where each applies; ``bounds``: the authors' value of both, in
    verl's examples/dppo_trainer), the masked-token metric, its checks and its verl rule."""

    def bind(algo: Any, run: RunInfo) -> dict[str, Any]:
        return {"surrogate": functools.partial(surrogate, low=algo[f"{name}_low"], high=algo[f"{name}_high"],
                                               cap=algo[f"{name}_cap"])}

    bound_doc = f"{title}'s bounds on {measure}: {sides} (authors' script: {bounds} / {bounds})"
    return register_fix(Fix(
        name=name, short=short, title=title, paper=f"DPPO (arXiv 2602.04879), verl loss_mode={name}",
        schema=(
            Key(name, bool, False, f"{title}: drop a token's update once {measure} passes a bound (Qi et al. 2026)"),
            Key(f"{name}_low", float, bounds, bound_doc),
            Key(f"{name}_high", float, bounds, bound_doc),
            Key(f"{name}_cap", float, 20.0, f"{title}'s truncation of the detached ratio (20: verl's function's "
                                            "fallback; its actor's clip_ratio_c default 3; the authors' script 1e4)"),
        ), is_on=lambda a: bool(a[name]), slots=("surrogate",),
        bind=logs_selected(bind, "dppo/masked_tokens"),
        check=lambda algo, run: check(algo, run, name),
        excludes=("clip_higher",),
        why_excluded=(("clip_higher", f"DPPO's bounds are on the probability's divergence, its own "
                                      f"(algo.{name}_low/high), not PPO's ratio range"),),
        metrics=("dppo/masked_tokens", "actor/pg_clipfrac_higher", "actor/pg_clipfrac_lower"),
        verl={name: rule(name), **read_by(name, f"{name}_low", f"{name}_high", f"{name}_cap")},
    ))


FIX = register("dppo_tv", "dppotv", "DPPO-Binary-TV", surrogate, "p - p_old", "-low where A <= 0, high where A > 0",
               0.15)
