"""The analysis of a sweep as one W&B run: the comparison table, the effects and the figures.

:func:`log_summary_run` starts a run with ``job_type="analysis"`` in the sweep's group, logs

- ``comparison_table``: a ``wandb.Table`` of exactly the strings of ``table.md`` (so the
  dashboard shows the same numbers), and ``comparison_table_numeric`` (``table.csv``);
- ``effects`` / ``effects_numeric``: the same for the effects (when the runs vary a switch);
- every PNG figure of the analysis as a ``wandb.Image`` under ``figures/<name>``;
- in the summary: the caption, the design, the number of runs and the warning line if any;

and finishes it. Offline by default (``mode="offline"``: no network, no account; ``wandb sync``
later), like the trainer's runs. The group is the sweep's (:func:`summary_group`), never a
shared "default": runs launched without ``sweep=`` all carry the sweep name "default", so their
summary run is put in a group named after the sweep directory instead.

Re-analysing a sweep replaces its summary run instead of adding one: the run's id is
deterministic (:func:`summary_run_id`: the group and the W&B directory); offline, the earlier
``offline-run-*-<id>`` folder is removed first (offline W&B cannot continue a run); online, the
same run is continued (``resume="allow"``) and the newest tables are its summary.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pandas as pd

JOB_TYPE = "analysis"
SHARED_DEFAULT = "default"


def summary_group(runs: pd.DataFrame, out_dir: str | os.PathLike | None = None) -> str:
    """The W&B group of a sweep's summary run.

    The runs' own W&B group when they share one (W&B sources), else their ``sweep`` name; when
    that is missing, mixed or the shared "default", a name from the output directory's sweep
    (``multirun/<name>/analysis`` -> ``<name>``) and a short hash of the run ids.
    """
    for col in ("group", "sweep"):
        if col in runs:
            vals = {str(v) for v in runs[col].dropna() if str(v)}
            if len(vals) == 1 and (v := vals.pop()) != SHARED_DEFAULT:
                return v
    digest = hashlib.sha1("\n".join(sorted(map(str, runs.get("run", [])))).encode()).hexdigest()[:8]
    stem = "analysis"
    if out_dir is not None:
        p = Path(out_dir).resolve()
        stem = p.parent.name if p.name == "analysis" else p.name
    return f"{stem}-{digest}"


def summary_run_id(group: str, wandb_dir: str | os.PathLike) -> str:
    """The W&B id of a sweep's summary run: ``analysis-`` and 12 hex of the group and the (resolved)
    directory W&B writes under, the same for every re-analysis of that sweep into that directory."""
    key = f"{group}\n{Path(wandb_dir).expanduser().resolve()}"
    return f"analysis-{hashlib.sha1(key.encode()).hexdigest()[:12]}"


def _replacing(group: str, wandb_dir: Path, mode: str | None) -> dict[str, Any]:
    """``wandb.init``'s ``id`` and ``resume`` for a summary run that replaces the earlier one of its
    sweep; offline, the earlier run's folder is removed first (offline W&B cannot continue a run)."""
    from dapo_exp.tracking import remove_offline_runs, wandb_folder

    run_id = summary_run_id(group, wandb_dir)
    # the mode W&B will use: this argument, else WANDB_MODE (wandb.init's own precedence)
    offline = (mode or os.environ.get("WANDB_MODE") or "online") in ("offline", "dryrun")
    if offline:
        remove_offline_runs(wandb_folder(wandb_dir), run_id)
    return {"id": run_id, "resume": None if offline else "allow"}


def _table(df: pd.DataFrame):
    import wandb

    clean = df.copy()
    clean.attrs = {}
    # one dtype per column: W&B infers column types from the values
    for c in clean.columns:
        if clean[c].dtype == object:
            clean[c] = clean[c].map(lambda v: "" if v is None or (isinstance(v, float) and v != v) else str(v))
    return wandb.Table(dataframe=clean)


def log_summary_run(
    result: Any,
    *,
    project: str = "dapo-exp",
    group: str | None = None,
    mode: str = "offline",
    entity: str | None = None,
    wandb_dir: str | os.PathLike | None = None,
) -> dict[str, str]:
    """Log an :class:`~dapo_exp.analysis.report.AnalysisResult` as a W&B run; returns its id, group and dir.

    The run replaces the summary run of an earlier analysis of the same group into the same
    ``wandb_dir`` (same id: :func:`summary_run_id`; offline, its folder is removed first)."""
    import wandb

    from dapo_exp.analysis.table import format_table, warning_line

    group = group or summary_group(result.data.runs, result.out_dir)
    wandb_dir = Path(wandb_dir or result.out_dir)
    wandb_dir.mkdir(parents=True, exist_ok=True)
    run = wandb.init(
        project=project,
        entity=entity,
        group=group,
        job_type=JOB_TYPE,
        name=f"analysis-{group}",
        **_replacing(group, wandb_dir, mode),
        dir=str(wandb_dir),
        mode=mode,
        config={"sources": [str(s) for s in result.data.sources], "n_runs": int(len(result.data.runs)),
                "n_included": int(len(result.data.included)), "ci": result.table.attrs.get("ci", "t")},
        reinit="finish_previous",
        settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
    )
    try:
        payload: dict[str, Any] = {
            "comparison_table": _table(format_table(result.table)),
            "comparison_table_numeric": _table(result.table.reset_index()),
        }
        eff = getattr(result, "effects", None)
        if eff is not None:
            from dapo_exp.analysis.effects import format_effects

            payload["effects"] = _table(format_effects(eff))
            payload["effects_numeric"] = _table(eff.table)
            run.summary["design"] = eff.design.text()
        for f in sorted(result.files):
            if Path(f).suffix == ".png":
                payload[f"figures/{Path(f).stem}"] = wandb.Image(str(f))
        run.log(payload)
        run.summary["caption"] = result.table.attrs.get("caption", "")
        run.summary["warning"] = warning_line(result.table)
        run.summary["runs"] = result.data.describe()
        info = {"id": run.id, "group": group, "dir": str(run.dir)}
    finally:
        run.finish()
        # the W&B service writes the run's file asynchronously: without this the offline file can
        # still be empty when finish() returns (wandb 0.31); teardown flushes and stops the service
        wandb.teardown()
    return info
