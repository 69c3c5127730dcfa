"""Runs from Weights & Biases: online through ``wandb.Api``, offline from the ``.wandb`` files.

Both paths produce the same :class:`WandbRun` (config, raw summary, history rows,
state), and :func:`to_record` turns it into the :class:`~dapo_exp.analysis.runs.RunRecord`
that local run directories also give, so every source yields the same frames.

**Online** (:func:`fetch_online`): ``wandb.Api().runs("entity/project", filters)``
filtered by group and tags; each run's config, summary and full history
(``scan_history``) are cached under ``cache_dir/<entity>/<project>/<run id>/``
(``history.parquet`` + ``run.json``), so a notebook re-executed later does not
download them again; a run is fetched again when its W&B state changed or is
not terminal, or with ``refresh=True``. If the query itself fails (no network),
the runs of the last successful query are read from the cache, with a warning.

**Offline** (:func:`read_offline`): ``wandb.Api`` cannot read offline runs, and
``wandb sync`` needs an account. The ``.wandb`` file of a run is a LevelDB-style
log (https://github.com/google/leveldb/blob/main/doc/log_format.md): a 7-byte
header (``:W&B``, magic 0xBEE1, version 0), then 32 KiB blocks of chunks
``crc32 (4, little-endian, zlib CRC-32 of type byte + data) | length (2) | type (1:
full, 2: first, 3: middle, 4: last) | data``; each complete record is a
``wandb.proto.wandb_internal_pb2.Record`` protobuf. We read the ``run`` record
(config, group, tags), ``config``, ``summary`` and ``history`` records and the
``exit`` record (exit code). A torn record at the end (a killed run) is dropped.
A run resumed offline writes one file per session; they are merged by run id.

What the trainer is expected to put in W&B: the resolved config as the W&B
config, and at the end the fields of ``summary.json`` in the W&B summary, nested
(``final: {...}``) or flattened (``final/eval/acc_avg``). Best: all of them
(status, label, preset, switches, seed, final, best, base, wall_time_s); the
least: the ``final/...`` eval metrics, which the trainer sets only once it has
finished (label, switches and seed then come from the config, best and base
from the eval history). A run with neither the trainer's ``status`` nor final
metrics counts as killed (excluded), like a run directory without
``summary.json``; a run W&B marks failed or crashed is excluded as such.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import warnings
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dapo_exp.analysis.runs import SUMMARY_KEYS, RunRecord, RunSet, records_to_runset

STEP_KEY = "train/step"  # dapo_exp.tracking.STEP_METRIC (not imported: keep this module light)
DEFAULT_CACHE = os.environ.get("DAPO_WANDB_CACHE", os.path.join("~", ".cache", "dapo_exp", "wandb"))
TERMINAL_STATES = ("finished", "failed", "crashed", "killed")

_HEADER = b":W&B"
_HEADER_LEN = 7
_BLOCK = 32768
_CHUNK_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


@dataclass
class WandbRun:
    """One W&B run as both paths see it, before it becomes a RunRecord."""

    id: str
    config: dict[str, Any]
    summary: dict[str, Any]
    history: list[dict[str, Any]]
    state: str | None = None
    name: str | None = None
    group: str | None = None
    tags: list[str] = field(default_factory=list)
    project: str | None = None
    entity: str | None = None
    path: str | None = None  # local directory holding the run's files (offline), else None
    job_type: str | None = None  # "analysis" for the summary runs of dapo_exp.analysis.wandb_writer


# --------------------------------------------------------------------------- #
# Shared: W&B run -> RunRecord                                                  #
# --------------------------------------------------------------------------- #
def trainer_summary(summary: dict[str, Any]) -> dict[str, Any] | None:
    """The fields of ``summary.json`` found in a W&B summary (None when there are none).

    Accepts nested dicts (``final: {"eval/acc_avg": x}``) and flattened keys
    (``final/eval/acc_avg``); ``wall_time_s`` falls back to W&B's ``_runtime``.
    """
    out: dict[str, Any] = {}
    for k in SUMMARY_KEYS:
        if k in summary:
            out[k] = summary[k]
    for which in ("final", "best", "base"):
        flat = {k[len(which) + 1 :]: v for k, v in summary.items() if k.startswith(which + "/")}
        if flat:
            out[which] = {**flat, **(out.get(which) or {})}
    if not out:
        return None
    if "wall_time_s" not in out and "_runtime" in summary:
        out["wall_time_s"] = summary["_runtime"]
    return out


def history_rows(rows) -> list[dict[str, Any]]:
    """W&B history rows -> ``{"step": train/step (else _step), metric: value}``; W&B's own keys dropped."""
    out = []
    for r in rows:
        step = r.get(STEP_KEY, r.get("_step"))
        if step is None or (isinstance(step, float) and np.isnan(step)):
            continue
        d = {k: v for k, v in r.items() if not k.startswith("_") and k != STEP_KEY}
        d["step"] = int(step)
        out.append(d)
    return out


