"""Save and resume a run: weights (safetensors), optimizer, scheduler, RNG states,
data position, step and whatever else the trainer puts in ``state``.

A checkpoint is written to a temporary directory and renamed into place, so a run
killed while saving leaves the previous checkpoint intact. ``latest`` finds the
newest complete one.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_model, save_model

WEIGHTS = "model.safetensors"
STATE = "trainer_state.pt"


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(
    ckpt_root: str | os.PathLike,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    state: dict[str, Any],
    keep: int = 2,
) -> Path:
    """Write ``<ckpt_root>/step_<step>/`` atomically and prune to the newest ``keep``."""
    root = Path(ckpt_root)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):  # left by a run killed while saving
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".tmp-"))
    save_model(model, str(tmp / WEIGHTS))
    torch.save(
        {
            "step": step,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": rng_state(),
            "state": state,
        },
        tmp / STATE,
    )
    final = root / f"step_{step:07d}"
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in sorted(root.glob("step_*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest(ckpt_root: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint directory, or None."""
    root = Path(ckpt_root)
    if not root.exists():
        return None
    done = [p for p in sorted(root.glob("step_*")) if (p / STATE).exists() and (p / WEIGHTS).exists()]
    return done[-1] if done else None


def load(
    path: str | os.PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any
) -> tuple[int, dict[str, Any]]:
    """Restore everything saved by :func:`save`; returns ``(step, state)``."""
    path = Path(path)
    load_model(model, str(path / WEIGHTS))
    blob = torch.load(path / STATE, weights_only=False)
    optimizer.load_state_dict(blob["optimizer"])
    scheduler.load_state_dict(blob["scheduler"])
    set_rng_state(blob["rng"])
    return blob["step"], blob["state"]
