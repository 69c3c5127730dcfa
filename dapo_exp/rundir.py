"""The run directory, both sides of the contract: what a run writes (the trainer,
the Hydra failure hook) and how it is read back (the trainer on resume, the analysis).

Every write of a JSON file is atomic (a temporary file, fsync, rename), so a reader
never sees half a ``summary.json``; JSONL files are appended line by line (fsynced by the
runner before each checkpoint), and the reader skips a line torn by a kill and any line
that is not a JSON object (on resume, also a row whose ``step`` is not an int, with a
warning: :func:`read_rows`). Imports nothing of the project.

It also holds the state of the command under way, which belongs to no run (:class:`CommandState`: the stop
signal received and the run watching for one, the sweeps run, their jobs that ended without a result or were
refused), in one holder with an explicit lifetime: ``run.py`` opens a fresh one for its command
(:func:`command_state`) and reads it at the end; outside every command (a library user calling
``train()``, a parallel sweep's worker process, a test) the functions read and write the process's own
state, which lasts as long as the process.

Run directory layout::

    <run>/config.json          written at the start: {"config": <resolved config>, "git_commit",
                               "label", "switches", "environment"} (what the analysis reads of a
                               run killed before it wrote a summary; environment: package
                               versions and thread count, see environment())
    <run>/metrics.jsonl        one JSON object per line: {"step": int, "<ns>/<name>": float, ...}
                               training lines every rollout step; eval lines (keys "eval/...")
                               at the steps where evaluation ran (step 0 = before training)
    <run>/summary.json         written first, small, with status "running" and padded to
                               SUMMARY_RESERVE bytes (reserve_summary), so that a failure on a full
                               disk can still overwrite it in place; rewritten at the end (status
                               "finished") or on a crash ("failed"):
                               {"status", "label", "preset", "switches": {fix: bool}, "seed",
                                "config": <resolved config>, "git_commit", "environment", "wall_time_s",
                                "steps_done", "final": {"eval/...": float}, "best": {...},
                                "base": {...eval at step 0}, "error": str | None,
                                "history_gap": [steps whose metric row was lost before a
                                checkpoint (a power loss); [] for a complete history]}
    <run>/eval_samples.jsonl   every evaluation sample: {"step", "problem_id", "sample",
                               "prompt", "response", "answer", "pred", "correct", "length",
                               "truncated"}
    <run>/train_samples.jsonl  a few training rollouts per step (same keys + "reward", "group")
    <run>/checkpoints/step_<n>/ model.safetensors, trainer_state.pt (weights-only: optimizer,
                               scheduler, RNG states, data position, step, eval history),
                               manifest.json (sizes and SHA-256, verified on resume)
    <run>/.lock                the run's writer (pid, host, start), held with flock
    <run>/wandb/               the W&B run (offline by default)
    <run>/.hydra/              Hydra's record of the composed config and overrides
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

METRICS = "metrics.jsonl"
CONFIG = "config.json"
SUMMARY = "summary.json"
EVAL_SAMPLES = "eval_samples.jsonl"
TRAIN_SAMPLES = "train_samples.jsonl"
CHECKPOINTS = "checkpoints"

STATUS_FINISHED = "finished"
STATUS_FAILED = "failed"
STATUS_RUNNING = "running"
STATUS_STOPPED = "stopped"  # a clean stop on SIGTERM / SIGINT: checkpointed, resumable
LOCK = ".lock"

# Main metric names (documented one line each with their formula in docs/reference/metrics.md).
EVAL_ACC = "eval/acc_avg"  # avg@k accuracy: mean over problems and k samples of correct
EVAL_PASS = "eval/pass_at_k"  # unbiased pass@k
EVAL_MAJ = "eval/maj_at_k"  # majority vote over normalised answers
EVAL_LEN = "eval/response_len_mean"
EVAL_TRUNC = "eval/truncated_frac"
EVAL_ENTROPY = "eval/entropy"
ENTROPY = "actor/entropy"
RESP_LEN = "response_length/mean"
RESP_LEN_MAX = "response_length/max"
TRUNC = "response_length/clip_ratio"
CLIP_HIGH = "actor/pg_clipfrac_higher"
CLIP_LOW = "actor/pg_clipfrac_lower"
ZERO_VAR = "dynamic_sampling/zero_var_frac"
GEN_ROUNDS = "dynamic_sampling/gen_rounds"
ROLLOUTS_PER_TRAINED = "dynamic_sampling/rollouts_per_trained"
CUM_ROLLOUTS = "compute/rollouts_total"
CUM_TOKENS = "compute/gen_tokens_total"


# --------------------------------------------------------------------------- #
# Writing                                                                       #
# --------------------------------------------------------------------------- #
def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some filesystems (and Windows) do not open directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class RunWriteError(OSError):
    """A file of a run could not be written (no space left, a read-only or failing filesystem): its message is
    one line naming the file, the cause and the free space; its errno is the cause's. run.py ends a run on it
    in that one line."""

    def __str__(self) -> str:
        return str(self.strerror)


def write_error(path: str | os.PathLike, exc: OSError) -> RunWriteError:
    """The :class:`RunWriteError` for ``exc``, met while writing ``path``."""
    import errno
    import shutil

    path = Path(path)
    try:
        free = f"{shutil.disk_usage(path.parent).free / 2**20:.0f} MiB free there now"
    except OSError:
        free = "free space unknown"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = "free disk space, or point the run at a larger filesystem (out_dir / hydra.run.dir)"
    else:
        fix = f"make {path.parent} a writable directory, or point the run elsewhere (out_dir / hydra.run.dir)"
    return RunWriteError(exc.errno or errno.EIO,
                         f"cannot write {path} ({exc.strerror or exc}; {free}); {fix}, and run the same command again")


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Replace ``path``'s content with ``text`` atomically: a sibling temporary file, fsync, rename.

    On failure (a full disk) the temporary file is removed and the old file, if any,
    is left as it was; an ``OSError`` is raised as :class:`RunWriteError`, naming ``path``.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and not isinstance(exc, RunWriteError):
            raise write_error(path, exc) from exc
        raise
    _fsync_dir(path.parent)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as JSON atomically (:func:`write_text_atomic`)."""
    write_text_atomic(path, json.dumps(obj, indent=1, default=str))


