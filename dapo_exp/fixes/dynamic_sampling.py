"""Dynamic Sampling (DAPO §3.2, Eq. 11): keep only groups with ``0 < #correct < G``, and refill.

A group whose responses are all right or all wrong has zero advantages and only dilutes
the batch. With the fix on, such groups are dropped and prompt batches are generated until
the batch holds ``train.prompts_per_step`` kept groups (the paper refills). It fills the
``group_filter`` slot: the predicate :func:`dapo_exp.objective.dynamic_sampling_keep` on
the filter signal (``ds_signal``: raw accuracy as verl, or the shaped reward), and the
refill policy (rounds of ``ds_oversample`` x the batch, at most ``ds_max_rounds``, then
``ds_on_cap``; surplus kept groups ``ds_surplus``: discarded as the paper, or carried).
"""

from __future__ import annotations

from typing import Any

from dapo_exp import rundir
from dapo_exp.errors import ConfigError
from dapo_exp.fixes.base import Fix, GroupFilter, Judged, Key, Out, RunInfo, register_fix
from dapo_exp.fixes.verl_rules import FG, Rule, fail, to, unused, when

SIGNALS = ("acc", "reward")
SURPLUS = ("discard", "carry")
ON_CAP = ("error", "partial")


def _bind(algo: Any, run: RunInfo) -> dict:
    from dapo_exp.objective import dynamic_sampling_keep

    use_acc = algo.ds_signal == "acc"

    def keep(correct, reward):  # Eq. 11 on the chosen signal; logs the share of the round's groups it dropped
        kept = dynamic_sampling_keep(correct if use_acc else reward)
        return Out(kept, {"dynamic_sampling/dropped_frac": 1.0 - float(kept.float().mean())})

    return {"group_filter": GroupFilter(
        keep=keep,
        max_rounds=algo.ds_max_rounds, on_cap=algo.ds_on_cap, surplus=algo.ds_surplus, oversample=algo.ds_oversample,
    )}


def _check(algo: Any, run: RunInfo) -> None:
    for key, choices in (("ds_signal", SIGNALS), ("ds_surplus", SURPLUS), ("ds_on_cap", ON_CAP)):
        if algo[key] not in choices:
            raise ConfigError(f"algo.{key}={algo[key]!r} is not valid; choose one of: {', '.join(choices)}")
    if algo.ds_max_rounds < 0:
        raise ConfigError(f"algo.ds_max_rounds: must be >= 0 (0 = unlimited), got {algo.ds_max_rounds}")
    if algo.ds_oversample < 1.0:
        raise ConfigError(f"algo.ds_oversample: must be >= 1, got {algo.ds_oversample}")
    if algo.dynamic_sampling and run.group_size < 2:
        raise ConfigError(f"rollout.n: dynamic sampling needs a group size >= 2 (a group of 1 is never mixed), "
                          f"got {run.group_size}")


def _ds_max_rounds(v: int, ctx: Any) -> dict[str, Any]:
    if v != 0:
        fail("algo.ds_max_rounds", v, "verl's V1 replay buffer refills without a cap (it ignores "
             "algorithm.filter_groups.max_num_gen_batches); set algo.ds_max_rounds=0 (conf/backend/verl.yaml does)")
    return {FG + "max_num_gen_batches": 0}


def _ds_oversample(v: float, ctx: Any) -> dict[str, Any]:
    if v != int(v):
        fail("algo.ds_oversample", v, "its closest counterpart, algorithm.filter_groups.max_inflight_gen_batches "
             "(prompts in flight, in train batches), is an integer")
    return {FG + "max_inflight_gen_batches": int(v)}


def _ds_surplus(v: str, ctx: Any) -> dict[str, Any]:
    if v != "discard":
        fail("algo.ds_surplus", v, "verl discards the kept groups beyond the batch")
    return {}


def _on(algo: Any) -> bool:
    """Is the fix on? (its switch, and what its verl settings are read under)"""
    return bool(algo.dynamic_sampling)

FIX = register_fix(Fix(
    name="dynamic_sampling", short="ds", title="Dynamic Sampling", paper="DAPO §3.2, Eq. 11",
    schema=(
        Key("dynamic_sampling", bool, False, 'keep only groups with 0 < #correct < G and refill (paper: on)'),
        Key("ds_signal", str, "acc", 'filter signal: acc (raw accuracy, verl) | reward (the shaped reward)'),
        Key("ds_max_rounds", int, 10,
            'generation rounds per step at most, 0 = unlimited (paper: no cap; released script: 10)'),
        Key("ds_on_cap", str, "error",
            'when the cap is hit: error (verl) | partial (train on the groups kept so far)'),
        Key("ds_surplus", str, "discard",
            'kept groups beyond the batch: discard (paper, verl) | carry (to the next step)'),
        Key("ds_oversample", float, 1.0,
            'prompts generated per round = ceil(prompts_per_step * ds_oversample) (released script: 3)'),
    ),
    is_on=_on, slots=("group_filter",), bind=_bind,
    metrics=("dynamic_sampling/dropped_frac", "dynamic_sampling/zero_var_frac", "dynamic_sampling/rollouts_per_trained",
             "actor/zero_adv_token_frac"),
    check=_check,
    study=Judged("toy_ds", (
        ("avg/actor/effective_batch_frac", +1, "share of trained responses with a non-zero advantage: 1 by "
                                               "construction when on (a sanity check)"),
        (f"avg/{rundir.ROLLOUTS_PER_TRAINED}", +1, "rollouts generated per trained rollout (its cost)"))),
    verl={
        "dynamic_sampling": to(FG + "enable"),
        "ds_signal": Rule(f"`{FG}metric` (acc: `acc`, the reward manager's accuracy; reward: `reward`, the shaped "
                          "score)", when(_on, lambda v, ctx: {FG + "metric": {"acc": "acc", "reward": "reward"}[v]})),
        "ds_max_rounds": Rule(f"`{FG}max_num_gen_batches=0` (only 0: verl 0.9.1 has no cap on refills)",
                              when(_on, _ds_max_rounds)),
        "ds_on_cap": unused("without a cap (ds_max_rounds=0) there is nothing to do at it"),
        "ds_surplus": Rule("none (only `discard`: verl discards surplus groups)", when(_on, _ds_surplus)),
        "ds_oversample": Rule(f"`{FG}max_inflight_gen_batches` (integers only; verl bounds the prompts in flight "
                              "instead of sizing rounds)", when(_on, _ds_oversample)),
    },
))
