"""The one registry of the DAPO fixes: what each switch is called, what it sets, what it selects.

Every place that needs to know "which fixes exist" reads :data:`FIXES`: the run
labels and W&B tags (:func:`switches`, :func:`label`), the analysis (column names,
ladder order: :data:`PRESETS`, :data:`LADDER`), the presets check (a test composes
every ``conf/fixes/*.yaml`` and reads its switches through this table), and the
backends that translate the fixes to another engine's config (``Fix.keys``).

A fix is *on* according to the values it sets in ``algo`` (``Fix.is_on``), never
according to the name of the preset a run was launched from: ``fixes=full
clip_higher=disabled`` is the leave-one-out ``full_no_clip`` and is labelled so.

Adding a fix (README, "Where to add a fix"): one :class:`Fix` entry here (or
:func:`register_fix` from your own code), the code it switches (a reward shaping term,
a loss, a mask: see :mod:`dapo_exp.algorithms`), and a config group
``conf/<name>/{disabled,enabled}.yaml`` setting its ``algo`` keys. Keys of fixes
registered outside the package live under ``algo.ext`` (an open dict).

This module imports nothing of the project (the bottom layer, beside
:mod:`dapo_exp.objective` and :mod:`dapo_exp.config`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping


@dataclass(frozen=True)
class Fix:
    """One switchable fix."""

    name: str  # switch name = config group under conf/ = key in summary.json's "switches"
    short: str  # token in run labels ("clip+ds")
    title: str  # as the paper names it
    paper: str  # where the paper defines it
    keys: tuple[str, ...]  # the algo keys its config group sets (what a backend must translate)
    is_on: Callable[[Any], bool]  # algo config -> is the fix on?
    objective: tuple[str, ...]  # the functions of dapo_exp.objective it selects
    metrics: tuple[str, ...]  # its diagnostic metrics (README "Metrics")
    doc: str = ""
    options: tuple[str, ...] = field(default=("disabled", "enabled"))  # its config group's options


FIXES: dict[str, Fix] = {}


def register_fix(fix: Fix) -> Fix:
    """Add ``fix`` to :data:`FIXES` (its name must be new). Returns it."""
    if fix.name in FIXES:
        raise ValueError(f"fix {fix.name!r} is already registered")
    if any(f.short == fix.short for f in FIXES.values()):
        raise ValueError(f"short label {fix.short!r} of fix {fix.name!r} is already taken")
    FIXES[fix.name] = fix
    return fix


def unregister_fix(name: str) -> None:
    """Remove an extension fix (tests use it to undo :func:`register_fix`)."""
    FIXES.pop(name, None)


register_fix(Fix(
    name="clip_higher", short="clip", title="Clip-Higher", paper="§3.1, Eq. 10",
    keys=("eps_low", "eps_high"), is_on=lambda a: a.eps_high > a.eps_low,
    objective=("clipped_surrogate",), metrics=("actor/pg_clipfrac_higher", "actor/pg_clipfrac_lower"),
    doc="decoupled clip range, eps_high 0.28 > eps_low 0.2",
))
register_fix(Fix(
    name="dynamic_sampling", short="ds", title="Dynamic Sampling", paper="§3.2, Eq. 11",
    keys=("dynamic_sampling", "ds_signal", "ds_max_rounds", "ds_on_cap", "ds_surplus", "ds_oversample"),
    is_on=lambda a: bool(a.dynamic_sampling),
    objective=("dynamic_sampling_keep",),
    metrics=("dynamic_sampling/zero_var_frac", "dynamic_sampling/rollouts_per_trained",
             "actor/zero_adv_token_frac"),
    doc="keep only groups with 0 < #correct < G, refill the batch",
))
register_fix(Fix(
    name="token_level_loss", short="tl", title="Token-level Policy Gradient Loss", paper="§3.3, Eq. 12",
    keys=("loss_agg",), is_on=lambda a: a.loss_agg != "seq-mean-token-mean",
    objective=("loss_normaliser",), metrics=("actor/entropy", "response_length/mean"),
    doc="every token of the mini-batch weighs the same (loss_agg token-mean)",
))
register_fix(Fix(
    name="overlong_punishment", short="sop", title="Soft Overlong Punishment", paper="§3.4, Eq. 13",
    keys=("overlong_punishment", "overlong_cache_len", "overlong_factor", "overlong_max_len"),
    is_on=lambda a: a.overlong_punishment != "none",
    objective=("overlong_punishment",), metrics=("reward/overlong_penalty_mean", "response_length/clip_ratio"),
    doc="length-aware reward term before the cap",
    options=("disabled", "soft", "linear_ramp", "beyond_max"),
))
register_fix(Fix(
    name="overlong_filtering", short="of", title="Overlong Filtering", paper="§3.4, Table 1 row 2",
    keys=("overlong_filtering",), is_on=lambda a: bool(a.overlong_filtering),
    objective=("overlong_filtering",), metrics=("actor/masked_token_frac",),
    doc="truncated responses leave the loss",
))


# The presets of conf/fixes/, in display order (tables, legends). Their switch states
# are not written here: they are whatever the YAML composes to (a test checks every
# file against this list and the ladder's one-fix-per-row structure).
PRESETS: tuple[str, ...] = (
    "grpo", "clip", "clip_ds", "full",
    "full_no_clip", "full_no_ds", "full_no_tl", "full_no_sop",
    "paper_1_grpo", "paper_2_of", "paper_3_clip", "paper_4_sop", "paper_5_tl", "paper_6_dapo",
)
# Table 1 of the paper: each row adds one fix to the row above.
LADDER: tuple[str, ...] = tuple(p for p in PRESETS if p.startswith("paper_"))
BASELINE = "grpo"  # the preset every other one is compared with (no fix on)


def switch_names() -> tuple[str, ...]:
    """The names of the registered fixes, in registry order."""
    return tuple(FIXES)


def switches(algo: Any) -> dict[str, bool]:
    """``{fix name: on?}`` of an ``algo`` config, read from its values."""
    return {name: bool(f.is_on(algo)) for name, f in FIXES.items()}


def label(state: Mapping[str, bool], preset: str | None = None,
          preset_states: Mapping[str, Mapping[str, bool]] | None = None) -> str:
    """A readable label for a switch state.

    ``preset`` (the ``fixes=`` preset the run was launched from) when its own switch
    state (``preset_states[preset]``) equals ``state``; else the first preset of
    :data:`PRESETS` with that state; else the short names of the fixes that are on,
    joined by ``+`` (``grpo`` when none is).
    """
    states = preset_states or {}
    if preset in states and dict(states[preset]) == dict(state):
        return str(preset)
    for name in PRESETS:
        if name in states and dict(states[name]) == dict(state):
            return name
    return "+".join(FIXES[k].short for k, on in state.items() if on and k in FIXES) or BASELINE
