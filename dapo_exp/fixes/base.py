"""The registry of the fixes and the hook slots through which a fix acts on a training step.

A fix is one module (``dapo_exp/fixes/<name>.py``, or a file of your own) that builds a
:class:`Fix` and passes it to :func:`register_fix`. The :class:`Fix` declares everything
about it: its config keys, when it is on (read from the values, never from a preset's
name), the hook slots it fills and how it binds them from the config, its metrics, its
paper reference and which fixes it cannot be combined with. The trainer reaches the fixes
only through the plan :mod:`dapo_exp.compose` builds from them; the labels, W&B tags,
analysis columns and the backends' translations iterate :data:`FIXES`. A fix's module is its
whole dossier: its typed keys (``schema``: :mod:`dapo_exp.config` assembles the ``algo`` section
from them), its hooks, checks and metrics, its verl rules (``verl``, built with
:mod:`dapo_exp.fixes.verl_rules`) and the testbed study that judges it (``study``,
:class:`Judged`); only its pure maths lives apart, in :mod:`dapo_exp.objective` (tensors in,
tensors out, tested alone). GRPO's own pieces, which the fixes transform or replace, are
:mod:`dapo_exp.fixes.grpo`.

The slots (:data:`SLOTS`) are the places a fix can act. Hooks are plain callables over
tensors and scalars, bound once per run by the fix's ``bind(algo, run)``:

- ``reward``: ``(*, lengths (B,) float, correct (B,) bool, texts (B,) str) -> (B,)`` added to the
  correctness reward (``texts``: the decoded responses). The term's mean over the trained batch is
  logged as the fix's first metric (0 when off).
- ``estimator``: ``(rewards (N, G), *, lengths (N, G), parts) -> (N, G)`` advantages, the one estimator
  (default: GRPO's group-relative one, :func:`dapo_exp.fixes.grpo.advantage`); ``lengths`` are the responses'
  token counts, ``parts`` the reward's components (``{"accuracy": correctness reward, <reward fix>: its
  term}``, each ``(N, G)``, summing to ``rewards``). RLOO, REINFORCE++, OPO, GDPO and kin fill it. A fix that
  declares ``greedy_baseline=True`` (ReMax) also receives ``baseline`` (N,): the reward of one greedy response
  per prompt, which the rollout then decodes and scores besides the group.
- ``advantage``: ``(advantages (N, G), rewards (N, G)) -> (N, G)``, applied in registry
  order after the estimator: a transform of the advantages it is given, never a replacement of them.
- ``group_filter``: a :class:`GroupFilter` (which groups a batch keeps, and how it refills); its
  ``keep`` is what the plan calls.
- ``token_mask``: ``(mask (B, T), truncated (B,)) -> (B, T)``, the tokens that count in the
  loss, applied in registry order.
- ``surrogate``: ``(logp, old_logp, advantages, *, mask) -> objective.SurrogateOut`` per token
  (default: GRPO's, PPO's clipped surrogate, :func:`dapo_exp.fixes.grpo.surrogate`).
- ``normaliser``: ``(mask (B, T), group_index (B,)) -> (B,)`` loss weights of a mini-batch
  (default: GRPO's ``seq-mean-token-mean``, :data:`dapo_exp.fixes.grpo.MODE`).
- ``update_mask``: ``(entropy (B, T), mask (B, T)) -> (B, T) bool``, of a mini-batch's loss-mask
  tokens those whose policy-gradient term counts, from the per-token entropy of the mini-batch
  under the policy being updated (a no-grad forward before its gradient passes). It masks the
  numerator only: the normaliser, the surrogate's own sums and the KL term still see the loss
  mask. Several fixes: their masks are and-ed. (``token_mask`` acts once per batch, before any
  forward, and its mask is what the normaliser counts.)
- ``rollout_weight``: ``(old_logp (B, T), engine_logp (B, T), mask (B, T)) -> (B, T)`` detached
  weights multiplied into the per-token advantages, the correction of the rollout engine's
  sampling distribution (trainer's old log-probs vs the engine's); called only when the engine
  reported its log-probs.
- ``loss_term``: ``(*, logp, old_logp, entropy, mask, weights) -> scalar`` added to a micro-batch's
  loss (``entropy`` is the policy's per-token entropy, with its gradient; ``weights`` the
  normaliser's, so :func:`dapo_exp.objective.aggregate_loss` over the micro-batches of a mini-batch
  adds up to the mini-batch's term). An entropy bonus, an auxiliary loss. Several fixes: their
  terms add.

A hook of any slot returns its value, or ``Out(value, metrics)`` to log metrics of its own (for the
``group_filter`` slot, its ``keep``): the plan merges them into the step's row. A rollout hook's metrics
(``reward``, ``keep``) are averaged over the step's generation rounds; a batch hook's (``estimator``,
``advantage``, ``token_mask``) are logged as returned; an update hook's (``normaliser`` and ``update_mask``, called once per
mini-batch; ``surrogate``, ``rollout_weight`` and ``loss_term``, once per micro-batch) are summed over each
mini-batch's calls and averaged over the step's optimizer steps (as ``actor/pg_loss``). A fix may declare
the metrics its hooks log, and the loop checks them.

Slots marked ``exclusive`` take one fix at a time: two fixes that are on and fill the
same exclusive slot fail before any compute, naming both (so do fixes that name each
other in ``excludes``).

This module imports nothing of the project but the config error at import time, and not torch, so the
analysis can read the registry without it; binding a fix that logs the tokens it selects (``logs_selected``)
imports :mod:`dapo_exp.objective`, and so torch, when the fix is bound for a run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from dapo_exp.errors import ConfigError


@dataclass(frozen=True)
class Slot:
    """A place where a fix acts on a training step."""

    signature: str  # what the bound hook takes and returns
    exclusive: bool  # one fix at a time (else the hooks of every fix that is on are combined)


SLOTS: dict[str, Slot] = {
    "reward": Slot("(*, lengths (B,), correct (B,), texts (B,)) -> (B,) added to the reward", exclusive=False),
    "estimator": Slot("(rewards (N, G), *, lengths (N, G), parts {name: (N, G)}) -> (N, G) advantages",
                      exclusive=True),
    "advantage": Slot("(advantages (N, G), rewards (N, G)) -> (N, G)", exclusive=False),
    "group_filter": Slot("GroupFilter", exclusive=True),
    "token_mask": Slot("(mask (B, T), truncated (B,)) -> (B, T)", exclusive=False),
    "surrogate": Slot("(logp, old_logp, advantages, *, mask) -> objective.SurrogateOut", exclusive=True),
    "normaliser": Slot("(mask (B, T), group_index (B,)) -> (B,) weights", exclusive=True),
    "update_mask": Slot("(entropy (B, T), mask (B, T)) -> (B, T) bool, numerator only", exclusive=False),
    "rollout_weight": Slot("(old_logp (B, T), engine_logp (B, T), mask (B, T)) -> (B, T) x advantages",
                           exclusive=True),
    "loss_term": Slot("(*, logp, old_logp, entropy, mask, weights) -> scalar added to the loss", exclusive=False),
}


class Out(NamedTuple):
    """What a hook returns when it logs metrics of its own: its value and ``{metric name: value}``."""

    value: Any
    metrics: dict[str, Any]


def unpack(result: Any) -> tuple[Any, dict[str, Any]]:
    """``(value, metrics)`` of a hook's result: an :class:`Out`, or a bare value (no metrics)."""
    return (result.value, dict(result.metrics)) if isinstance(result, Out) else (result, {})