def read_json(path: str | os.PathLike) -> dict[str, Any] | None:
    """A JSON object from ``path``; None when the file is missing, unreadable or not an object."""
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # RecursionError: nested deeper than the parser's stack
        return None
    return obj if isinstance(obj, dict) else None


class JsonlWriter:
    """Appends rows (dicts) to a JSONL file, one JSON object per line.

    Each write reaches the operating system when it returns; :meth:`sync` makes every row
    written so far durable (fsync of the file and its directory), which the runner does
    before it publishes a checkpoint, so the rows up to a checkpoint survive a power loss."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def write(self, rows: list[dict[str, Any]] | dict[str, Any]) -> None:
        rows = [rows] if isinstance(rows, dict) else rows
        if not rows:
            return
        try:
            with self.path.open("a", encoding="utf-8") as f:
                f.write("".join(json.dumps(r, default=float) + "\n" for r in rows))
                f.flush()
        except OSError as exc:
            raise write_error(self.path, exc) from exc

    def sync(self) -> None:
        """fsync the file (when it exists) and its directory (its name)."""
        if self.path.exists():
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(self.path.parent)


def git_commit() -> str:
    """The commit of the dapo_exp source tree (``+dirty`` if modified), or ``unknown``."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=here, capture_output=True, text=True, timeout=5
        ).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except Exception:  # noqa: BLE001 - not a git checkout (installed package)
        return "unknown"


# the packages whose versions can change what a run computes
ENV_PACKAGES = ("torch", "transformers", "tokenizers", "safetensors", "numpy", "vllm", "hydra-core")


def cpu() -> str | None:
    """The CPU's model name (``/proc/cpuinfo``, else :func:`platform.processor`) and the instruction set torch's
    kernels use on it (``torch.backends.cpu.get_cpu_capability``, where torch is imported): float kernels differ
    between CPUs, so a run's numbers are bit-for-bit the same only on the same kind (and thread count)."""
    import platform
    import sys

    model = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    except OSError:
        pass
    model = model or platform.processor() or None
    torch = sys.modules.get("torch")
    capability = torch.backends.cpu.get_cpu_capability() if torch is not None else None
    return " / ".join(x for x in (model, capability) if x) or None


