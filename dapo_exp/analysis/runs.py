"""Runs -> tidy DataFrames: one row per run, and a long history frame for curves.

Every source of runs (local run directories, W&B online, W&B offline files) is
first turned into :class:`RunRecord` objects holding the same three things:
the resolved config, the trainer's summary (``summary.json``, see
:mod:`dapo_exp.rundir`) and the history rows (``{"step": int, metric: value}``).
:func:`records_to_runset` turns records into frames, so every source gives the
same frames for the same runs.

The runs frame (:attr:`RunSet.runs`), one row per run:

=====================  =========================================================
``run``                id: the run dir relative to the sweep dir, or the W&B id
``label``              configuration label (:func:`dapo_exp.hydra_setup.run_label`,
                       read from the switches, not the preset name); for a run
                       killed before summary.json, from its ``config.json`` or
                       ``.hydra/config.yaml``
``preset, seed``       launch preset (``fixes=``) and seed
``status``             finished | failed | killed | running | crashed ...
``included``           True when the run counts in the table's statistics
                       (status ``finished``); the rest are reported, not used
``exclude_reason``     why not
``clip_higher`` ...    one column per registered fix (:data:`dapo_exp.fixes.FIXES`)
``model, task``        ``model.path`` and ``task.name``
``wall_time_s``        ``summary.wall_time_s`` (not a table column: it measures the machine as
                       much as the configuration)
``load_avg_start``     the 1-minute load average when the run started
                       (``summary.environment.load_avg_1m``) and when it ended
``load_avg_end``       (``summary.load_avg_end``): read wall times with them
``torch_threads, cpu`` torch's thread count and the CPU (model / kernels' instruction set) the
                       run used (``summary.environment``): a run's numbers repeat bit for bit only
                       with the same commit, packages, threads and CPU kind
``final/<eval key>``   ``summary.final`` (eval at the end); ``best/``, ``base/``
                       (step 0) likewise; derived from the eval history where the
                       summary lacks them
``endpoint/eval/acc_avg`` the declared endpoint (``eval.endpoint``), the accuracy the
                       tables report: ``summary.endpoint.value``; else, for
                       ``last_k_mean``, the mean of the last ``eval.endpoint_k``
                       evaluations of the trained policy in the history; else
                       ``final/eval/acc_avg``
``endpoint/n_evals``   how many evaluations that value averages (1 for ``final``;
                       ``eval.endpoint_k``, or fewer in a run with fewer evaluations)
``end/<metric>``       training metric at the end: mean of its last ``end_window``
                       logged values (default 1 = the last value)
``avg/<metric>``       training metric averaged over all logged steps
``config.<a.b>``       the flattened resolved config
=====================  =========================================================

The history frame (:attr:`RunSet.history`) is long: ``run, label, seed, step,
metric, value``; eval metrics sit at the steps where evaluation ran.

One configuration per row: runs are grouped by their label, and runs that share a label but differ
in any other result-changing config key (:func:`dapo_exp.rundir.result_config`: everything but the
seed and the logging, naming, checkpoint-interval and launcher keys; ``train.steps`` and
``model.path`` included) are never pooled. Their labels get the differing keys appended,
``full [train.steps=4]`` and ``full [train.steps=6]``, so every table, curve and effect sees
separate configurations, and :attr:`RunSet.notes` (``runs.attrs["notes"]``, printed under the
comparison table) says which runs were split and on which keys (:func:`split_configurations`).
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dapo_exp import fixes, rundir
from dapo_exp.evaluation import ENDPOINT_EVALS  # runs-frame column: how many evaluations the endpoint averages

# keys of summary.json the runs frame reads (the rest of the summary is ignored)
SUMMARY_KEYS = (
    "status",
    "label",
    "preset",
    "switches",
    "seed",
    "wall_time_s",
    "load_avg_end",
    "environment",
    "steps_done",
    "final",
    "best",
    "base",
    "error",
    "git_commit",
    "endpoint",
    "base_model",
)
EVAL_PREFIX = "eval/"
EVAL_ACC = rundir.EVAL_ACC
ENDPOINT_ACC = f"endpoint/{EVAL_ACC}"  # the declared endpoint's accuracy (eval.endpoint): what tables report
# the SHA-256 (12 digits) of the base weights (summary.json's base_model), a result-changing column
BASE_WEIGHTS = "config.model.base_sha256"
# What the analysis reads of one run, at most: a file or field over its bound is refused for that run, named,
# and the rest analysed (a summary's label is copied into each history row). summary.json: the trainer's is
# tens of KiB; metrics.jsonl: about 1 KiB a step.
MAX_SUMMARY_BYTES = 4 * 2**20
MAX_METRICS_BYTES = 512 * 2**20
# directories never searched for runs
_PRUNE = {"wandb", rundir.CHECKPOINTS, ".hydra", "__pycache__", ".ipynb_checkpoints"}


@dataclass
class RunRecord:
    """One run as read from any source, before it becomes rows of frames."""

    run: str
    config: dict[str, Any]
    summary: dict[str, Any] | None
    history: list[dict[str, Any]]
    source: str = "local"
    # the run directory (local runs, offline W&B runs inside one); None for online W&B runs
    path: str | None = None
    name: str | None = None
    group: str | None = None
    tags: tuple[str, ...] = ()
    # the backend's own run state (W&B: finished, failed, crashed, killed, running), if any
    state: str | None = None
    # why the summary could not be read (over its bound, not JSON, nested too deep); None: read, or none there
    summary_unread: str | None = None
    # why the history could not be read (over its bound); None: read
    history_unread: str | None = None


@dataclass
class RunSet:
    """The frames of a set of runs. ``runs``: one row per run; ``history``: long frame."""

    runs: pd.DataFrame
    history: pd.DataFrame
    sources: list[str] = field(default_factory=list)
    # a sequential sweep's record (<sweep>/sequential.json: its stopping rule and rounds) when the runs are
    # one such sweep: the table and the contrasts then give its anytime-valid intervals
    sequential: dict[str, Any] | None = None

    @property
    def included(self) -> pd.DataFrame:
        """Runs that count in the statistics (status finished)."""
        return self.runs[self.runs["included"]] if len(self.runs) else self.runs

    @property
    def excluded(self) -> pd.DataFrame:
        """Runs kept for the record but left out of the statistics (failed, killed, running)."""
        return self.runs[~self.runs["included"]] if len(self.runs) else self.runs

    @property
    def n_excluded(self) -> int:
        return int(len(self.excluded))

    def describe(self) -> str:
        """One line: how many runs, how many excluded and why."""
        if not len(self.runs):
            return "0 runs"
        ex = self.excluded
        s = f"{len(self.runs)} runs, {len(self.runs) - len(ex)} included"
        if len(ex):
            counts = ex["status"].value_counts()
            s += f", {len(ex)} excluded (" + ", ".join(f"{n} {st}" for st, n in counts.items()) + ")"
        return s

    @property
    def notes(self) -> list[str]:
        """What the grouping did that a reader must know (:func:`split_configurations`)."""
        return list(self.runs.attrs.get("notes", []))

    def __repr__(self) -> str:
        return f"RunSet({self.describe()}; history {len(self.history)} rows)"


# --------------------------------------------------------------------------- #
# Local run directories                                                         #
# --------------------------------------------------------------------------- #
def latest_sweep(root: str | os.PathLike = "multirun") -> Path:
    """The most recently written sweep directory under ``root`` (``multirun/<sweep>``): the one whose
    newest ``metrics.jsonl`` or ``summary.json`` is newest. What the notebooks open by default."""
    root = Path(root)
    newest: dict[Path, float] = {}
    for run_dir in find_run_dirs(root) if root.is_dir() else []:
        sweep = root / Path(os.path.relpath(run_dir, root)).parts[0]
        stamps = [p.stat().st_mtime for p in (run_dir / rundir.METRICS, run_dir / rundir.SUMMARY) if p.exists()]
        newest[sweep] = max([newest.get(sweep, 0.0), *stamps])
    if not newest:
        raise FileNotFoundError(f"no sweep under {root.resolve()}: run one first, e.g. "
                                "python run.py -m fixes=grpo,clip,clip_ds,full")
    return max(newest, key=newest.__getitem__)


def order_labels(labels) -> list[str]:
    """The paper's ladder first (when present), then the other presets in registry order
    (:data:`dapo_exp.fixes.PRESETS`), then the rest by their number of fixes, then by name."""
    labels = list(dict.fromkeys(labels))
    first = [lbl for lbl in fixes.LADDER if lbl in labels]
    first += [lbl for lbl in fixes.PRESETS if lbl in labels and lbl not in fixes.LADDER]
    rest = sorted((lbl for lbl in labels if lbl not in first), key=lambda lbl: (lbl == "unknown", lbl.count("+"), lbl))
    return first + rest


def find_run_dirs(root: str | os.PathLike) -> list[Path]:
    """All run directories under ``root`` (itself included), sorted; does not look inside a run dir."""
    root = Path(root)
    if rundir.is_run_dir(root):
        return [root]
    found: list[Path] = []
    for dirpath, dirnames, _ in os.walk(root):
        if rundir.is_run_dir(dirpath):
            found.append(Path(dirpath))
            dirnames[:] = []
            continue
        dirnames[:] = sorted(d for d in dirnames if d not in _PRUNE)
    return sorted(found)


def _early_config(run_dir: Path) -> dict[str, Any]:
    """The config of a run killed before writing summary.json: the trainer's ``config.json``
    (written at the start), else the one Hydra recorded in ``.hydra/config.yaml``."""
    early = rundir.read_json(run_dir / rundir.CONFIG) or {}
    if isinstance(early.get("config"), dict):
        # label and switches as the trainer computed them at the start
        return {**early["config"], **{k: early[k] for k in ("label", "switches") if k in early}}
    p = run_dir / ".hydra" / "config.yaml"
    if not p.is_file():
        return {}
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(p)
    try:
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    except Exception:  # noqa: BLE001 - interpolations that need Hydra's runtime
        return OmegaConf.to_container(cfg, resolve=False)  # type: ignore[return-value]


def read_run_dir(run_dir: str | os.PathLike, root: str | os.PathLike | None = None) -> RunRecord:
    """Read one run directory into a :class:`RunRecord` (no network)."""
    run_dir = Path(run_dir)
    summary, summary_unread = _read_summary(run_dir / rundir.SUMMARY)
    config = (summary if isinstance(summary, dict) else {}).get("config") or _early_config(run_dir)
    mp = run_dir / rundir.METRICS
    history, history_unread = [], _over(mp, MAX_METRICS_BYTES)
    if history_unread is None:
        numbered, skipped = rundir.read_numbered_rows(mp)
        history, not_numbers = numeric_rows(numbered)
        if skipped:
            warnings.warn(f"{run_dir}: skipped {len(skipped)} line(s) of {rundir.METRICS}: {'; '.join(skipped[:5])}",
                          stacklevel=2)
        if not_numbers:
            warnings.warn(f"{run_dir}: left out {len(not_numbers)} value(s) of {rundir.METRICS} that are not numbers: "
                          f"{'; '.join(not_numbers[:5])}" + ("; ..." if len(not_numbers) > 5 else ""), stacklevel=2)
    if root is not None:
        rel = os.path.relpath(run_dir, root)
        run_id = run_dir.name if rel == "." else rel
    else:
        run_id = str(run_dir)
    return RunRecord(run=run_id, config=config or {}, summary=summary, history=history, path=str(run_dir),
                     summary_unread=summary_unread, history_unread=history_unread)


_JSON_KINDS = {list: "a list", dict: "an object", str: "a string", type(None): "null"}


def numeric_rows(numbered: Iterable[tuple[int, dict[str, Any]]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Metric rows ``(line, row)`` with each value that is not a number left out, and one
    ``"line <n>: <key> is a list"`` for each (a list, an object, a string, null where a metric number belongs:
    damage, never a measurement). The row's numbers are kept; no value becomes a row of its own."""
    rows, wrong = [], []
    for n, row in numbered:
        kept = {"step": row["step"]}
        for k, v in row.items():
            if k == "step":
                continue
            if _is_number(v):
                kept[k] = v
            else:
                wrong.append(f"line {n}: {k} is {_JSON_KINDS.get(type(v), type(v).__name__)}, not a number")
        rows.append(kept)
    return rows, wrong


