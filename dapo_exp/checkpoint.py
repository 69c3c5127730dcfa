"""Save and resume a run: weights (safetensors), optimizer, scheduler, RNG states,
data position, step and whatever else the trainer puts in ``state``.

A checkpoint directory ``step_<n>/`` holds three files:

- ``model.safetensors``: the weights (safetensors: a JSON header and raw tensors, no code);
- ``trainer_state.pt``: optimizer, scheduler, RNG states, step and the trainer's ``state``,
  written with ``torch.save`` and read back with ``torch.load(weights_only=True)``, which
  only rebuilds tensors and plain containers (dict, list, tuple, str, numbers, None): a
  file that names any other Python callable (a crafted pickle whose ``__reduce__`` runs a
  command) is refused, never executed. Everything is stored in that form: the RNG states
  as ints, lists and tensors, and the dataclasses the trainer keeps in ``state`` (the
  dynamic-sampling carry-over ``Group`` objects) as tagged dicts that :func:`load` turns
  back into instances of the classes registered with :func:`register_restorable` only
  (each by the module that owns it);
- ``manifest.json``: the size and SHA-256 of the two files, written last.

Writes are atomic and durable: the files go to a temporary directory, each file and the
directory are fsynced, the directory is renamed into place and the parent is fsynced,
so a kill or a power loss leaves either the complete checkpoint or none. A write that
fails (a full disk) removes its temporary directory and raises
:class:`CheckpointWriteError` naming the checkpoint and the cause.

:func:`latest` verifies checkpoints newest first (manifest sizes and checksums, the
safetensors header, finite weights, the trainer state loadable in weights-only mode) and
returns the newest good one, logging each one it skips with the file and the reason. A
checkpoint without its manifest is damaged (the writer always writes one): it is skipped
too. If checkpoints exist but none is usable it raises :class:`CheckpointError` instead of
starting over. :func:`save` refuses weights or an optimizer state that are not finite (a diverged
run): the last good checkpoint stays the newest. Verification covers the checkpoint whole: the
trainer state's step must equal its directory's and its manifest's, and the optimizer's moments must
be finite; with ``fits=`` (:func:`check_fits`, as the runner resumes) a checkpoint whose weights or
optimizer moments are shaped for another model is skipped too, naming the file, before anything is
loaded. What no check catches: a checkpoint changed on purpose and re-hashed into its manifest with
finite, well-shaped values.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import logging
import os
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_model, save_model

log = logging.getLogger(__name__)

WEIGHTS = "model.safetensors"
STATE = "trainer_state.pt"
MANIFEST = "manifest.json"
FORMAT = 2  # 1: trainer_state.pt was an unrestricted pickle (refused: it can run code)
STEP_DIR = re.compile(r"step_(\d+)")

# The only classes a checkpoint may re-create, "module:qualname" -> class, registered by the
# modules that own them (dapo_exp.rollout.groups registers the dynamic-sampling groups the
# trainer's state carries over to the next step, algo.ds_surplus=carry).
RESTORABLE: dict[str, type] = {}
_TAG = "__dataclass__"


def register_restorable(cls: type) -> type:
    """Allow checkpoints to store and re-create instances of the dataclass ``cls``."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} is not a dataclass")
    RESTORABLE[_class_name(cls)] = cls
    return cls


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used; the message names the file and the reason."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (e.g. no space left); nothing partial was left behind."""


