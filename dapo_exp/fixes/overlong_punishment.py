"""Soft Overlong Punishment (DAPO §3.4, Eq. 13): a length-aware reward term before the cap.

``0`` up to ``L_max - L_cache``, a linear ramp to ``-1`` at ``L_max``, ``-1`` beyond, times
``overlong_factor``, added to the correctness reward. It fills the ``reward`` slot with
:func:`dapo_exp.objective.overlong_punishment`; ``algo.overlong_punishment`` also offers the
seed documents' readings (``linear_ramp``, ``beyond_max``), which are not the paper's.
``L_max`` is ``algo.overlong_max_len``, or the generation cap when null (:func:`l_max`, the
one place that fallback is resolved).
"""

from __future__ import annotations

import functools
from typing import Any

from dapo_exp import rundir
from dapo_exp.errors import ConfigError
from dapo_exp.fixes.base import Fix, Judged, Key, Out, RunInfo, register_fix
from dapo_exp.fixes.verl_rules import OB, Rule, fail, when


def l_max(algo: Any, max_response_len: int) -> int:
    """``L_max`` of the term: ``algo.overlong_max_len``, null = the generation cap."""
    return algo.overlong_max_len if algo.overlong_max_len is not None else max_response_len


def _bind(algo: Any, run: RunInfo) -> dict:
    from dapo_exp import objective

    term = functools.partial(objective.overlong_punishment, max_len=l_max(algo, run.max_response_len),
                             cache_len=algo.overlong_cache_len, factor=algo.overlong_factor,
                             mode=algo.overlong_punishment)
    def reward(*, lengths, correct, texts):  # the paper's term reads the length alone
        values = term(lengths)
        return Out(values, {"overlong_punishment/punished_frac": float((values != 0).float().mean())})

    return {"reward": reward}


def _check(algo: Any, run: RunInfo) -> None:
    from dapo_exp.objective import OVERLONG_PUNISHMENT_MODES

    if algo.overlong_punishment not in OVERLONG_PUNISHMENT_MODES:
        raise ConfigError(f"algo.overlong_punishment={algo.overlong_punishment!r} is not valid; choose one of: "
                          f"{', '.join(OVERLONG_PUNISHMENT_MODES)}")
    max_len = l_max(algo, run.max_response_len)
    if max_len <= 0:
        raise ConfigError(f"algo.overlong_max_len: must be > 0, got {max_len}")
    if not 0 <= algo.overlong_cache_len <= max_len:
        raise ConfigError(f"algo.overlong_cache_len: must satisfy 0 <= cache_len <= max_len ({max_len}), "
                          f"got {algo.overlong_cache_len}")
    if algo.overlong_factor < 0:
        raise ConfigError(f"algo.overlong_factor: must be >= 0, got {algo.overlong_factor}")


def _punishment(v: str, ctx: Any) -> dict[str, Any]:
    if v == "none":
        return {OB + "enable": False}
    if v != "soft":
        fail("algo.overlong_punishment", v, "verl's DAPO reward manager implements Eq. 13 (soft) only")
    return {OB + "enable": True, OB + "log": True}


def _cache_len(v: int, ctx: Any) -> dict[str, Any]:
    if v <= 0:
        fail("algo.overlong_cache_len", v, "verl's overlong buffer needs len > 0")
    return {OB + "len": v}


def _overlong_max_len(v: int | None, ctx: Any) -> dict[str, Any]:
    cap = ctx.cfg.rollout.max_response_len
    if v is not None and v < cap:
        fail("algo.overlong_max_len", v, f"below the generation cap ({cap}) verl's penalty keeps falling past "
             "-factor instead of Eq. 13's -1; leave it null (= the cap)")
    return {"+reward.reward_kwargs.max_resp_len": l_max(ctx.cfg.algo, cap)}


def _on(algo: Any) -> bool:
    """Is the fix on? (its switch, and what its verl settings are read under)"""
    return algo.overlong_punishment != "none"

FIX = register_fix(Fix(
    name="overlong_punishment", short="sop", title="Soft Overlong Punishment", paper="DAPO §3.4, Eq. 13",
    schema=(
        Key("overlong_punishment", str, "none",
            'length reward term: none | soft (Eq. 13) | linear_ramp | beyond_max'),
        Key("overlong_cache_len", int, 16, 'L_cache in tokens, the ramp before L_max (paper: 4096)'),
        Key("overlong_factor", float, 1.0, 'scale of the length term (paper: 1.0)'),
        Key("overlong_max_len", int | None, None,
            'L_max of the length term in tokens; null = rollout.max_response_len (paper: 20480, the cap)'),
    ),
    is_on=_on, slots=("reward",), bind=_bind,
    metrics=("reward/overlong_penalty_mean", "overlong_punishment/punished_frac", "response_length/clip_ratio"),
    check=_check,
    options=("disabled", "soft", "linear_ramp", "beyond_max"),
    study=Judged("toy_overlong", (
        (f"avg/{rundir.TRUNC}", -1, "share of truncated samples (the soft ramp teaches to fit)"),
        ("avg/diag/trunc_on_path", -1, "share truncated while on a correct path"),
        ("avg/diag/style_step_long", +1, "step-by-step share on long problems: does it fit by shortening its "
                                         "reasoning (+) or by guessing (-)?")), arms=("disabled", "soft")),
    verl={
        "overlong_punishment": Rule(f"`reward.reward_manager.name=dapo`'s `{OB[1:]}enable` (+`log`; only `none`, "
                                    "`soft`)", _punishment),
        "overlong_cache_len": Rule(f"`{OB[1:]}len`", when(_on, _cache_len)),
        "overlong_factor": Rule(f"`{OB[1:]}penalty_factor`", when(_on, lambda v, ctx: {OB + "penalty_factor": v})),
        "overlong_max_len": Rule("`reward.reward_kwargs.max_resp_len` (null: `rollout.max_response_len`; below it "
                                 "fails)", when(_on, _overlong_max_len)),
    },
))