def _over(path: Path, limit: int) -> str | None:
    """``"<n> bytes, over the <limit> read"`` when ``path`` is larger than ``limit``, else None."""
    try:
        size = path.stat().st_size
    except OSError:
        return None
    return f"{size} bytes, over the {limit} read" if size > limit else None


def _read_summary(path: Path) -> tuple[Any, str | None]:
    """``summary.json`` parsed (any JSON value: :func:`summary_problem` judges it) and None, or None and why it
    cannot be read; ``(None, None)`` when there is none."""
    if not path.is_file():
        return None, None
    if too_big := _over(path, MAX_SUMMARY_BYTES):
        return None, too_big
    try:
        return json.loads(path.read_text(encoding="utf-8", errors="replace")), None
    except RecursionError:
        return None, "nested deeper than the JSON parser reads"
    except ValueError as exc:
        return None, f"not valid JSON (torn?): {' '.join(str(exc).split())[:80]}"
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or type(exc).__name__})"


def load_runs(paths: str | os.PathLike | Sequence[str | os.PathLike], *, end_window: int = 1) -> RunSet:
    """Collect local runs into a :class:`RunSet` (the source of truth; no network).

    ``paths``: a sweep directory (searched recursively for run directories), a run
    directory, or a list of either.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = [Path(p) for p in paths]
    for p in paths:
        if not p.exists():
            raise FileNotFoundError(f"no such run or sweep directory: {p}")
    # run ids: relative to the sweep dir (one sweep), else to the common parent of
    # the sweeps, so that runs of two sweeps with the same overrides stay distinct
    roots = [p if not rundir.is_run_dir(p) else p.parent for p in paths]
    common = roots[0] if len(set(roots)) == 1 else Path(os.path.commonpath([r.resolve().parent for r in roots]))
    dirs = list(dict.fromkeys(d.resolve() if len(set(roots)) > 1 else d for p in paths for d in find_run_dirs(p)))
    records = [read_run_dir(d, root=common) for d in dirs]
    data = records_to_runset(records, end_window=end_window, sources=[str(p) for p in paths])
    if len(paths) == 1:
        from dapo_exp.analysis.sequential import record_of

        data.sequential = record_of(paths[0])
    return data


# --------------------------------------------------------------------------- #
# Records -> frames (shared by every source)                                    #
# --------------------------------------------------------------------------- #
def _is_number(v: Any) -> bool:
    return isinstance(v, (bool, int, float, np.bool_, np.integer, np.floating))


# a logged value beyond this magnitude is damage, not a measurement (no metric of a run comes near it)
ABSURD = 1e100


def _usable(v: float) -> bool:
    return math.isfinite(v) and abs(v) < ABSURD


def history_problems(rows: Sequence[dict[str, Any]], limit: int = 3) -> list[str]:
    """What is wrong with a run's history rows, at most ``limit`` items (row numbers from 1): a metric
    logged twice for one step with different values (a trainer cuts its log back to the checkpoint
    on resume, so this is a damaged file), and values that are not finite or absurdly large. Empty
    for a sound history."""
    seen: dict[tuple[int, str], float] = {}
    out: list[str] = []
    for i, r in enumerate(rows, 1):
        step = r.get("step")
        if step is None or not _is_number(step):
            continue
        for k, v in r.items():
            if k == "step" or not _is_number(v) or math.isnan(float(v)):
                continue
            v = float(v)
            if not _usable(v):
                out.append(f"row {i} (step {int(step)}): {k} = {v:g}")
            elif (key := (int(step), k)) in seen and seen[key] != v:
                out.append(f"row {i}: step {int(step)} logged again with {k} = {v:g} (was {seen[key]:g})")
            seen.setdefault((int(step), k), v)
            if len(out) >= limit:
                return out
    return out


def history_wide(rows: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """History rows -> one row per step (numeric metrics only), sorted by step.

    Rows of the same step merge (a train line and an eval line of one step; a step logged again:
    the later value wins, and :func:`history_problems` reports it). Values that are not finite or
    absurdly large (:data:`ABSURD`) are left out.
    """
    clean = []
    for r in rows:
        step = r.get("step")
        if step is None or not _is_number(step):
            continue
        d = {k: float(v) for k, v in r.items() if k != "step" and _is_number(v)}
        d = {k: v for k, v in d.items() if _usable(v)}
        d["step"] = int(step)
        clean.append(d)
    if not clean:
        return pd.DataFrame({"step": pd.Series([], dtype="int64")})
    df = pd.DataFrame(clean)
    df = df.groupby("step", sort=True).last().reset_index()
    return df


def _eval_points(summary: dict[str, Any], wide: pd.DataFrame) -> dict[str, dict[str, float]]:
    """final / best / base eval metrics: the summary's, else derived from the eval history."""
    out: dict[str, dict[str, float]] = {"final": {}, "best": {}, "base": {}}
    eval_cols = [c for c in wide.columns if c.startswith(EVAL_PREFIX)]
    if eval_cols:
        ev = wide.dropna(subset=eval_cols, how="all")
        if len(ev):
            out["final"] = ev.iloc[-1][eval_cols].dropna().to_dict()
            if rundir.EVAL_ACC in ev and ev[rundir.EVAL_ACC].notna().any():
                out["best"] = ev.loc[ev[rundir.EVAL_ACC].idxmax(), eval_cols].dropna().to_dict()
            base = ev[ev["step"] == 0]
            if len(base):
                out["base"] = base.iloc[0][eval_cols].dropna().to_dict()
    for k in out:
        given = summary.get(k)
        if isinstance(given, dict):
            out[k] = {**out[k], **{m: float(v) for m, v in given.items() if _is_number(v)}}
    return out