def mean_over_rounds(rounds: list[dict[str, Any]]) -> dict[str, float]:
    """A rollout hook's metrics over the step's generation rounds (one dict a round): each one's mean."""
    return {k: sum(float(m[k]) for m in rounds) / len(rounds) for k in rounds[0]} if rounds else {}


def binds(slot: str, fn: str, **keys: str) -> Callable[[Any, RunInfo], dict[str, Any]]:
    """A fix's ``bind`` that fills ``slot`` with ``dapo_exp.objective.<fn>``, each keyword bound to the value
    of ``algo.<key>`` (``binds("surrogate", "cispo_surrogate", eps_low="cispo_eps_low")``)."""

    def bind(algo: Any, run: RunInfo) -> dict[str, Any]:
        import functools

        from dapo_exp import objective

        return {slot: functools.partial(getattr(objective, fn), **{k: algo[v] for k, v in keys.items()})}

    return bind


def logs_selected(bind: Callable[[Any, RunInfo], dict[str, Any]], metric: str) -> Callable[[Any, RunInfo], dict]:
    """A ``surrogate`` fix's ``bind`` whose hook also logs ``metric``: the tokens of the micro-batch's mask that
    its :class:`~dapo_exp.objective.SurrogateOut` marks ``selected`` (Clip-Cov's detached, KL-Cov's penalised
    tokens), summed over each mini-batch and averaged over the step's optimizer steps: tokens per update."""

    def wrapped(algo: Any, run: RunInfo) -> dict[str, Any]:
        inner = bind(algo, run)["surrogate"]

        def surrogate(logp: Any, old_logp: Any, advantages: Any, *, mask: Any) -> Out:
            out = inner(logp, old_logp, advantages, mask=mask)
            return Out(out, {metric: (out.selected & mask.bool()).sum()})

        return {"surrogate": surrogate}

    return wrapped