def to_record(run: WandbRun) -> RunRecord:
    """A :class:`WandbRun` as the :class:`RunRecord` every source produces."""
    config = {k: v for k, v in run.config.items() if not k.startswith("_")}
    return RunRecord(
        run=run.id,
        config=config,
        summary=trainer_summary(run.summary),
        history=history_rows(run.history),
        source="wandb",
        path=run.path,
        name=run.name,
        group=run.group,
        tags=tuple(run.tags),
        state=run.state,
    )


# --------------------------------------------------------------------------- #
# Offline: parse .wandb files                                                   #
# --------------------------------------------------------------------------- #
def iter_records(path: str | os.PathLike, verify: bool = True) -> Iterator[bytes]:
    """The serialized ``Record`` protobufs of a ``.wandb`` file, in order."""
    data = Path(path).read_bytes()
    if len(data) < _HEADER_LEN or data[:4] != _HEADER:
        raise ValueError(f"{path}: not a W&B transaction log (bad header)")
    pos, pending = _HEADER_LEN, None
    while pos + _CHUNK_HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _CHUNK_HEADER:  # block trailer: zero padding
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + _CHUNK_HEADER])
        if kind == 0 and length == 0:  # zero padding (preallocated or end of block)
            pos += left
            continue
        start = pos + _CHUNK_HEADER
        chunk = data[start : start + length]
        if len(chunk) < length:
            return  # torn write at the end
        if verify and zlib.crc32(bytes([kind]) + chunk) & 0xFFFFFFFF != crc:
            return  # corrupt from here on: keep what was read
        pos = start + length
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE and pending is not None:
            pending += chunk
        elif kind == _LAST and pending is not None:
            yield pending + chunk
            pending = None


def _set_nested(d: dict[str, Any], keys: list[str], value: Any) -> None:
    for k in keys[:-1]:
        nxt = d.get(k)
        if not isinstance(nxt, dict):
            nxt = d[k] = {}
        d = nxt
    d[keys[-1]] = value


def _del_nested(d: dict[str, Any], keys: list[str]) -> None:
    for k in keys[:-1]:
        d = d.get(k) if isinstance(d.get(k), dict) else {}
    d.pop(keys[-1], None)


def _item_keys(item) -> list[str]:
    return list(item.nested_key) if len(item.nested_key) else [item.key]


def _apply_updates(target: dict[str, Any], rec_part) -> None:
    """Apply a ConfigRecord / SummaryRecord (``update`` and ``remove`` items)."""
    for item in rec_part.update:
        _set_nested(target, _item_keys(item), json.loads(item.value_json))
    for item in rec_part.remove:
        _del_nested(target, _item_keys(item))