def _endpoint_acc(summary: dict[str, Any], config: dict[str, Any], wide: pd.DataFrame,
                  final: float) -> tuple[float, int]:
    """The run's declared endpoint accuracy (see the module docstring's ``endpoint/eval/acc_avg``) and
    how many evaluations it averages (``endpoint/n_evals``: fewer than ``eval.endpoint_k`` in a short run)."""
    declared = summary.get("endpoint")
    if isinstance(declared, dict) and _is_number(declared.get("value")) and not math.isnan(float(declared["value"])):
        steps = declared.get("steps")
        return float(declared["value"]), len(steps) if isinstance(steps, list) and steps else 1
    ev = config.get("eval") if isinstance(config.get("eval"), dict) else {}
    if ev.get("endpoint") == "last_k_mean" and EVAL_ACC in wide:
        from dapo_exp.evaluation import last_k_steps

        acc = wide.dropna(subset=[EVAL_ACC]).set_index("step")[EVAL_ACC]
        covered = last_k_steps(acc.index, int(ev.get("endpoint_k") or 1))
        if covered:
            return float(acc.loc[covered].mean()), len(covered)
    return float(final) if _is_number(final) else float("nan"), 1


def with_endpoint(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with its ``endpoint/eval/acc_avg`` column: a frame built elsewhere (by hand, or by an
    older version) without it gets ``final/eval/acc_avg`` there, the endpoint ``final``."""
    if ENDPOINT_ACC in runs or f"final/{EVAL_ACC}" not in runs:
        return runs
    out = runs.copy()
    out[ENDPOINT_ACC] = out[f"final/{EVAL_ACC}"]
    return out


def _flatten(d: dict[str, Any], prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        elif isinstance(v, (list, tuple)):
            out[key] = json.dumps(list(v))
        else:
            out[key] = v
    return out


def _switches_and_label(config: dict[str, Any]) -> tuple[dict[str, bool], str | None]:
    """Switch states and label from a resolved config (a run killed before its summary, written by
    a version that did not record them in config.json): the registry's reading of ``algo`` and the
    run label the trainer would have given it (its preset's name when the switches match)."""
    algo = config.get("algo")
    if not isinstance(algo, dict):
        return {}, None
    try:
        from omegaconf import OmegaConf

        cfg = OmegaConf.create({"preset": config.get("preset", "custom"), "algo": algo})
        state = fixes.switches(cfg.algo)
    except Exception:  # noqa: BLE001 - a config from another version of the schema
        return {}, None
    try:
        from dapo_exp.hydra_setup import run_label

        return state, run_label(cfg)
    except Exception:  # noqa: BLE001 - no config tree to compose the presets from
        return state, fixes.label(state)


def _status(rec: RunRecord) -> tuple[str, bool, str]:
    summ = rec.summary or {}
    status = summ.get("status")
    if status == rundir.STATUS_RUNNING and rec.path and rundir.writer_alive(rec.path) is False:
        # the summary written at the start says running, but no process writes the run any more
        return "killed", False, "summary.json says running but its writer is gone (killed)"
    if status:
        if status == rundir.STATUS_FINISHED:
            return status, True, ""
        err = summ.get("error")
        return status, False, f"status {status}" + (f": {str(err).splitlines()[0][:120]}" if err else "")
    if rec.source == "wandb":
        # No trainer status in W&B. The trainer sets the final eval metrics in the W&B
        # summary only once it has finished; with them, and no failure recorded by W&B,
        # the run finished. Without them it never reached its end (or it is a run of
        # another program); W&B's own state says more when it is not "finished".
        if summ.get("final") and rec.state in (None, rundir.STATUS_FINISHED):
            return rundir.STATUS_FINISHED, True, ""
        st = rec.state if rec.state and rec.state != rundir.STATUS_FINISHED else "killed"
        return st, False, f"no trainer status in the W&B summary (W&B state {rec.state or 'unknown'})"
    return "killed", False, "no summary.json (killed, or still running)"


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def _run_row(rec: RunRecord, wide: pd.DataFrame, end_window: int) -> dict[str, Any]:
    cfg = rec.config or {}
    summ = rec.summary or {}
    status, included, reason = _status(rec)
    sw_cfg, label_cfg = _switches_and_label(cfg)
    switches = summ.get("switches") or cfg.get("switches") or sw_cfg
    label = summ.get("label") or cfg.get("label") or label_cfg or cfg.get("preset") or "unknown"
    seed = summ.get("seed", cfg.get("seed"))
    row: dict[str, Any] = {
        "run": rec.run,
        "label": str(label),
        "preset": summ.get("preset", cfg.get("preset")),
        "seed": int(seed) if _is_number(seed) else seed,
        "status": status,
        "included": included,
        "exclude_reason": reason,
    }
    for k in fixes.switch_names():
        row[k] = bool(switches[k]) if k in switches else None
    row.update(
        {
            "model": (cfg.get("model") or {}).get("path"),
            "task": (cfg.get("task") or {}).get("name"),
            "engine": (cfg.get("rollout") or {}).get("engine"),
            "sweep": cfg.get("sweep"),
            "group": rec.group,
            "wall_time_s": _num(summ.get("wall_time_s")),
            # the machine's 1-minute load at the run's start and end: what its wall time also measures
            "load_avg_start": _num((summ.get("environment") or {}).get("load_avg_1m")),
            "load_avg_end": _num(summ.get("load_avg_end")),
            "torch_threads": _num((summ.get("environment") or {}).get("torch_threads")),
            "cpu": (summ.get("environment") or {}).get("cpu"),
            "steps_done": _num(summ.get("steps_done", wide["step"].max() if len(wide) else np.nan)),
            "git_commit": summ.get("git_commit"),
            "error": summ.get("error"),
            "source": rec.source,
            "path": rec.path,
            "name": rec.name,
        }
    )
    for which, vals in _eval_points(summ, wide).items():
        for m, v in vals.items():
            row[f"{which}/{m}"] = v
    row[ENDPOINT_ACC], row[ENDPOINT_EVALS] = _endpoint_acc(summ, cfg, wide, row.get(f"final/{EVAL_ACC}", np.nan))
    train_cols = [c for c in wide.columns if c != "step" and not c.startswith(EVAL_PREFIX)]
    for c in train_cols:
        s = wide[c].dropna()
        if len(s):
            row[f"end/{c}"] = float(s.iloc[-max(1, end_window) :].mean())
            row[f"avg/{c}"] = float(s.mean())
    row.update(_flatten(cfg, "config."))
    base = summ.get("base_model")
    if isinstance(base, dict) and isinstance(base.get("exported_from"), dict):
        # a backend=verl run of the toy loads an export of the warm start (its weights and configs copied, its
        # tokenizer rebuilt with the same ids, dapo_exp.backends.verl_launch.export_tiny_model): its base is the
        # warm start, as a native run's of the same config
        base = base["exported_from"]
    if isinstance(base, dict) and (base.get("files_sha256") or base.get("sha256")):
        # the base model's identity (every file it loads; runs from before that was recorded: the weights'):
        # runs of one label from different warm-start builds, or one tokenizer changed, are split
        row[BASE_WEIGHTS] = str(base.get("files_sha256") or base["sha256"])[:12]
    return row


_SUMMARY_OBJECTS = ("config", "switches", "final", "best", "base", "environment", "endpoint", "base_model")
# summary.json's text fields and the most characters of each the analysis reads (the label goes into every row)
_SUMMARY_TEXTS = {"label": 500, "preset": 500, "status": 500, "git_commit": 500, "error": 20_000}
_SUMMARY_NUMBERS = ("seed", "wall_time_s", "steps_done", "load_avg_end")


def summary_problem(summary: Any) -> str | None:
    """What makes a ``summary.json`` unusable for the table (a field of the wrong type, an evaluation that is
    not a number), naming the field; None when it reads as the trainer writes it (or there is none)."""
    if summary is None:
        return None
    if not isinstance(summary, dict):
        return f"a JSON {type(summary).__name__}, not an object"
    for key in _SUMMARY_OBJECTS:
        if summary.get(key) is not None and not isinstance(summary[key], dict):
            return f"{key} is a {type(summary[key]).__name__}, not an object"
    for key, limit in _SUMMARY_TEXTS.items():
        if summary.get(key) is not None and not isinstance(summary[key], str):
            return f"{key} is a {type(summary[key]).__name__}, not a string"
        if len(summary.get(key) or "") > limit:
            return f"{key} is {len(summary[key])} characters, over the {limit} read"
    for key in _SUMMARY_NUMBERS:
        v = summary.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            return f"{key} is {json.dumps(v)[:40]}, not a number"
    for key in ("final", "best", "base"):
        for metric, v in (summary.get(key) or {}).items():
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                return f"{key}.{metric} is {json.dumps(v)[:40]}, not a number"
    return None


def records_to_runset(
    records: Sequence[RunRecord], *, end_window: int = 1, sources: list[str] | None = None
) -> RunSet:
    """Turn :class:`RunRecord` objects (from any source) into a :class:`RunSet`."""
    rows, hist = [], []
    for rec in records:
        wide = history_wide(rec.history)
        if bad_summary := rec.summary_unread or summary_problem(rec.summary):  # read as if it had none, left out
            rec = replace(rec, summary=None, config=rec.config if isinstance(rec.config, dict) else {})
        row = _run_row(rec, wide, end_window)
        if bad_summary:
            row["included"], row["exclude_reason"] = False, f"malformed summary.json: {bad_summary}"
            warnings.warn(f"{rec.path or rec.run}: left out of the statistics, malformed summary.json: {bad_summary}",
                          stacklevel=2)
        elif rec.history_unread:
            row["included"], row["exclude_reason"] = False, f"unread {rundir.METRICS}: {rec.history_unread}"
            warnings.warn(f"{rec.path or rec.run}: left out of the statistics, unread {rundir.METRICS}: "
                          f"{rec.history_unread}", stacklevel=2)
        elif row["included"] and (problems := history_problems(list(rec.history))):
            # a damaged history never reaches the statistics: the run is listed as excluded, saying what
            row["included"] = False
            row["exclude_reason"] = "damaged metrics: " + "; ".join(problems)
            warnings.warn(f"{rec.path or rec.run}: left out of the statistics, damaged metrics: "
                          f"{'; '.join(problems)}", stacklevel=2)
        rows.append(row)
        if len(wide) and wide.shape[1] > 1:
            long = wide.melt(id_vars="step", var_name="metric", value_name="value").dropna(subset=["value"])
            long.insert(0, "run", rec.run)
            long.insert(1, "label", row["label"])
            long.insert(2, "seed", row["seed"])
            hist.append(long)
    runs = pd.DataFrame(rows)
    if not len(runs):
        runs = pd.DataFrame(columns=["run", "label", "preset", "seed", "status", "included", "exclude_reason"])
    else:
        fixed = [c for c in runs.columns if "/" not in c and not c.startswith("config.")]
        metric_cols = sorted(c for c in runs.columns if "/" in c and not c.startswith("config."))
        config_cols = sorted(c for c in runs.columns if c.startswith("config."))
        runs = runs[fixed + metric_cols + config_cols]
        runs["included"] = runs["included"].astype(bool)
    history = (
        pd.concat(hist, ignore_index=True)
        if hist
        else pd.DataFrame({"run": [], "label": [], "seed": [], "step": [], "metric": [], "value": []})
    )
    if len(history):
        history = history.sort_values(["run", "metric", "step"], kind="stable").reset_index(drop=True)
        history["step"] = history["step"].astype("int64")
        history["value"] = history["value"].astype(float)
    runs = runs.reset_index(drop=True)
    notes = split_configurations(runs, history)
    runs.attrs["notes"] = notes
    return RunSet(runs=runs, history=history, sources=sources or [])


def result_columns(runs: pd.DataFrame) -> list[str]:
    """The runs frame's ``config.<key>`` columns that change results: keys of the schema's sections
    (:class:`dapo_exp.config.Config`), minus the seed (what replicates a configuration) and minus
    :data:`dapo_exp.rundir.PRESENTATION_KEYS`. Keys a source adds to the config (W&B's ``git_commit``,
    ``label``) are not config keys."""
    import dataclasses

    from dapo_exp.config import Config

    sections = {f.name for f in dataclasses.fields(Config)} - {"seed"}
    cols = []
    for c in runs.columns:
        if not c.startswith("config."):
            continue
        key = c[len("config."):]
        if key.split(".", 1)[0] in sections and key in rundir.result_config({key: 0}):
            cols.append(c)
    return cols


def _shown(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "?"
    text = str(v)
    return text if len(text) <= 32 else "..." + text[-29:]


def split_configurations(runs: pd.DataFrame, history: pd.DataFrame | None = None) -> list[str]:
    """Give runs that share a label but differ in a result-changing config key (:func:`result_columns`)
    labels of their own, in place: ``<label> [<key>=<value>, ...]`` with each differing key (``?`` for a
    run whose config lacks it); ``history``'s labels follow. A key missing from some runs' config (an
    older schema) is not a difference. Returns one note per split label, naming the keys."""
    notes: list[str] = []
    if not len(runs) or "label" not in runs:
        return notes
    cols = result_columns(runs)
    relabel: dict[Any, str] = {}
    for label, g in runs.groupby("label", sort=False):
        differing = [c for c in cols if g[c].dropna().astype(str).nunique() > 1]
        if not differing:
            continue
        names = {i: f"{label} [" + ", ".join(f"{c[len('config.'):]}={_shown(g.at[i, c])}" for c in differing) + "]"
                 for i in g.index}
        relabel.update(names)
        keys = ", ".join(c[len("config."):] for c in differing)
        notes.append(f"the {len(g)} runs labelled {label} differ in {keys}: shown as {len(set(names.values()))} "
                     f"separate configurations ({'; '.join(sorted(set(names.values())))}), never pooled")
    if relabel:
        new = pd.Series(relabel)
        runs.loc[new.index, "label"] = new
        if history is not None and len(history):
            by_run = dict(zip(runs["run"], runs["label"]))
            history["label"] = history["run"].map(by_run).fillna(history["label"])
    return notes