def check_range(algo: Any, *bounds: tuple[str, str, Callable[[Any], bool]]) -> None:
    """Refuse the first ``(key, rule, ok)`` whose ``ok(algo[key])`` is false, before any compute:
    ``algo.<key>: must be <rule>, got <value>`` (``ok`` decides whether null is allowed)."""
    for key, rule, ok in bounds:
        if not ok(algo[key]):
            raise ConfigError(f"algo.{key}: must be {rule}, got {algo[key]}")


@dataclass(frozen=True)
class RunInfo:
    """The values of the run besides ``algo`` that a fix may bind (plain values, no config)."""

    max_response_len: int  # rollout.max_response_len, L_max of the generation
    group_size: int  # rollout.n, G
    seed: int  # the run's seed (for a fix's own random choices)


@dataclass(frozen=True)
class GroupFilter:
    """The ``group_filter`` slot: which groups a training batch keeps, and how it refills.

    ``keep(correct (N, G) float, reward (N, G) float) -> (N,) bool`` (or ``Out`` with its metrics). Rounds of
    ``ceil(want * oversample)`` prompts are generated until the batch holds ``want`` kept
    groups; at most ``max_rounds`` (0 = unlimited), then ``on_cap`` = ``error`` | ``partial``;
    kept groups beyond the batch: ``surplus`` = ``discard`` | ``carry`` (to the next step).
    """

    keep: Callable[[Any, Any], Any]
    max_rounds: int = 10
    on_cap: str = "error"
    surplus: str = "discard"
    oversample: float = 1.0


@dataclass(frozen=True)
class Key:
    """One ``algo`` key a fix declares: the schema's field (type, default) and its meaning (the config reference's
    line). ``type`` is one OmegaConf accepts (``bool``, ``int``, ``float``, ``str``, ``float | None``, ...)."""

    name: str
    type: Any
    default: Any
    doc: str


@dataclass(frozen=True)
class Judged:
    """How the testbed judges a fix (:mod:`dapo_exp.analysis.studies` builds its study from this): the regime
    where the paper says it has a job (``conf/experiment/<experiment>.yaml``), the mechanism metrics through
    which it acts, each ``(runs-frame column, predicted sign of on - off (0: none), why)`` (held-out accuracy
    at the endpoint is always added, reported), and its off / on config-group options."""

    experiment: str
    metrics: tuple[tuple[str, int, str], ...]
    arms: tuple[str, str] = ("disabled", "enabled")