def parse_wandb_file(path: str | os.PathLike) -> WandbRun:
    """Read one ``.wandb`` file into a :class:`WandbRun` (no network, no account)."""
    from wandb.proto import wandb_internal_pb2 as pb

    path = Path(path)
    run = WandbRun(id=path.stem.removeprefix("run-"), config={}, summary={}, history=[])
    exit_code = None
    for raw in iter_records(path):
        rec = pb.Record()
        try:
            rec.ParseFromString(raw)
        except Exception:  # noqa: BLE001 - a record of a newer format: skip it
            continue
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            r = rec.run
            run.id = r.run_id or run.id
            run.project, run.entity = r.project or None, r.entity or None
            run.group, run.name = r.run_group or None, r.display_name or None
            run.tags = list(r.tags)
            run.job_type = r.job_type or None
            _apply_updates(run.config, r.config)
            _apply_updates(run.summary, r.summary)
        elif kind == "config":
            _apply_updates(run.config, rec.config)
        elif kind == "summary":
            _apply_updates(run.summary, rec.summary)
        elif kind == "history":
            row: dict[str, Any] = {}
            for item in rec.history.item:
                row[".".join(_item_keys(item))] = json.loads(item.value_json)
            if rec.history.HasField("step") and "_step" not in row:
                row["_step"] = rec.history.step.num
            run.history.append(row)
        elif kind == "exit":
            exit_code = rec.exit.exit_code
    run.state = None if exit_code is None else ("finished" if exit_code == 0 else "failed")
    # <run dir>/wandb/offline-run-*/run-<id>.wandb: the run directory is above wandb/
    run_dir = path.parent.parent.parent
    run.path = str(run_dir) if path.parent.parent.name == "wandb" else str(path.parent)
    return run


def _merge(parts: list[WandbRun]) -> WandbRun:
    """Sessions of one resumed run (in time order) -> one run; later values win."""
    base = parts[0]
    for p in parts[1:]:
        base.config.update(p.config)
        base.summary.update(p.summary)
        base.history += p.history
        base.state = p.state
        base.tags = p.tags or base.tags
        base.group = p.group or base.group
    return base


def read_offline(
    path: str | os.PathLike, *, group: str | None = None, tags: list[str] | None = None
) -> list[WandbRun]:
    """All W&B runs whose ``.wandb`` files lie under ``path`` (a file, a wandb dir, a sweep dir)."""
    path = Path(path)
    files = [path] if path.is_file() else sorted(path.rglob("*.wandb"))
    by_id: dict[str, list[tuple[str, WandbRun]]] = {}
    for f in files:
        try:
            r = parse_wandb_file(f)
        except ValueError as exc:
            warnings.warn(str(exc), stacklevel=2)
            continue
        # the session directory name starts with its start time: sort by it
        by_id.setdefault(r.id, []).append((f.parent.name, r))
    runs = [_merge([r for _, r in sorted(v, key=lambda t: t[0])]) for v in by_id.values()]
    return [r for r in runs if _keep(r, group, tags)]


# job_type of the analysis's own summary runs (dapo_exp.analysis.wandb_writer.JOB_TYPE): not training runs
ANALYSIS_JOB_TYPE = "analysis"


def _keep(run: WandbRun, group: str | None, tags: list[str] | None) -> bool:
    if run.job_type == ANALYSIS_JOB_TYPE:
        return False
    if group is not None and run.group != group:
        return False
    return all(t in run.tags for t in (tags or []))


# --------------------------------------------------------------------------- #
# Online: wandb.Api with a parquet cache                                        #
# --------------------------------------------------------------------------- #
def _run_cache_dir(cache_dir: Path, entity: str, project: str, run_id: str) -> Path:
    return cache_dir / entity / project / run_id


def _save_cached(d: Path, run: WandbRun) -> None:
    d.mkdir(parents=True, exist_ok=True)
    hist = pd.DataFrame([{k: v for k, v in r.items() if isinstance(v, (int, float, bool))} for r in run.history])
    hist.to_parquet(d / "history.parquet")
    meta = {k: v for k, v in asdict(run).items() if k != "history"}
    (d / "run.json").write_text(json.dumps(meta, default=str))


def _load_cached(d: Path) -> WandbRun | None:
    if not (d / "run.json").is_file() or not (d / "history.parquet").is_file():
        return None
    meta = json.loads((d / "run.json").read_text())
    hist = pd.read_parquet(d / "history.parquet")
    rows = [{k: v for k, v in r.items() if not (isinstance(v, float) and np.isnan(v))} for r in hist.to_dict("records")]
    return WandbRun(history=rows, **meta)