def environment() -> dict[str, Any]:
    """What besides the commit decides a run's numbers: Python, package versions, torch's thread
    count (float reductions depend on it), the CPU (:func:`cpu`: its kernels too) and the platform; and, for its
    wall time, the machine's load when it started (:func:`load_average`). Recorded in config.json and
    summary.json."""
    import platform
    import sys
    from importlib import metadata

    versions = {}
    for name in ENV_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    torch = sys.modules.get("torch")
    return {"python": platform.python_version(), "platform": platform.platform(), "packages": versions,
            "torch_threads": torch.get_num_threads() if torch is not None else None, "cpu": cpu(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "load_avg_1m": load_average()}


def recorded_threads(run_dir: str | os.PathLike) -> int | None:
    """torch's thread count the run in ``run_dir`` used (``config.json``'s ``environment.torch_threads``), when it
    holds a checkpoint to resume from; None otherwise (nothing to resume, or no usable record)."""
    run_dir = Path(run_dir)
    if not any((run_dir / CHECKPOINTS).glob("step_*")):
        return None
    n = ((read_json(run_dir / CONFIG) or {}).get("environment") or {}).get("torch_threads")
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else None


def load_average() -> float | None:
    """The machine's 1-minute load average (None where the platform has none). A run's wall time says as
    much about this as about its configuration: runs.csv keeps both, the comparison table neither."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


# --------------------------------------------------------------------------- #
# Reading                                                                       #
# --------------------------------------------------------------------------- #
def _json_lines(path: str | os.PathLike) -> Iterator[tuple[int, Any, str]]:
    """``(line number, parsed value or _NOT_JSON, stripped line)`` of each non-empty line."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                yield n, json.loads(line), line
            except (json.JSONDecodeError, RecursionError):
                yield n, _NOT_JSON, line


_NOT_JSON = object()


def iter_jsonl(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSONL file, in order. A line torn by a kill, a line that is
    not JSON and a JSON value that is not an object (``42``) are skipped."""
    return (obj for _, obj, _ in _json_lines(path) if isinstance(obj, dict))


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """:func:`iter_jsonl` as a list; ``[]`` when the file does not exist."""
    return list(iter_jsonl(path)) if Path(path).is_file() else []


def read_rows(path: str | os.PathLike) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of a run's JSONL log that a resume can use, and why each other line is not.

    A usable row is a JSON object whose ``step`` is an int. Anything else (a line torn by a
    kill or a power loss, a line that is not JSON or not an object, a ``step`` that is missing
    or not an int, e.g. ``"3"``) is left out, with ``"line <n>: <reason>"`` in the second list.
    ``([], [])`` when the file does not exist."""
    numbered, bad = read_numbered_rows(path)
    return [row for _, row in numbered], bad


def read_numbered_rows(path: str | os.PathLike) -> tuple[list[tuple[int, dict[str, Any]]], list[str]]:
    """:func:`read_rows` with each usable row's line number (from 1): ``[(n, row), ...]``, for a reader that
    names the line of a value it leaves out (the analysis)."""
    path = Path(path)
    rows: list[tuple[int, dict[str, Any]]] = []
    bad: list[str] = []
    if not path.is_file():
        return rows, bad
    for n, obj, line in _json_lines(path):
        if obj is _NOT_JSON:
            bad.append(f"line {n}: not valid JSON (torn by a kill?): {line[:60]!r}")
        elif not isinstance(obj, dict):
            bad.append(f"line {n}: a JSON {type(obj).__name__}, not an object")
        elif type(obj.get("step")) is not int:
            bad.append(f"line {n}: its step is {obj.get('step')!r} ({type(obj.get('step')).__name__}), not an int")
        else:
            rows.append((n, obj))
    return rows, bad


def truncate_jsonl(path: str | os.PathLike, max_step: int) -> None:
    """Keep the rows of steps ``<= max_step`` (a resumed run re-logs the later ones) and drop
    every line :func:`read_rows` leaves out. Rewritten atomically and durably."""
    path = Path(path)
    if not path.exists():
        return
    keep = [row for row in read_rows(path)[0] if row["step"] <= max_step]
    write_text_atomic(path, "".join(json.dumps(r, default=float) + "\n" for r in keep))


def read_overrides(run_dir: str | os.PathLike) -> list[str] | None:
    """The command-line overrides the run was started with (Hydra's record, ``.hydra/overrides.yaml``,
    written by ``run.py``), or None (missing or unreadable)."""
    from omegaconf import OmegaConf

    p = Path(run_dir) / ".hydra" / "overrides.yaml"
    if not p.is_file():
        return None
    try:
        return [str(x) for x in OmegaConf.to_container(OmegaConf.load(p)) or []]  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - an unreadable record: None, as a missing one
        return None


# Hydra's own overrides that say where and how a sweep's jobs run: a command that re-runs the sweep keeps them
RERUN_HYDRA_OVERRIDES = ("hydra/launcher=", "hydra/sweeper=", "hydra.launcher.", "hydra.sweeper.", "~hydra.callbacks.")


def read_launch_overrides(run_dir: str | os.PathLike) -> list[str]:
    """The overrides of Hydra's own config the run's command gave that a re-run keeps (the launcher, the
    sweeper and their settings, a callback removed: :data:`RERUN_HYDRA_OVERRIDES`; the seeds aside), from
    ``.hydra/hydra.yaml``; [] when it records none or cannot be read."""
    from omegaconf import OmegaConf

    p = Path(run_dir) / ".hydra" / "hydra.yaml"
    try:
        given = OmegaConf.select(OmegaConf.load(p), "hydra.overrides.hydra", default=None) if p.is_file() else None
        return [str(o) for o in (OmegaConf.to_container(given) if given is not None else [])
                if str(o).startswith(RERUN_HYDRA_OVERRIDES) and not str(o).startswith("hydra.sweeper.params.seed")]
    except Exception:  # noqa: BLE001 - an unreadable record: nothing kept
        return []


def read_summary(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The run's ``summary.json``, or None (missing or unreadable)."""
    return read_json(Path(run_dir) / SUMMARY)


def is_run_dir(path: str | os.PathLike) -> bool:
    """A directory holding a summary or a metrics file."""
    p = Path(path)
    return (p / SUMMARY).is_file() or (p / METRICS).is_file()


SUMMARY_RESERVE = 16384  # bytes reserved by the summary written at the start (reserve_summary)


def reserve_summary(run_dir: str | os.PathLike, summary: dict[str, Any]) -> None:
    """Write ``summary.json`` small and first (status ``running``), padded with spaces to
    :data:`SUMMARY_RESERVE` bytes: the blocks a failure summary needs later are allocated now, so
    :func:`record_failure` can overwrite the file in place when the disk has filled up since.
    (JSON allows trailing whitespace: readers see only the object.)"""
    text = json.dumps(summary, default=str)
    write_text_atomic(Path(run_dir) / SUMMARY, text + " " * max(0, SUMMARY_RESERVE - len(text.encode("utf-8"))))


def _overwrite_in_place(path: Path, obj: dict[str, Any]) -> None:
    """Overwrite the existing file ``path`` with ``obj`` as JSON without allocating a new file: the
    full object if it fits in the file's size, else only its short fields (status, error cut short,
    label, seed, ...; the config stays in config.json). Raises OSError if even that cannot be done."""
    room = path.stat().st_size
    data = json.dumps(obj, default=str).encode("utf-8")
    if len(data) > room:
        short = {k: v for k, v in obj.items() if k not in ("config", "traceback", "environment")}
        short["error"] = str(short.get("error") or "")[:1000]
        data = json.dumps(short, default=str).encode("utf-8")
    if len(data) > room:
        data = json.dumps({"status": obj.get("status"), "error": str(obj.get("error") or "")[:room // 2]},
                          default=str).encode("utf-8")[:room]
    with open(path, "r+b") as f:
        f.write(data + b" " * (room - len(data)))  # no new blocks: the file keeps its size
        f.flush()
        os.fsync(f.fileno())


def record_failure(run_dir: str | os.PathLike, exc: BaseException, **fields: Any) -> None:
    """Make the run directory say the run failed (``summary.json``, status ``failed``).

    ``fields`` (the trainer passes its whole summary: config, label, traceback) are
    written with the status and the error; without them the fields a previous summary
    holds are kept and only the status and the error are replaced. Never raises: it runs on
    error paths (a full disk included), where the original error is the one to report. When the
    atomic write fails (no space for a new file), the summary reserved at the start
    (:func:`reserve_summary`) is overwritten in place, so a failed run still reads as failed.
    """
    run_dir = Path(run_dir)
    try:
        previous = {} if fields else (read_summary(run_dir) or {})
        obj = {**previous, **fields, "status": STATUS_FAILED, "error": f"{type(exc).__name__}: {exc}"}
    except Exception:  # noqa: BLE001 - see docstring
        return
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json(run_dir / SUMMARY, obj)
    except Exception:  # noqa: BLE001 - see docstring
        try:
            _overwrite_in_place(run_dir / SUMMARY, obj)
        except Exception:  # noqa: BLE001 - nothing reserved, or no disk at all
            pass


def writer_alive(run_dir: str | os.PathLike) -> bool | None:
    """Whether the process named by the run's lock file (``.lock``) is still alive: False when the
    file is missing or empty (released) or names a process of this host that is gone, True when that
    process exists, None when it names another host (this machine cannot tell). Reads only: never
    takes the lock, so it cannot get in a starting writer's way."""
    import socket

    try:
        holder = _holder((Path(run_dir) / LOCK).read_bytes())
    except OSError:
        return False
    if not holder or not isinstance(holder.get("pid"), int):
        return False
    if holder.get("host") != socket.gethostname():
        return None
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it exists, as another user
        return True
    return True


# files a start writes before any compute: a run directory holding only these has no result
_START_FILES = (CONFIG, SUMMARY, LOCK, ".hydra")


def nothing_computed(run_dir: str | os.PathLike) -> bool:
    """True when ``run_dir`` holds only what a run writes before its first step (the lock, its config
    record, a summary that says ``running`` or ``failed``, Hydra's record and log): no metric row,
    no checkpoint, no sample, no tracker run."""
    path = Path(run_dir)
    if not path.is_dir():
        return False
    if any(p.name not in _START_FILES and p.suffix != ".log" for p in path.iterdir()):
        return False
    status = (read_summary(path) or {}).get("status")
    return status in (None, STATUS_RUNNING, STATUS_FAILED)


def remove_if_nothing_computed(run_dir: str | os.PathLike) -> bool:
    """Remove a run directory that a run failed in before its first step (:func:`nothing_computed`), so
    that a bad data path and an unreachable model leave the same thing behind: nothing. Returns True if
    removed."""
    import shutil

    if not nothing_computed(run_dir):
        return False
    shutil.rmtree(run_dir, ignore_errors=True)
    return True


# --------------------------------------------------------------------------- #
# One configuration per run directory                                           #
# --------------------------------------------------------------------------- #
# Keys that do not change what a run computes: where it writes and is named, how it is logged,
# checkpointed (a resume is exact whatever the interval) and launched, free-form notes. Every other key
# of the resolved config changes results. A prefix covers its whole section.
PRESENTATION_KEYS = ("out_dir", "sweep", "preset", "notes", "logger", "run", "model.cache_dir", "model.wheel",
                     "model.package_cache", "checkpoint.every",
                     "checkpoint.keep", "eval.save_samples", "task.verifier_workers", "backend.python",
                     "backend.dry_run", "backend.launch", "backend.slurm")
# Result-changing keys a re-run may still change in the same directory: a longer train.steps continues
# the same trajectory (nothing a step computes depends on the total: the learning-rate schedule is a
# warm-up then constant), so extending a run is a resume, not a mix; the endpoint (eval.endpoint,
# eval.endpoint_k) changes only what the summary reports from evaluations the run logs either way, so a
# sweep begun under another default still skips its finished runs and resumes the others. The analysis
# still tells runs of different lengths or endpoints apart.
EXTENDABLE_KEYS = ("train.steps", "eval.endpoint", "eval.endpoint_k")


def flat_config(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as ``{"a.b": value}`` (lists and other leaves as they are)."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        if isinstance(v, dict) and v:
            out.update(flat_config(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _covered(key: str, prefixes: tuple[str, ...]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def result_config(config: dict[str, Any], ignore: tuple[str, ...] = ()) -> dict[str, Any]:
    """The result-changing part of a resolved config, flat: every key but :data:`PRESENTATION_KEYS`
    (and ``ignore``)."""
    drop = PRESENTATION_KEYS + tuple(ignore)
    return {k: v for k, v in flat_config(config).items() if not _covered(k, drop)}


def config_differences(old: dict[str, Any], new: dict[str, Any],
                       ignore: tuple[str, ...] = ()) -> list[tuple[str, Any, Any]]:
    """``(key, old value, new value)`` for each result-changing key (:func:`result_config`) whose values
    differ, sorted by key. A key present on one side only (a config recorded by another version of the
    schema, which added or removed it) is not a difference."""
    a, b = result_config(old, ignore), result_config(new, ignore)
    return [(k, a[k], b[k]) for k in sorted(a.keys() & b.keys()) if a[k] != b[k]]


def config_hash(config: dict[str, Any], ignore: tuple[str, ...] = ()) -> str:
    """8 hex digits of the result-changing config (:func:`result_config`)."""
    import hashlib

    blob = json.dumps(result_config(config, ignore), sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:8]


# --------------------------------------------------------------------------- #
# A stop asked by a signal                                                      #
# --------------------------------------------------------------------------- #
class RunStopped(BaseException):
    """The run stopped cleanly on a signal (checkpoint and summary written); a re-run resumes it.

    Raised by the lifecycle (:class:`dapo_exp.runner.StopRequest`) and by long set-up work that polls
    :func:`stop_requested` (the warm start); a ``BaseException``, so no ``except Exception`` swallows it."""

    def __init__(self, signame: str) -> None:
        super().__init__(f"stopped by {signame}; re-run the same command to resume")
        self.signame = signame


# a parallel sweep's stop file (its path, set by hydra/launcher=parallel for its workers): written by the sweep's
# own process on its first SIGINT / SIGTERM, so a job stops after its step even when the signal reached only that
# process (``kill <pid>``, not the process group) and no job starts after it
SWEEP_STOP_ENV = "DAPO_SWEEP_STOP"
QUIET_STOP_ENV = "DAPO_QUIET_STOP"  # "1" in a sweep's workers: the sweep's own process says the one line


# --------------------------------------------------------------------------- #
# The command's state                                                           #
# --------------------------------------------------------------------------- #
@dataclass(eq=False)
class CommandState:
    """What one command (one ``python run.py``) learns as it goes and that belongs to no run: the stop under
    way, and the jobs of its sweeps that ended without a result or were refused. ``run.py`` reads it at the
    end for its closing line and exit code. Opened by :func:`command_state`, read whole by
    :func:`current_state`, and through the functions below field by field."""

    # the signal watcher of the run under way (dapo_exp.runner.StopRequest, read for its .signame); None between runs
    stop_source: Any = None
    # the first stop signal received (SIGINT, SIGTERM): a parallel sweep's worker starts no job after it
    received: str | None = None
    # (run directory, why) of each job of a scheduler's sweep (hydra/launcher=slurm) that ended without a result
    lost: list[tuple[str, str]] = field(default_factory=list)
    # the sweep directories run, in order: where run.py looks for the failed and the finished jobs at the end
    sweeps: list[str] = field(default_factory=list)
    # the run directories of the sweep jobs refused in this process (another config, an unwritable directory)
    refused: list[str] = field(default_factory=list)


# The one holder of the state, swapped by command_state(). Outside every command it holds the process's own
# state, which lasts as long as the process: a parallel sweep's worker (a loky process, which runs jobs but no
# command) keeps there a signal received between two jobs, so the next one does not start. A plain holder,
# not a ContextVar: a signal handler and any thread of the process see the command's state as it is.
_current = CommandState()


@contextlib.contextmanager
def command_state() -> Iterator[CommandState]:
    """A fresh :class:`CommandState` for one command: what the functions below read and write until it
    closes, when the state before it is back (the process's own outside every command). ``run.py`` opens one
    per command; a test running several commands in one process opens one for each, so that none of them
    sees another's stop, lost, refused jobs or sweeps."""
    global _current
    before, state = _current, CommandState()
    _current = state
    try:
        yield state
    finally:
        _current = before


def current_state() -> CommandState:
    """The state of the command under way (:func:`command_state`), else the process's own."""
    return _current


def note_lost_job(where: str, why: str) -> None:
    """Record that a job of the sweep under way ended without a result (``hydra/launcher=slurm``: cancelled,
    killed, lost with its node); ``run.py`` names them at the end and exits 1. Once per job, as
    :func:`note_refused_job`."""
    if all(where != seen for seen, _ in _current.lost):
        _current.lost.append((where, why))


def lost_jobs() -> list[tuple[str, str]]:
    """``(run directory, why)`` of the jobs noted by :func:`note_lost_job` in the command under way."""
    return list(_current.lost)


def note_refused_job(where: str) -> None:
    """Record that a job of the sweep under way was refused and did not run (another config in its directory,
    an unwritable directory); ``run.py`` names them at the end and exits 1. Once per job: a launcher that ran
    the job in this process (joblib runs a single job in its caller) notes it again from its return."""
    if where not in _current.refused:
        _current.refused.append(where)


@dataclass(frozen=True)
class RefusedJob:
    """What a sweep job that was refused returns (``run.py``'s job function): where it is. A launcher whose jobs
    run in other processes (``hydra/launcher=parallel``'s workers, a SLURM job) notes it in the command's state
    from the job's return (:func:`note_refused_returns`), since the job's own note stays in its process."""

    where: str


def note_refused_returns(returns: Any) -> None:
    """Note (:func:`note_refused_job`) each job of ``returns`` (Hydra's ``JobReturn`` objects) that was refused: its
    return value is a :class:`RefusedJob`. Jobs that raised are not read (their ``return_value`` re-raises)."""
    for r in returns:
        if getattr(getattr(r, "status", None), "name", "") == "COMPLETED" and isinstance(r.return_value, RefusedJob):
            note_refused_job(r.return_value.where)


def refused_jobs() -> list[str]:
    """The run directories of the jobs noted by :func:`note_refused_job` in the command under way."""
    return list(_current.refused)


def note_signal(signame: str) -> None:
    """Record that this process received ``signame`` (the first one is kept)."""
    _current.received = _current.received or signame


def sweep_stop() -> str | None:
    """In a parallel sweep's worker (:data:`SWEEP_STOP_ENV` set), the signal that stopped the sweep: one
    this process received (:func:`note_signal`), else the sweep's stop file's; else None. Elsewhere (a
    single run, a test process running several runs) always None: a signal stops the run under way only."""
    path = os.environ.get(SWEEP_STOP_ENV)
    if not path:
        return None
    if _current.received:
        return _current.received
    try:
        return Path(path).read_text().strip() or "SIGINT"
    except OSError:
        return None


AGAIN_AFTER_S = 0.01  # how soon a second signal lost in a finalizer is sent again (FinalizerSignals)


class FinalizerSignals:
    """``sys.unraisablehook`` while a stop's signal handlers are installed (the run's, ``runner.StopRequest``; the
    parallel sweep's, ``SweepStop``), for what those handlers raise inside a finalizer (a ``__del__`` the garbage
    collector runs, a weakref callback), where Python cannot raise and would print "Exception ignored" and go on.

    - An exception of a type in ``drop`` (the run's set-up stop, ``RunStopped``, whose request is kept elsewhere)
      is not printed.
    - The second signal's stop-at-once ``KeyboardInterrupt`` (its handler sets :attr:`at_once` before raising) is
      not printed but the same signal is sent again to the main thread :data:`AGAIN_AFTER_S` seconds later, from
      a timer thread (sent from the hook, its handler would run inside the hook, where it cannot raise either),
      so that it is raised once the finalizer has returned, a blocking call (a sleep, a wait) interrupted too; the
      timer is cancelled if the stop's context ends first (nothing left to stop).
    - Anything else goes to the hook that was there, which comes back on exit (unless another was installed since).
    """

    def __init__(self, drop: tuple[type[BaseException], ...] = ()) -> None:
        self.drop = drop
        self.at_once: signal.Signals | None = None  # the second signal, once received
        self._again: threading.Timer | None = None  # that signal sent again

    def _hook(self, info: Any) -> None:
        if isinstance(info.exc_value, self.drop):
            return
        if isinstance(info.exc_value, KeyboardInterrupt) and self.at_once is not None:
            self._again = threading.Timer(AGAIN_AFTER_S, signal.pthread_kill,
                                          args=(threading.main_thread().ident, self.at_once))
            self._again.daemon = True
            self._again.start()
            return
        self._old(info)

    def __enter__(self) -> FinalizerSignals:
        self._old = sys.unraisablehook
        sys.unraisablehook = self._hook
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._again is not None:
            self._again.cancel()
        if sys.unraisablehook == self._hook:
            sys.unraisablehook = self._old


def watch_stop(source: Any) -> None:
    """Register the run's signal watcher (None: the run is over); :func:`stop_requested` reads it."""
    _current.stop_source = source


def stop_requested() -> str | None:
    """The signal (``"SIGINT"``, ``"SIGTERM"``) that asked the run under way in this process to stop, or
    None. Long work outside the loop (the warm start) polls it and raises :class:`RunStopped`."""
    return getattr(_current.stop_source, "signame", None)


# --------------------------------------------------------------------------- #
# One writer per run                                                            #
# --------------------------------------------------------------------------- #
class RunLockedError(RuntimeError):
    """Another live process holds the run directory's lock."""


class RunDirError(RunLockedError):
    """The run directory cannot be written (read-only, or its lock file cannot be opened).

    A :class:`RunLockedError`, so that callers treat it as a run they must not touch:
    ``run.py`` prints it as one ``error:`` line, a sweep skips the job."""


def escaping_links(run_dir: str | os.PathLike) -> list[tuple[Path, Path]]:
    """Each symbolic link under ``run_dir`` whose target (resolved; a dangling link's too) lies outside it, with
    that target: a run writing through one would write elsewhere (``checkpoints/`` as a link: its saves and
    their pruning in the link's target). Links that stay inside (W&B's ``latest-run``) are not listed; a link
    to a folder is not entered. The inside of ``wandb/`` is W&B's own and is not entered: W&B itself links
    each run's ``logs/debug-core.log`` to its cache (``~/.cache/wandb/logs``), and the run writes nothing
    there itself (``wandb/`` as a link leaving the run is still listed)."""
    root = Path(run_dir).resolve()
    found = []
    for folder, dirs, files in os.walk(root):  # followlinks=False
        for name in sorted(dirs + files):
            path = Path(folder) / name
            if path.is_symlink() and not (target := path.resolve()).is_relative_to(root):
                found.append((path, target))
        if Path(folder) == root and "wandb" in dirs:
            dirs.remove("wandb")
    return found


class RunLock:
    """An exclusive lock on a run directory: ``<run>/.lock``, held with ``fcntl.flock``.

    A second writer (a resubmitted job, the same command started twice) is refused
    with a message naming the holder's pid, host and start time. The kernel drops the
    lock when its process dies, so a lock left by a killed run is simply taken over
    (and said so). On filesystems without ``flock`` the lock is a no-op with a warning.

    The lock file's content only names the holder; whether someone holds it is the
    flock's answer. So a damaged lock file (not UTF-8, not a JSON object: a torn write,
    a stray editor) is taken over with a warning when no process holds the flock, and
    refused, naming the path, when one does. A run directory (or lock file) that cannot
    be opened for writing is one :class:`RunDirError` line naming the path, and so is one holding a
    link that leads out of it (:func:`escaping_links`), checked before the lock file is written: a run
    never writes through it.

    Taken once per run: ``run.py`` claims the directory (:func:`dapo_exp.runner.claimed`) and hands the claim
    to the trainer (``train(cfg, claim=...)``), which claims it itself only when called without one. A second
    acquisition by the process that holds the lock is a bug, refused as one (:class:`RuntimeError`).
    """

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.path = Path(run_dir) / LOCK
        self._f = None

    def _open(self):
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return open(self.path, "a+b")  # bytes: whatever the file holds, reading it cannot fail
        except OSError as exc:
            what = exc.strerror or type(exc).__name__
            if isinstance(exc, IsADirectoryError):
                fix = f"remove {self.path} (a directory where the lock file goes), then re-run"
            else:
                fix = (f"make {self.path.parent} writable for this user (or remove an unwritable {self.path.name} "
                       f"there), or point the run elsewhere (out_dir / hydra.run.dir)")
            raise RunDirError(f"cannot write the run directory {self.path.parent}: opening {self.path} failed "
                              f"({what}); {fix}") from None

    def acquire(self) -> RunLock:
        import fcntl
        import socket
        import time

        if links := escaping_links(self.path.parent):
            link, target = links[0]
            raise RunDirError(f"{link} is a link to {target}, outside the run directory {self.path.parent}: a run "
                              f"never writes through it (its files would be written, and its checkpoints pruned, "
                              f"there); replace the link with a folder or file of the run's own (move {target} "
                              f"back), or point the run elsewhere (out_dir / hydra.run.dir)")
        f = self._open()
        locked = True
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = _holder(f.read())
            f.close()
            if holder is not None and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
                raise RuntimeError(f"{self.path.parent} is claimed twice by this process (pid {os.getpid()}): a "
                                   f"run's directory is claimed once, and the claim handed on (train(cfg, claim=...))") from None
            if holder is None:  # held, but the file does not say by whom
                raise RunLockedError(
                    f"{self.path.parent} is in use by another process (its lock file {self.path} is unreadable, so "
                    f"it does not say which; `fuser {self.path}` does); wait for it to end or stop it, then re-run"
                ) from None
            raise RunLockedError(
                f"{self.path.parent} is in use by pid {holder.get('pid', '?')} on {holder.get('host', '?')} "
                f"(since {holder.get('started', '?')}); wait for it to end or stop it, then re-run"
            ) from None
        except OSError as exc:  # no flock on this filesystem
            import logging

            logging.getLogger(__name__).warning("cannot lock %s (%s); running without a lock", self.path, exc)
            locked = False
        f.seek(0)
        previous = _holder(f.read())
        if previous is None:
            nobody = "no process holds it" if locked else "this filesystem cannot tell whether a process holds it"
            print(f"[dapo-exp] warning: taking over {self.path.parent.name}: its lock file {self.path} was "
                  f"unreadable (damaged) and {nobody}; rewriting it", flush=True)
        elif previous.get("pid"):
            print(f"[dapo-exp] taking over {self.path.parent.name}: its last writer (pid {previous['pid']} on "
                  f"{previous.get('host', '?')}) is gone", flush=True)
        try:
            f.seek(0)
            f.truncate()
            f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                "started": time.strftime("%Y-%m-%d %H:%M:%S")}).encode("utf-8"))
            f.flush()
        except OSError as exc:
            with contextlib.suppress(OSError):  # closing flushes the unwritten record again (a full disk: fails
                f.close()                         # again); the file is closed and the flock dropped all the same
            raise RunDirError(f"cannot write the run directory {self.path.parent}: writing {self.path} failed "
                              f"({exc.strerror or type(exc).__name__}); free space or make it writable, "
                              f"then re-run") from None
        self._f = f
        return self

    def release(self) -> None:
        if self._f is None:
            return
        try:
            self._f.seek(0)
            self._f.truncate()  # an empty lock file: nobody to take over from
            self._f.close()  # closing drops the flock
        finally:
            self._f = None

    def wait_until_free(self, poll_s: float = 1.0) -> None:
        """Block until no process holds the lock (polled, so that a signal stops the wait), holding
        nothing afterwards. For a sweep job whose run another process is running (the same sweep
        started twice): it waits for that run to end, then takes it up (a finished run is skipped)."""
        import fcntl
        import time

        while True:
            try:
                with open(self.path, "rb") as f:
                    fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)  # closing the file releases it
                return
            except BlockingIOError:
                time.sleep(poll_s)
            except OSError:  # gone, or a filesystem without flock: nothing to wait for
                return

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _holder(data: bytes) -> dict[str, Any] | None:
    """Who the lock file names: ``{}`` if it is empty (released cleanly or never written), the
    JSON object it holds, or None if it is damaged (not UTF-8, not JSON, not an object)."""
    if not data.strip():
        return {}
    try:
        obj = json.loads(data.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError and JSONDecodeError both
        return None
    return obj if isinstance(obj, dict) else None