@dataclass(frozen=True, kw_only=True)
class Fix:
    """One switchable fix: everything about it, in one place."""

    name: str  # switch name = config group under conf/ = key in summary.json's "switches"
    short: str  # token in run labels ("clip+ds")
    title: str  # as its paper names it
    paper: str  # where its paper defines it
    is_on: Callable[[Any], bool]  # algo config -> is the fix on?
    slots: tuple[str, ...]  # the hook slots it fills (SLOTS)
    bind: Callable[[Any, RunInfo], dict[str, Any]]  # (algo, run) -> {slot: hook}, called when it is on
    schema: tuple[Key, ...] = ()  # the algo keys it owns, typed: the schema's AlgoConfig is assembled from these
    keys: tuple[str, ...] = ()  # the algo keys it reads and a backend must translate (default: its schema's)
    sets: tuple[str, ...] = ()  # GRPO's keys (fixes/grpo.SCHEMA) whose values are this switch, for a fix that changes
    #                             GRPO by its explicit values and declares no key (Clip-Higher's range, Dr. GRPO's std)
    metrics: tuple[str, ...] = ()  # what it logs (checked in every trained step's row)
    check: Callable[[Any, RunInfo], None] | None = None  # its values' checks, before any compute
    excludes: tuple[str, ...] = ()  # fixes it cannot be combined with
    why_excluded: tuple[tuple[str, str], ...] = ()  # (fix, why) for an exclusion the error message explains
    options: tuple[str, ...] = ("disabled", "enabled")  # its config group's options
    study: Judged | None = None  # the testbed study that judges it (regime, mechanism metrics)
    verl: Mapping[str, Any] = field(default_factory=dict)  # algo key -> its verl_rules.Rule (none: refused on verl)
    # its config group as code, {option: {algo key: value}} (an outside fix's, instead of YAML files on a search
    # path): register_fix stores each option in Hydra's ConfigStore, group <name>, package algo
    configs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # the rollout also decodes one greedy response per prompt, scored like the samples (correctness reward plus the
    # reward terms), and the estimator receives its reward as ``baseline`` (N,) (ReMax's baseline); for an
    # ``estimator`` fix
    greedy_baseline: bool = False

    def __post_init__(self) -> None:
        if not self.keys:
            object.__setattr__(self, "keys", tuple(k.name for k in self.schema))
        if self.greedy_baseline and "estimator" not in self.slots:
            raise ValueError(f"fix {self.name!r} asks for a greedy baseline but fills no estimator slot: only the "
                             "estimator receives it")
        stray = [k.name for k in self.schema if k.name not in self.keys]
        if stray:
            raise ValueError(f"fix {self.name!r} declares schema keys {stray} that are not among its keys {self.keys}")

    def describe(self) -> str:
        return f"{self.title} ({self.paper})"


def refused(*, name: str, short: str, title: str, paper: str, slot: str, needs: str, why: str, doc: str,
            only: Callable[[str, Any, str], Any]) -> Fix:
    """A switch for a method the trainer cannot run (it ``needs`` what the trainer lacks, ``why`` says what): its
    one key ``algo.<name>`` (``doc``), on with ``<name>=enabled``, refused before any compute by its check
    (``<name>: not supported, <why>``) and by its verl rule, ``only(path, False, why)`` (pass
    :func:`dapo_exp.fixes.verl_rules.only`, which this module does not import); it would fill ``slot``."""
    def check(algo: Any, run: RunInfo) -> None:
        if algo[name]:
            raise ConfigError(f"{name}: not supported, {why}; switch it off ({name}=disabled)")

    def bind(algo: Any, run: RunInfo) -> dict[str, Any]:
        raise ConfigError(f"{name}: not supported, {why}")  # never reached: its check refuses it first

    return Fix(name=name, short=short, title=title, paper=paper, schema=(Key(name, bool, False,
               f"{doc} (refused: {needs})"),), is_on=lambda a: bool(a[name]), slots=(slot,), check=check, bind=bind,
               verl={name: only(f"algo.{name}", False, why)})


FIXES: dict[str, Fix] = {}


_SCHEMA_ASSEMBLED: list[bool] = []  # set once dapo_exp.config has read the fixes' schemas


def schema_keys() -> list[Key]:
    """Every registered fix's schema keys, in registry order (what :mod:`dapo_exp.config` assembles ``algo``
    from); a fix registered afterwards keeps its keys under ``algo.ext``."""
    _SCHEMA_ASSEMBLED.append(True)
    return [k for f in FIXES.values() for k in f.schema]


def register_fix(fix: Fix) -> Fix:
    """Add ``fix`` to :data:`FIXES` (its name and short label must be new). Returns it."""
    if fix.schema and _SCHEMA_ASSEMBLED:
        raise ValueError(f"fix {fix.name!r} declares schema keys, but the schema was assembled before it registered: "
                         "a fix outside the package keeps its keys under algo.ext (keys=('ext.<key>',), "
                         "docs: how-to/extend.md)")
    if fix.name in FIXES:
        raise ValueError(f"fix {fix.name!r} is already registered")
    if any(f.short == fix.short for f in FIXES.values()):
        raise ValueError(f"short label {fix.short!r} of fix {fix.name!r} is already taken")
    unknown = sorted(set(fix.slots) - set(SLOTS))
    if unknown:
        raise ValueError(f"fix {fix.name!r} fills unknown slots {unknown}; slots: {', '.join(SLOTS)}")
    unknown = sorted(set(fix.configs) - set(fix.options))
    if unknown:
        raise ValueError(f"fix {fix.name!r} gives configs for {unknown}, which are not among its options {fix.options}")
    if fix.configs:
        from hydra.core.config_store import ConfigStore

        for option, values in fix.configs.items():
            ConfigStore.instance().store(group=fix.name, name=option, node=dict(values), package="algo")
    FIXES[fix.name] = fix
    return fix


