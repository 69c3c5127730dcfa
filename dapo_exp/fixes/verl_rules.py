"""How a fix reaches verl: the rule of each of its ``algo`` keys, declared in the fix's own module (``Fix.verl``).

Pure data and functions, no verl import (verl lives in its own virtualenv): a :class:`Rule` maps a key's
value, read in a :class:`Context` (the whole config, the run directory, the label, and the backend's own
names), to ``{verl key: value}`` or raises :class:`Untranslatable` naming the key and why.
:mod:`dapo_exp.backends.verl` applies every fix's rules through the registry (and its own for the keys no
fix owns); the builders here (:func:`to`, :func:`unused`, :func:`on`) are shared by both. Written against
verl 0.9.1 (:data:`VERL_VERSION`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from dapo_exp.errors import ConfigError

VERL_VERSION = "0.9.1"
A = "actor_rollout_ref.actor."  # verl's actor config
R = "actor_rollout_ref.rollout."  # its rollout config
OB = "+reward.reward_kwargs.overlong_buffer_cfg."  # the DAPO reward manager's overlong buffer
FG = "algorithm.filter_groups."  # the V1 replay buffer's group filter
RC = "algorithm.rollout_correction."  # decoupled rollout correction


class Untranslatable(ConfigError):
    """A config value has no verl counterpart; the message names the key and says why."""


@dataclass(frozen=True)
class Context:
    """What the rules read besides the value: the whole config, the run directory, the run label, and the names
    of the backend's own extension (the module verl's workers import, the agent loop it registers)."""

    cfg: Any
    out: str
    label: str
    ext_module: str = ""
    agent_loop: str = ""


@dataclass(frozen=True)
class Rule:
    """How one dapo-exp key reaches verl.

    ``verl``: the translation table's column (docs/reference/verl.md: verl keys, or what happens); ``fn(value, ctx)``
    returns ``{verl key: value}`` (a key starting with ``$`` is an environment variable of the verl process;
    ``+key`` adds a key verl's config does not declare) or raises :class:`Untranslatable`.
    """

    verl: str
    fn: Callable[[Any, Context], dict[str, Any]]
    default_only: bool = False  # a native-only knob: its default is accepted, any other value fails


def fail(path: str, value: Any, why: str) -> NoReturn:
    raise Untranslatable(f"{path}={value!r} has no verl {VERL_VERSION} counterpart: {why}")


def to(*keys: str) -> Rule:
    """The value, as it is, to each of ``keys``."""
    return Rule(", ".join(f"`{k}`" for k in keys), lambda v, ctx: {k: v for k in keys})


def unused(why: str) -> Rule:
    """A key that is not read in this configuration (as in the native trainer), or is only recorded."""
    return Rule(f"none: {why}", lambda v, ctx: {})


def on(ctx: Context, *names: str) -> bool:
    """Is any of the fixes ``names`` on in this config?"""
    from dapo_exp.fixes.base import FIXES, is_on

    return any(is_on(FIXES[n], ctx.cfg.algo) for n in names if n in FIXES)


def when(switch: Callable[[Any], bool], rule: Callable[[Any, Context], dict[str, Any]]) -> Callable[[Any, Context],
                                                                                                  dict[str, Any]]:
    """A setting of a fix read only when ``switch(algo)`` says it is on (as natively)."""
    return lambda v, ctx: rule(v, ctx) if switch(ctx.cfg.algo) else {}


def surrogate(mode: str, low: str | None = None, high: str | None = None,
              extra: Callable[[Any], dict[str, Any]] = lambda a: {}) -> Callable[[Any, Context], dict[str, Any]]:
    """A surrogate fix's switch: verl's loss_mode, its clip range from ``algo.<low>`` / ``algo.<high>``."""
    def fn(v: bool, ctx: Context) -> dict[str, Any]:
        if not v:
            return {}
        a = ctx.cfg.algo
        rng = {A + "clip_ratio_low": a[low], A + "clip_ratio_high": a[high]} if low else {}
        return {A + "policy_loss.loss_mode": mode, **rng, **extra(a)}
    return fn


def read_by(switch: str, *keys: str) -> dict[str, Rule]:
    """``{key: unused}`` for settings that ``switch``'s own rule reads."""
    return {k: unused(f"read by algo.{switch}'s rule") for k in keys}
