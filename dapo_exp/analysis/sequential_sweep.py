"""What a sequential sweep (``hydra/sweeper=sequential``) reads back after each round, and what it records.

The sweeper (:mod:`hydra_plugins.dapo_exp_sweeper.sequential_sweeper`) runs each configuration's seeds in
rounds. After a round, :func:`read_round` loads the sweep's runs (:func:`dapo_exp.analysis.runs.load_runs`),
keeps the seeds launched so far (so that a resumed sweep, which finds later seeds on disk, replays the same
decisions), and computes, for every comparison the analysis reports (the ladder's rungs when the
configurations form one, else each configuration against the baseline: ``grpo`` or ``paper_1_grpo`` when
present, else the first configuration of the command line), the anytime-valid interval of the paired
difference of the endpoint accuracy (pp, seed by seed; :mod:`dapo_exp.analysis.sequential`) at ``alpha /
comparisons`` each. A comparison is decided when its interval excludes 0 or lies within ``+-margin``; a
configuration gets more seeds while one of its comparisons is undecided and its budget lasts.

The record, ``<sweep>/sequential.json`` (:func:`write_record`), holds the rule and every round's intervals;
the analysis (:func:`record_of`) reads it to label a sequential sweep's intervals as anytime-valid, under the
rule recorded. It is append-only (:func:`recorded_rounds`, :func:`write_record`): a decision once recorded is
never rewritten by a re-run under another rule or with other configurations.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dapo_exp.analysis import sequential as seq

RECORD = seq.RECORD
record_of = seq.record_of
# what the sweeper refuses (run.py's preflight refuses the same, in one line, before anything runs)
SEEDS_REFUSED = ("hydra/sweeper=sequential chooses the seeds itself (0, 1, 2, ... up to hydra.sweeper.max_seeds): "
                 "drop seed= from the command line")
ONE_CONFIGURATION = "hydra/sweeper=sequential compares configurations: sweep at least two (e.g. fixes=grpo,clip)"


@dataclass(frozen=True)
class Rule:
    """The stopping rule: its keys are ``hydra.sweeper.*`` of ``conf/hydra/sweeper/sequential.yaml``."""

    alpha: float = seq.DEFAULT_ALPHA
    margin: float = 5.0
    phi: float = seq.DEFAULT_PHI
    first_seeds: int = 3
    max_seeds: int = 20

    def __post_init__(self) -> None:
        problems = []
        if not 0 < self.alpha < 1:
            problems.append(f"alpha={self.alpha} (must be in (0, 1))")
        if self.margin <= 0:
            problems.append(f"margin={self.margin} (must be > 0, in points of accuracy)")
        if self.phi <= 0:
            problems.append(f"phi={self.phi} (must be > 0)")
        if self.first_seeds < 2:
            problems.append(f"first_seeds={self.first_seeds} (a paired interval needs at least 2)")
        if self.max_seeds < self.first_seeds:
            problems.append(f"max_seeds={self.max_seeds} (must be >= first_seeds={self.first_seeds})")
        if problems:
            raise ValueError("hydra/sweeper=sequential: bad " + "; ".join(problems))

    def text(self, comparisons: int | None = None) -> str:
        """The rule in one sentence (the launch line)."""
        each = (f"alpha {self.alpha:g} shared by the {comparisons} comparison(s), {self.alpha / comparisons:.3g} each"
                if comparisons else f"alpha {self.alpha:g} shared by the comparisons (Bonferroni)")
        return (f"seeds in rounds: {self.first_seeds} per configuration first, then more to each configuration with an "
                f"undecided comparison, at most {self.max_seeds}; after each round an anytime-valid interval "
                f"(normal-mixture sequential t, phi {self.phi:g}; {each}) for the paired difference of the endpoint "
                f"accuracy; a comparison is decided when it excludes 0 (different) or lies within +-{self.margin:g} "
                f"points (equivalent), else undecided when the budget is spent")


# ``hydra.sweeper.*`` of conf/hydra/sweeper/sequential.yaml: the rule's keys and the seeds added per round, each
# with its type (the sweeper and run.py's preflight both read them through :func:`settings`)
SETTINGS: dict[str, type] = {"alpha": float, "margin": float, "phi": float, "first_seeds": int, "max_seeds": int,
                             "round_seeds": int}


def settings(values: Mapping[str, Any]) -> tuple[Rule, int | None]:
    """The stopping rule and the seeds added per round (None: enough to fill the launcher's workers) from the
    ``hydra.sweeper.*`` values (a missing or null one: its default), each checked: a ValueError names the first
    bad one in one line (``hydra.sweeper.round_seeds=0: must be >= 1, or null``)."""
    got = {k: _setting(k, values.get(k), kind) for k, kind in SETTINGS.items()}
    round_seeds = got.pop("round_seeds")
    if round_seeds is not None and round_seeds < 1:
        raise ValueError(f"hydra.sweeper.round_seeds={round_seeds}: must be >= 1, or null (enough seeds per round "
                         "to fill the launcher's workers)")
    return Rule(**{k: v for k, v in got.items() if v is not None}), round_seeds


def _setting(key: str, value: Any, kind: type) -> float | int | None:
    """One ``hydra.sweeper.<key>`` as ``kind``: a whole number for an int (``2.5``, ``true``, ``abc`` refused), a
    finite number for a float."""
    if value is None:
        return None
    try:
        number = None if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        number = None
    if kind is int:
        if number is None or not number.is_integer():
            raise ValueError(f"hydra.sweeper.{key}={value!r}: must be a whole number")
        return int(number)
    if number is None:
        raise ValueError(f"hydra.sweeper.{key}={value!r}: must be a number (float)")
    if not np.isfinite(number):
        raise ValueError(f"hydra.sweeper.{key}={value!r}: must be a finite number")
    return number


@dataclass
class Comparison:
    """One comparison after a round: ``a`` minus ``b`` (configuration indices and labels)."""

    a: int
    b: int
    label_a: str
    label_b: str
    n: int
    mean: float
    lo: float
    hi: float
    alpha: float
    state: str
    seeds: list[int] = field(default_factory=list)

    def line(self, round_no: int, budget_spent: bool) -> str:
        if self.n == 0:
            where = "no paired seeds yet"
        else:
            lo = "-inf" if not np.isfinite(self.lo) else f"{self.lo:+.1f}"
            hi = "+inf" if not np.isfinite(self.hi) else f"{self.hi:+.1f}"
            where = f"diff {self.mean:+.1f} pp, anytime-valid {1 - self.alpha:.1%} [{lo}, {hi}]"
        what = self.state
        if self.state == seq.UNDECIDED and budget_spent:
            what = "undecided (seed budget spent)"
        return f"[sequential] round {round_no} | {self.label_a} vs {self.label_b}: {self.n} seeds, {where}: {what}"


def pairs(labels: list[str], switches: list[frozenset[str]]) -> list[tuple[int, int]]:
    """The comparisons (a, b) over configurations with these labels and switch sets: the ladder's rungs
    (each against the one below) when they form one, else each against the baseline."""
    from dapo_exp.analysis.contrasts import ladder_order
    from dapo_exp.analysis.table import baseline_label

    order = ladder_order(dict(zip(labels, switches))) if len(set(labels)) == len(labels) else None
    if order is not None:
        return [(labels.index(hi), labels.index(lo)) for lo, hi in zip(order, order[1:])]
    base = baseline_label(labels)
    ref = labels.index(base) if base is not None else 0
    return [(i, ref) for i in range(len(labels)) if i != ref]


def _rows(sweep_dir: Path, dirs: list[list[Path]], seeds: list[set[int]]) -> list[pd.DataFrame]:
    """Each configuration's included runs with an endpoint, limited to the seeds launched so far."""
    from dapo_exp.analysis.runs import load_runs, with_endpoint
    from dapo_exp.analysis.table import DIFF_KEY, TABLE_METRICS

    src = next(m.source for m in TABLE_METRICS if m.key == DIFF_KEY)
    try:
        runs = with_endpoint(load_runs(sweep_dir).runs)
    except FileNotFoundError:
        runs = pd.DataFrame()
    if not len(runs) or "path" not in runs or src not in runs:
        return [pd.DataFrame(columns=["label", "seed", "value", "switches"]) for _ in dirs]
    where = runs["path"].map(lambda p: str(Path(p).resolve()) if p else "")
    out = []
    for own, keep in zip(dirs, seeds):
        g = runs[where.isin({str(p.resolve()) for p in own})]
        g = g[g["included"].astype(bool) & g[src].notna() & g["seed"].isin(keep)]
        out.append(pd.DataFrame({"label": g["label"], "seed": g["seed"].astype(int), "value": g[src] * 100.0,
                                 "switches": [_switch_set(r) for _, r in g.iterrows()]}))
    return out


def _switch_set(row: pd.Series) -> frozenset[str]:
    from dapo_exp.fixes import FIXES

    return frozenset(n for n in FIXES if n in row and bool(row[n]))


def read_round(sweep_dir: str | os.PathLike, dirs: list[list[Path]], seeds: list[set[int]], names: list[str],
               rule: Rule) -> list[Comparison]:
    """The comparisons after a round: ``dirs[i]`` are configuration i's job directories, ``seeds[i]`` the
    seeds launched for it so far, ``names[i]`` its name when no run of it is readable yet."""
    rows = _rows(Path(sweep_dir), dirs, seeds)
    labels = [str(r["label"].iloc[0]) if len(r) else names[i] for i, r in enumerate(rows)]
    switches = [r["switches"].iloc[0] if len(r) else frozenset() for r in rows]
    comps = pairs(labels, switches)
    alpha = rule.alpha / max(1, len(comps))
    out = []
    for a, b in comps:
        va = rows[a].set_index("seed")["value"]
        vb = rows[b].set_index("seed")["value"]
        common = sorted(set(va.index) & set(vb.index))
        d = (va.loc[common] - vb.loc[common]).to_numpy(dtype=float)
        iv = seq.interval(d, alpha=alpha, phi=rule.phi, margin=rule.margin)
        out.append(Comparison(a, b, labels[a], labels[b], iv.n, iv.mean, iv.lo, iv.hi, alpha, iv.state, common))
    return out


def recorded_rounds(sweep_dir: str | os.PathLike, rule: Rule, names: list[str] | None = None) -> list[dict[str, Any]]:
    """The rounds ``<sweep>/sequential.json`` records ([] when there is none), which a re-run replays on their
    seeds and appends to. A record is append-only: one under another rule, or of other configurations than
    ``names`` (None: not checked), is refused (ValueError naming what it records), never rewritten."""
    path = Path(sweep_dir) / RECORD
    try:
        rec = record_of(sweep_dir)
    except (OSError, ValueError) as exc:
        raise ValueError(f"hydra/sweeper=sequential: {path} cannot be read ({type(exc).__name__}); it records this "
                         "sweep's decision: restore it, or sweep into another hydra.sweep.dir") from None
    if rec is None:
        return []
    ours, theirs = asdict(rule), rec.get("rule") or {}
    changed = [f"{k}: {theirs.get(k)!r} -> {v!r}" for k, v in ours.items() if theirs.get(k) != v]
    if changed:
        again = " ".join(f"hydra.sweeper.{k}={v}" for k, v in theirs.items())
        raise ValueError(f"hydra/sweeper=sequential: {path} records a decision under another rule ({'; '.join(changed)}); "
                         f"a recorded decision is never rewritten: re-run with its rule ({again}), or sweep into "
                         "another hydra.sweep.dir")
    rounds = rec.get("rounds") or []
    if rounds and names is not None and set(rounds[0].get("seeds") or {}) != set(names):
        raise ValueError(f"hydra/sweeper=sequential: {path} records another sweep "
                         f"({', '.join(sorted(rounds[0].get('seeds') or {}))}; this command: {', '.join(sorted(names))}); "
                         "a recorded decision is never rewritten: sweep into another hydra.sweep.dir")
    return rounds


def write_record(sweep_dir: str | os.PathLike, rule: Rule, rounds: list[dict[str, Any]], done: bool) -> Path:
    """``<sweep>/sequential.json``: the rule, each round (its seeds per configuration and its comparisons)
    and whether the sweep has ended (every comparison decided or out of budget). Append-only: the rounds
    recorded already and ``rounds`` must agree where both have one, under the same rule (else ValueError, nothing
    written); a replay of recorded rounds leaves the record as it is, a new round is appended."""
    import json

    from dapo_exp.rundir import write_json

    path = Path(sweep_dir) / RECORD
    old = record_of(sweep_dir) or {}
    new = json.loads(json.dumps({"rule": asdict(rule), "rounds": rounds}, default=str))  # as it will read back
    if old and old.get("rule") != new["rule"]:
        raise ValueError(f"{path}: records another rule ({old.get('rule')}); it would be rewritten")
    recorded = old.get("rounds") or []
    for was, now in zip(recorded, new["rounds"]):
        if was != now:
            raise ValueError(f"{path}: round {was.get('round')} would be rewritten (a record is append-only)")
    if old and len(new["rounds"]) <= len(recorded):  # a replay of recorded rounds: the record stands
        return path
    write_json(path, {**new, "done": done})
    return path


def round_record(round_no: int, seeds: list[set[int]], names: list[str], comps: list[Comparison]) -> dict[str, Any]:
    def clean(c: Comparison) -> dict[str, Any]:
        d = asdict(c)
        d.update({k: (None if not np.isfinite(d[k]) else d[k]) for k in ("mean", "lo", "hi")})
        return d

    return {"round": round_no, "seeds": {n: sorted(s) for n, s in zip(names, seeds)},
            "comparisons": [clean(c) for c in comps]}