ENTRY_POINTS = "dapo_exp.fixes"  # the entry-point group of installed distributions' fix modules
MODULES_ENV = "DAPO_EXP_FIXES"  # comma-separated modules (my_pkg.my_fix) or Python files (./my_fix.py) with fixes


class ExtensionError(ImportError):
    """A fix module named outside the package (an entry point, ``DAPO_EXP_FIXES``) that cannot be imported."""


def load_outside_fixes() -> list[str]:
    """Import the fix modules named outside the package, each of which calls :func:`register_fix`: every installed
    distribution's entry points of the group ``dapo_exp.fixes`` (``[project.entry-points."dapo_exp.fixes"]``), then
    the modules and ``.py`` files in the environment variable ``DAPO_EXP_FIXES`` (comma-separated). Called by
    :mod:`dapo_exp.fixes` when it is first imported, so before :mod:`dapo_exp.config` assembles the ``algo`` schema:
    their keys are typed like the package's own, in ``python run.py`` and in every launcher worker or SLURM job (a
    new process imports them again; relative file paths are made absolute in the environment it passes on).
    Returns what it imported; a module that cannot be imported raises :class:`ExtensionError` naming it and where
    it was named."""
    import importlib
    import importlib.util
    import os
    import sys
    from importlib.metadata import entry_points

    done = []
    for ep in entry_points(group=ENTRY_POINTS):
        where = f"entry point {ep.name!r} of {ep.dist.name if ep.dist else 'an installed distribution'}"
        try:
            importlib.import_module(ep.module)
        except Exception as exc:
            raise ExtensionError(f"the fix module {ep.module!r} ({where}, group {ENTRY_POINTS}) cannot be imported: "
                                 f"{type(exc).__name__}: {exc}") from exc
        done.append(ep.module)
    named = [x.strip() for x in os.environ.get(MODULES_ENV, "").split(",") if x.strip()]
    absolute, where = [], f"{MODULES_ENV}={os.environ.get(MODULES_ENV)}"
    for item in named:
        try:
            if item.endswith(".py") or os.sep in item:
                path = os.path.abspath(item)
                if not os.path.isfile(path):
                    raise FileNotFoundError(f"no such file: {path}")
                name = "dapo_exp_outside_" + os.path.splitext(os.path.basename(path))[0]
                if name not in sys.modules:
                    spec = importlib.util.spec_from_file_location(name, path)
                    module = importlib.util.module_from_spec(spec)
                    sys.modules[name] = module  # its functions pickle by this name, as an imported module's do
                    try:
                        spec.loader.exec_module(module)
                    except BaseException:
                        del sys.modules[name]
                        raise
                item = path
            else:
                importlib.import_module(item)
        except Exception as exc:
            raise ExtensionError(f"the fix module {item!r} ({where}) cannot be imported: {type(exc).__name__}: "
                                 f"{exc} (a module must be importable, e.g. on PYTHONPATH; a file ends in .py)") from exc
        absolute.append(item)
        done.append(item)
    if named:
        os.environ[MODULES_ENV] = ",".join(absolute)  # what a launcher's worker or a SLURM job imports again
    return done


def unregister_fix(name: str) -> None:
    """Remove a fix (tests use it to undo :func:`register_fix`)."""
    FIXES.pop(name, None)


def is_on(fix: Fix, algo: Any) -> bool:
    """Is ``fix`` on for ``algo``? Off when ``algo`` has none of its keys: a run recorded before
    the fix existed (the analysis reads old runs) ran without it."""
    own = [k for k in (fix.keys or fix.sets) if not k.startswith("ext.")]
    if own and not any(k in algo for k in own):
        return False
    return bool(fix.is_on(algo))


def active(algo: Any) -> list[Fix]:
    """The fixes that are on for ``algo``, in registry order."""
    return [f for f in FIXES.values() if is_on(f, algo)]


def incompatibility(a: Fix, b: Fix) -> str | None:
    """Why fixes ``a`` and ``b`` cannot be on together (they fill the same exclusive slot, or one
    excludes the other), or None when they combine."""
    shared = [s for s in a.slots if s in b.slots and SLOTS[s].exclusive]
    if shared:
        return f"both fill the {shared[0]} slot"
    if b.name in a.excludes or a.name in b.excludes:
        why = dict(a.why_excluded).get(b.name) or dict(b.why_excluded).get(a.name)
        return why or "they exclude each other"
    return None


