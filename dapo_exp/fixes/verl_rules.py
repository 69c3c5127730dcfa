"""How a fix reaches verl: the rule of each of its ``algo`` keys, declared in the fix's own module (``Fix.verl``).

Pure data and functions, no verl import (verl lives in its own virtualenv): a :class:`Rule` maps a key's
value, read in a :class:`Context` (the whole config, the run directory, the label, and the backend's own
names), to ``{verl key: value}`` or raises :class:`Untranslatable` naming the key and why.
:mod:`dapo_exp.backends.verl` applies every fix's rules through the registry (and its own for the keys no
fix owns); the builders here (:func:`to`, :func:`unused`, :func:`on`) are shared by both. Written against
verl 0.9.1 (:data:`VERL_VERSION`).
"""

from __future__ import annotations

import math
import re
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


_PLAIN = re.compile(r"^[A-Za-z_/.~][A-Za-z0-9_./~-]*$")
_RESERVED = {"true", "false", "null", "none", "inf", "nan", "True", "False", "None"}


def render(v: Any) -> str:
    """``v`` in Hydra's override grammar (strings quoted when they need it)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "inf" if v == math.inf else repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(render(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{render(x)}" for k, x in v.items()) + "}"
    s = str(v)
    if _PLAIN.match(s) and s not in _RESERVED:
        return s
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def only(path: str, allowed: Any, why: str, then: dict[str, Any] | None = None) -> Rule:
    """A key verl honours at one value only (``allowed``, then ``then``'s verl keys); any other value fails."""
    def fn(v: Any, ctx: Context) -> dict[str, Any]:
        if v != allowed:
            fail(path, v, why)
        return dict(then or {})

    shown = ", ".join(f"`{k}={render(val)}`" for k, val in (then or {}).items()) or "none"
    return Rule(f"{shown} (only `{render(allowed)}`: {why})", fn)


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