# --------------------------------------------------------------------------- #
# RNG states as plain data                                                      #
# --------------------------------------------------------------------------- #
def rng_state() -> dict[str, Any]:
    """Python, numpy, torch (and CUDA) RNG states as ints, lists and tensors."""
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state(legacy=False)
    state = {
        "python": [version, list(internal), gauss],
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": [int(x) for x in np_state["state"]["key"]],
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the states returned by :func:`rng_state`."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state({
        "bit_generator": n["bit_generator"],
        "state": {"key": np.asarray(n["key"], dtype=np.uint32), "pos": n["pos"]},
        "has_gauss": n["has_gauss"],
        "gauss": n["gauss"],
    })
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --------------------------------------------------------------------------- #
# State <-> weights-only-safe data                                              #
# --------------------------------------------------------------------------- #
def _class_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _encode(obj: Any, where: str) -> Any:
    """``obj`` as tensors and plain containers; a dataclass of :data:`RESTORABLE` as a tagged dict.

    Raises TypeError naming ``where`` for anything a weights-only load could not restore, so
    that an unsupported value fails when saving, not when resuming.
    """
    if obj is None or isinstance(obj, (bool, int, float, str, torch.Tensor)):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        name = _class_name(type(obj))
        if name not in RESTORABLE:
            raise TypeError(f"checkpoint: {where} is a {name}, which is not in checkpoint.RESTORABLE")
        fields = {f.name: _encode(getattr(obj, f.name), f"{where}.{f.name}") for f in dataclasses.fields(obj)}
        return {_TAG: name, "fields": fields}
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if not (k is None or isinstance(k, (bool, int, float, str))):
                raise TypeError(f"checkpoint: {where} has a key of type {type(k).__name__}: {k!r}")
            out[k] = _encode(v, f"{where}[{k!r}]")
        return out
    if isinstance(obj, (list, tuple)):
        items = [_encode(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return items if isinstance(obj, list) else tuple(items)
    raise TypeError(
        f"checkpoint: {where} is a {type(obj).__name__}; a checkpoint stores tensors, plain Python values "
        f"and the dataclasses in checkpoint.RESTORABLE only"
    )


def _decode(obj: Any, file: Path) -> Any:
    if isinstance(obj, dict):
        if _TAG in obj:
            name = obj[_TAG]
            if name not in RESTORABLE:
                raise CheckpointError(f"{file}: names the class {name!r}, which a checkpoint may not create")
            cls = RESTORABLE[name]
            try:
                return cls(**{k: _decode(v, file) for k, v in obj["fields"].items()})
            except TypeError as exc:  # fields renamed since the checkpoint was written
                raise CheckpointError(f"{file}: cannot rebuild a {name} from its fields ({exc})") from exc
        return {k: _decode(v, file) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v, file) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_decode(v, file) for v in obj)
    return obj


# --------------------------------------------------------------------------- #
# Durable writes                                                                #
# --------------------------------------------------------------------------- #
def fsync_path(path: Path) -> None:
    """Flush a file's or a directory's data and metadata to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def manifest_files(directory: Path, names: Any) -> dict[str, dict[str, Any]]:
    """``{name: {"bytes", "sha256"}}`` of the files ``names`` in ``directory``: what a manifest lists."""
    return {n: {"bytes": (directory / n).stat().st_size, "sha256": sha256_file(directory / n)} for n in names}


def manifest_problem(directory: Path, manifest: Path, required: Any = ()) -> str | None:
    """Why the files of ``directory`` disagree with ``manifest`` (a missing manifest included), naming
    the file; None when every listed file (and every name in ``required`` is listed) matches."""
    if not manifest.is_file():
        return f"{manifest}: missing (it is written last, so the files it would vouch for are incomplete or damaged)"
    try:
        listed = json.loads(manifest.read_text())["files"]
        files = {str(name): (int(w["bytes"]), str(w["sha256"])) for name, w in listed.items()}
    except (ValueError, KeyError, TypeError, AttributeError, OSError) as exc:
        return f"{manifest}: unreadable ({_first_line(exc)})"
    for name in required:
        if name not in files:
            return f"{manifest}: does not list {name}"
    for name, (size, sha) in files.items():
        file = directory / name
        if not file.is_file():
            return f"{file}: missing (the manifest lists it)"
        actual = file.stat().st_size
        if actual != size:
            return f"{file}: {actual} bytes, the manifest says {size} (truncated?)"
        if sha256_file(file) != sha:
            return f"{file}: SHA-256 differs from the manifest (corrupted)"
    return None


def first_nonfinite(named_tensors: Any) -> str | None:
    """``"<name> has <n> nan and <m> inf of <k> values"`` for the first floating tensor of
    ``(name, tensor)`` pairs holding a NaN or an infinity; None when all are finite. One device
    synchronisation when all are finite (the common case)."""
    named = [(n, t) for n, t in named_tensors if torch.is_tensor(t) and t.is_floating_point()]
    if not named or bool(torch.stack([torch.isfinite(t).all() for _, t in named]).all()):
        return None
    for name, t in named:
        if not bool(torch.isfinite(t).all()):
            return (f"{name} has {int(torch.isnan(t).sum())} nan and {int(torch.isinf(t).sum())} inf "
                    f"of {t.numel()} values")
    return None


def _step_of(path: Path) -> int | None:
    m = STEP_DIR.fullmatch(path.name)
    return int(m.group(1)) if m else None


def _step_dirs(root: Path) -> list[Path]:
    """``step_<n>`` directories, oldest first."""
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if _step_of(p) is not None), key=_step_of)


def _write_error(final: Path, exc: BaseException) -> CheckpointWriteError:
    code = exc.errno if isinstance(exc, OSError) and exc.errno else errno.EIO
    try:
        free = f"{shutil.disk_usage(final.parent).free / 2**20:.0f} MiB free there now"
    except OSError:
        free = "free space unknown"
    return CheckpointWriteError(
        code,
        f"could not write checkpoint {final} ({type(exc).__name__}: {exc}; {free}). Its temporary directory was "
        f"removed and the earlier checkpoints are intact. Free disk space (or lower checkpoint.keep, or move "
        f"out_dir to a larger filesystem) and run the same command again to resume",
        str(final),
    )


def save(
    ckpt_root: str | os.PathLike,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    state: dict[str, Any],
    keep: int = 2,
) -> Path:
    """Write ``<ckpt_root>/step_<step>/`` atomically and durably, then prune.

    Pruning keeps the newest ``keep`` checkpoints and removes any checkpoint newer than
    ``step``: those belong to a timeline this run abandoned (they failed verification when
    it resumed from an older one). Raises :class:`CheckpointWriteError` (an ``OSError``)
    if writing fails; the temporary directory is removed first.
    """
    root = Path(ckpt_root)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):  # left by a run killed while saving
        shutil.rmtree(stale, ignore_errors=True)
    final = root / f"step_{step:07d}"
    for what, tensors in (("weights", model.state_dict().items()),
                          ("optimizer state", optimizer_tensors(optimizer.state_dict()))):
        if bad := first_nonfinite(tensors):
            raise CheckpointError(f"refusing to write checkpoint {final}: the {what} {'are' if what == 'weights' else 'is'} "
                                  f"not finite ({bad}); the earlier checkpoints are kept")
    # encoded before touching the disk: a value that cannot be stored safely fails here
    blob = _encode(
        {
            "format": FORMAT,
            "step": step,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": rng_state(),
            "state": state,
        },
        "checkpoint",
    )
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".tmp-"))
    try:
        save_model(model, str(tmp / WEIGHTS))
        torch.save(blob, tmp / STATE)
        files = manifest_files(tmp, (WEIGHTS, STATE))
        (tmp / MANIFEST).write_text(json.dumps({"format": FORMAT, "step": step, "files": files}, indent=1))
        for name in (WEIGHTS, STATE, MANIFEST):
            fsync_path(tmp / name)
        fsync_path(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_path(root)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, Exception):
            raise _write_error(final, exc) from exc
        raise  # KeyboardInterrupt, SystemExit: as they are
    _prune(root, step, keep)
    return final


def _prune(root: Path, step: int, keep: int) -> None:
    """Keep the newest ``keep`` checkpoints up to ``step``; remove those newer (an abandoned timeline)."""
    dirs = _step_dirs(root)
    abandoned = [p for p in dirs if _step_of(p) > step]
    for p in abandoned:
        log.warning("removing checkpoint %s: newer than step %d, from a timeline this run abandoned", p, step)
    current = [p for p in dirs if _step_of(p) <= step]
    for old in abandoned + current[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


# --------------------------------------------------------------------------- #
# Verified reads                                                                #
# --------------------------------------------------------------------------- #
def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def read_state(path: str | os.PathLike, mmap: bool = False) -> dict[str, Any]:
    """The trainer-state blob of checkpoint ``path``, loaded weights-only (no code can run).

    Raises :class:`CheckpointError` naming the file when it is unreadable, not in the
    weights-only format (corrupt, written before format 2, or crafted) or incomplete.
    """
    file = Path(path) / STATE
    try:
        blob = torch.load(file, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # noqa: BLE001 - any failure means: not usable
        raise CheckpointError(
            f"{file}: cannot be loaded as plain data ({_first_line(exc)}). It is corrupt, was written by a "
            f"dapo-exp older than checkpoint format {FORMAT} (an unrestricted pickle), or was not written by "
            f"dapo-exp; it is refused rather than unpickled"
        ) from exc
    want = ("format", "step", "optimizer", "scheduler", "rng", "state")
    if not isinstance(blob, dict) or any(k not in blob for k in want):
        raise CheckpointError(f"{file}: not a dapo-exp trainer state (expected the keys {', '.join(want)})")
    if blob["format"] != FORMAT:
        raise CheckpointError(f"{file}: checkpoint format {blob['format']!r}, this dapo-exp reads format {FORMAT}")
    try:
        blob["state"] = _decode(blob["state"], file)
    except (KeyError, TypeError, AttributeError, ImportError) as exc:
        raise CheckpointError(f"{file}: malformed trainer state ({_first_line(exc)})") from exc
    return blob


def verify(path: str | os.PathLike) -> None:
    """Raise :class:`CheckpointError` (naming the file and the problem) unless checkpoint ``path``
    is complete and readable: its manifest (required: the writer always writes one) and the sizes
    and SHA-256 it lists, the safetensors header, finite weights, and the trainer state loadable
    weights-only. Without a manifest, the other checks still run first, for the most specific reason."""
    path = Path(path)
    try:
        for name in (WEIGHTS, STATE):
            if not (path / name).is_file():
                raise CheckpointError(f"{path / name}: missing")
        # verified already by this process, unchanged since (the run's look before it resumes, then resume())
        seen = _identity(path)
        if seen in _VERIFIED:
            return
        manifest = path / MANIFEST
        if not manifest.is_file():
            _verify_readable(path)
            raise CheckpointError(
                f"{manifest}: missing, so {path / WEIGHTS} and {path / STATE} cannot be verified (the writer always "
                f"writes a manifest, last: this checkpoint is incomplete or was damaged)")
        problem = manifest_problem(path, manifest, required=(WEIGHTS, STATE))
        if problem:
            raise CheckpointError(problem)
        _verify_readable(path)
        _VERIFIED.add(seen)
    except OSError as exc:
        raise CheckpointError(f"{path}: {_first_line(exc)}") from exc


_VERIFIED: set[tuple] = set()


def _identity(path: Path) -> tuple:
    """A checkpoint's files as the file system describes them (inode, size, modification time)."""
    return (str(path.resolve()),) + tuple(
        (n, st.st_ino, st.st_size, st.st_mtime_ns) for n in (WEIGHTS, STATE, MANIFEST)
        if (st := (path / n).stat() if (path / n).exists() else None) is not None)


def _verify_readable(path: Path) -> None:
    """The safetensors header and finite tensors, and the trainer state loadable weights-only."""
    try:
        with safe_open(str(path / WEIGHTS), framework="pt") as f:
            bad = None
            for k in f.keys():  # one tensor in memory at a time
                bad = first_nonfinite([(k, f.get_tensor(k))])
                if bad:
                    break
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{path / WEIGHTS}: not a readable safetensors file ({_first_line(exc)})") from exc
    if bad:
        raise CheckpointError(f"{path / WEIGHTS}: the weights are not finite ({bad}; written by a diverged run)")
    blob = read_state(path, mmap=True)
    file = path / STATE
    # the step: the directory's name, the trainer state's and the manifest's must agree (a state moved or
    # copied into another step's directory would re-train or skip steps)
    named = _step_of(path)
    try:
        listed = json.loads((path / MANIFEST).read_text()).get("step") if (path / MANIFEST).is_file() else None
    except (ValueError, AttributeError, OSError):
        listed = None
    if not isinstance(blob["step"], int) or (named is not None and blob["step"] != named) \
            or (listed is not None and listed != blob["step"]):
        raise CheckpointError(f"{file}: says step {blob['step']!r}, but its directory is {path.name}"
                              + (f" and its manifest says step {listed}" if listed is not None else "")
                              + " (moved or copied from another checkpoint)")
    try:
        bad = first_nonfinite(optimizer_tensors(blob["optimizer"]))
    except (TypeError, AttributeError, KeyError) as exc:
        raise CheckpointError(f"{file}: malformed optimizer state ({_first_line(exc)})") from exc
    if bad:
        raise CheckpointError(f"{file}: the optimizer state is not finite ({bad}); resuming from it would diverge")


def optimizer_tensors(opt_state: dict[str, Any]) -> list[tuple[str, torch.Tensor]]:
    """``("optimizer state <param index>.<name>", tensor)`` for every tensor of an optimizer's state dict
    (AdamW's ``exp_avg``, ``exp_avg_sq``, ``step``)."""
    return [(f"optimizer state {i}.{name}", t) for i, per in opt_state["state"].items()
            for name, t in per.items() if torch.is_tensor(t)]


def check_fits(path: str | os.PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Raise :class:`CheckpointError` naming the file unless checkpoint ``path`` can be loaded into ``model``
    and ``optimizer`` as they are built: the same weight names and shapes, the same number of optimized
    tensors, and every per-parameter optimizer tensor (AdamW's moments) shaped as its parameter. Reads
    headers and the memory-mapped state only; changes nothing."""
    path = Path(path)
    sd = model.state_dict()
    want = {k: tuple(v.shape) for k, v in sd.items()}
    try:
        with safe_open(str(path / WEIGHTS), framework="pt") as f:
            have = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except (SafetensorError, ValueError, RuntimeError, OSError) as exc:
        raise CheckpointError(f"{path / WEIGHTS}: not a readable safetensors file ({_first_line(exc)})") from exc
    # tensors that share storage (tied embeddings) are saved once, under one of their names
    storage: dict[int, set[str]] = {}
    for k, v in sd.items():
        storage.setdefault(v.untyped_storage().data_ptr(), set()).add(k)
    missing = sorted(k for k in set(want) - set(have)
                     if not any(o in have for o in storage[sd[k].untyped_storage().data_ptr()]))
    wrong = sorted(k for k in set(want) & set(have) if want[k] != have[k])
    if missing or wrong or set(have) - set(want):
        what = (f"{wrong[0]} is {list(have[wrong[0]])}, the model's is {list(want[wrong[0]])}" if wrong
                else f"missing {missing[0]}" if missing else f"an unknown tensor {sorted(set(have) - set(want))[0]}")
        raise CheckpointError(f"{path / WEIGHTS}: does not fit the model ({what}): another model.path or shape")
    file = path / STATE
    params = [p for g in optimizer.param_groups for p in g["params"]]
    opt_state = read_state(path, mmap=True)["optimizer"]
    try:
        n_saved = sum(len(g["params"]) for g in opt_state["param_groups"])
        shapes = [(i, name, tuple(t.shape)) for i, per in opt_state["state"].items()
                  for name, t in per.items() if torch.is_tensor(t) and t.dim() > 0]
    except (TypeError, AttributeError, KeyError) as exc:
        raise CheckpointError(f"{file}: malformed optimizer state ({_first_line(exc)})") from exc
    if n_saved != len(params):
        raise CheckpointError(f"{file}: its optimizer state holds {n_saved} tensors, the model has {len(params)}")
    for i, name, shape in shapes:
        if not isinstance(i, int) or not 0 <= i < len(params) or shape != tuple(params[i].shape):
            where = list(params[i].shape) if isinstance(i, int) and 0 <= i < len(params) else "no such parameter"
            raise CheckpointError(f"{file}: optimizer state {i}.{name} is shaped {list(shape)}, its parameter {where}")


def latest(ckpt_root: str | os.PathLike, fits: Any = None, warn: bool = True) -> Path | None:
    """The newest checkpoint that passes :func:`verify` (and ``fits(path)``, e.g. :func:`check_fits` for
    the model being resumed, when given), or None if there is no checkpoint. ``warn=False``: skips are
    not logged (a look before the run that resumes, which logs them).

    Each newer one that fails is skipped with a warning naming the file and the reason.
    If checkpoints exist but none passes, raises :class:`CheckpointError` listing them:
    starting over silently would throw the run's progress away.
    """
    root = Path(ckpt_root)
    skipped: list[str] = []
    for p in reversed(_step_dirs(root)):
        try:
            verify(p)
            if fits is not None:
                fits(p)
        except CheckpointError as exc:
            if not p.exists():  # pruned by a writer while we looked
                continue
            skipped.append(f"{p.name}: {exc}")
            if warn:
                log.warning("checkpoint %s skipped: %s", p, exc)
            continue
        if skipped and warn:
            log.warning("resuming from %s, the newest checkpoint that verifies", p)
        return p
    if skipped:
        raise CheckpointError(
            f"no usable checkpoint in {root}: " + "; ".join(skipped)
            + f". To start this run over, move or delete {root}"
        )
    return None


def load(
    path: str | os.PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any
) -> tuple[int, dict[str, Any]]:
    """Restore everything saved by :func:`save`; returns ``(step, state)``.

    Raises :class:`CheckpointError` naming the file if the checkpoint cannot be used.
    """
    path = Path(path)
    blob = read_state(path)
    try:
        load_model(model, str(path / WEIGHTS))
    except (SafetensorError, OSError, RuntimeError) as exc:
        raise CheckpointError(f"{path / WEIGHTS}: cannot be loaded into the model ({_first_line(exc)})") from exc
    optimizer.load_state_dict(blob["optimizer"])
    scheduler.load_state_dict(blob["scheduler"])
    set_rng_state(blob["rng"])
    return blob["step"], blob["state"]