def check_combination(algo: Any) -> None:
    """Refuse fixes that are on together but exclude each other or fill the same exclusive slot, naming every
    such pair (``gspo=enabled cispo=enabled`` on top of ``fixes=full`` names gspo+cispo, not only the first
    pair found, clip_higher+gspo)."""
    on = active(algo)
    pairs = [(a.name, b.name, why) for i, a in enumerate(on) for b in on[i + 1:] if (why := incompatibility(a, b))]
    if len(pairs) == 1:
        a, b, why = pairs[0]
        raise ConfigError(f"fixes {a} and {b} cannot be combined ({why}); switch one off ({a}=disabled or "
                          f"{b}=disabled)")
    if pairs:
        names = list(dict.fromkeys(n for a, b, _ in pairs for n in (a, b)))
        raise ConfigError(f"fixes {', '.join(names[:-1])} and {names[-1]} cannot be combined: "
                          + "; ".join(f"{a} and {b} ({why})" for a, b, why in pairs)
                          + f"; keep one of them on (e.g. {', '.join(f'{n}=disabled' for n in names[1:])})")


def declared_ext_keys() -> set[str]:
    """The ``algo.ext.<key>`` keys that registered fixes declare."""
    return {k.removeprefix("ext.") for f in FIXES.values() for k in f.keys if k.startswith("ext.")}


# The presets of conf/fixes/, in display order (tables, legends). Their switch states
# are not written here: they are whatever the YAML composes to (a test checks every
# file against this list and the ladder's one-fix-per-row structure).
PRESETS: tuple[str, ...] = (
    "grpo", "clip", "clip_ds", "full",
    "full_no_clip", "full_no_ds", "full_no_tl", "full_no_sop",
    "paper_1_grpo", "paper_2_of", "paper_3_clip", "paper_4_sop", "paper_5_tl", "paper_6_dapo",
    "dr_grpo", "gspo", "cispo", "gmpo", "clip_cov", "kl_cov",
    "rloo", "reinforce_pp", "sapo", "gpg", "dro",
)
# The published recipes of the GRPO family after DAPO, each compared with GRPO (sweeps/family.sh).
FAMILY: tuple[str, ...] = (
    "dr_grpo", "gspo", "cispo", "gmpo", "clip_cov", "kl_cov",
    "rloo", "reinforce_pp", "sapo", "gpg", "dro",
)
# Table 1 of the paper: each row adds one fix to the row above.
LADDER: tuple[str, ...] = tuple(p for p in PRESETS if p.startswith("paper_"))
BASELINE = "grpo"  # the preset every other one is compared with (no fix on)


def switch_names() -> tuple[str, ...]:
    """The names of the registered fixes, in registry order."""
    return tuple(FIXES)


def dapo_fixes() -> tuple[str, ...]:
    """The fixes of the DAPO paper (Table 1's columns): those whose reference is the DAPO paper."""
    return tuple(name for name, f in FIXES.items() if f.paper.startswith("DAPO"))


def switches(algo: Any) -> dict[str, bool]:
    """``{fix name: on?}`` of an ``algo`` config, read from its values."""
    return {name: is_on(f, algo) for name, f in FIXES.items()}


def label(state: Mapping[str, bool]) -> str:
    """A readable label for a switch state that no preset has: the short names of the fixes that are on,
    joined by ``+`` (``grpo`` when none is). A run's label is its preset's name where a preset has its state
    (:func:`dapo_exp.hydra_setup.run_label`, which composes the presets)."""
    return "+".join(FIXES[k].short for k, on in state.items() if on and k in FIXES) or BASELINE


__all__ = ["BASELINE", "ENTRY_POINTS", "FAMILY", "FIXES", "LADDER", "MODULES_ENV", "PRESETS", "SLOTS", "ExtensionError", "Fix", "GroupFilter", "Judged", "Key", "Out", "RunInfo", "Slot",
           "active", "binds", "check_combination", "check_range", "dapo_fixes", "declared_ext_keys", "incompatibility", "is_on", "label", "load_outside_fixes", "refused", "register_fix",
           "schema_keys", "switch_names", "switches", "unpack", "unregister_fix"]