def _api_run(run: Any, entity: str, project: str) -> WandbRun:
    """Download one run of ``wandb.Api`` (config, summary, full history)."""
    summary = getattr(run, "summary_metrics", None)
    if summary is None:
        summary = dict(run.summary)
    return WandbRun(
        id=run.id,
        config=dict(run.config),
        summary=dict(summary),
        history=[dict(r) for r in run.scan_history()],
        state=run.state,
        name=run.name,
        group=getattr(run, "group", None),
        tags=list(getattr(run, "tags", []) or []),
        project=project,
        entity=entity,
        job_type=getattr(run, "job_type", None),
    )


def fetch_online(
    entity: str,
    project: str,
    *,
    group: str | None = None,
    tags: list[str] | None = None,
    cache_dir: str | os.PathLike = DEFAULT_CACHE,
    refresh: bool = False,
    api: Any = None,
) -> list[WandbRun]:
    """Runs of ``entity/project`` (optionally one group, all of ``tags``) via ``wandb.Api``, cached."""
    cache = Path(os.path.expanduser(str(cache_dir)))
    query = {"group": group, "tags": sorted(tags or [])}
    qfile = cache / entity / project / f"query-{hashlib.sha1(json.dumps(query).encode()).hexdigest()[:12]}.json"
    filters: dict[str, Any] = {}
    if group is not None:
        filters["group"] = group
    if tags:
        filters["$and"] = [{"tags": {"$in": [t]}} for t in tags]
    try:
        if api is None:
            import wandb

            api = wandb.Api()
        api_runs = list(api.runs(f"{entity}/{project}", filters=filters or None))
    except Exception as exc:  # noqa: BLE001 - no network: fall back on the cache
        if not qfile.is_file():
            raise
        warnings.warn(f"W&B query failed ({exc}); using the cached runs of {qfile}", stacklevel=2)
        ids = json.loads(qfile.read_text())
        cached = [_load_cached(_run_cache_dir(cache, entity, project, i)) for i in ids]
        return [r for r in cached if r is not None]
    out = []
    for ar in api_runs:
        if getattr(ar, "job_type", None) == ANALYSIS_JOB_TYPE:
            continue  # the summary run of an earlier analysis, in the same group
        d = _run_cache_dir(cache, entity, project, ar.id)
        cached = None if refresh else _load_cached(d)
        if cached is not None and cached.state == ar.state and ar.state in TERMINAL_STATES:
            out.append(cached)
            continue
        run = _api_run(ar, entity, project)
        _save_cached(d, run)
        out.append(run)
    qfile.parent.mkdir(parents=True, exist_ok=True)
    qfile.write_text(json.dumps([r.id for r in out]))
    return out


# --------------------------------------------------------------------------- #
# Entry point                                                                   #
# --------------------------------------------------------------------------- #
def load_wandb(
    spec: str | os.PathLike,
    *,
    group: str | None = None,
    tags: list[str] | None = None,
    cache_dir: str | os.PathLike = DEFAULT_CACHE,
    refresh: bool = False,
    api: Any = None,
    end_window: int = 1,
) -> RunSet:
    """Runs from W&B as a :class:`RunSet` (the same frames as :func:`load_runs` gives).

    ``spec``: ``entity/project`` or ``entity/project/group`` (online, ``wandb.Api``;
    ``api`` may be given, e.g. ``wandb.Api(overrides=...)``), or an existing local
    path holding offline runs (``.wandb`` files; read without network).
    """
    if os.path.exists(spec):
        runs = read_offline(spec, group=group, tags=tags)
    else:
        parts = str(spec).strip("/").split("/")
        if len(parts) not in (2, 3):
            raise ValueError(f"W&B spec {spec!r}: expected entity/project[/group] or an existing local path")
        entity, project = parts[0], parts[1]
        group = parts[2] if len(parts) == 3 else group
        runs = fetch_online(entity, project, group=group, tags=tags, cache_dir=cache_dir, refresh=refresh, api=api)
    return records_to_runset([to_record(r) for r in runs], end_window=end_window, sources=[str(spec)])
