"""Where a job runs: ``backend=native`` (this package's trainer, :func:`dapo_exp.train.train`) or
another engine that the resolved config is translated to.

:data:`BACKENDS` maps ``backend.name`` to a launcher ``fn(cfg, claim) -> summary`` (``claim``: the run directory
when the caller has claimed it already, else None); ``native`` is not in it
(``dapo_exp.train.train`` runs it itself and calls :func:`launch` for every other name). Import-light:
the launchers are imported when picked.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from dapo_exp.registry import Registry

BACKENDS: Registry[Callable[[Any, Path | None], dict]] = Registry("backend", "backend.name")


def _verl(cfg: Any, claim: Path | None) -> dict:
    from dapo_exp.backends.verl_launch import launch

    return launch(cfg, claim=claim)


BACKENDS.register("verl", _verl)


def launch(cfg: Any, claim: Path | None = None) -> dict:
    """Run the job ``cfg`` on ``cfg.backend.name`` (not ``native``); returns its summary. ``claim``: the run
    directory, already claimed by the caller (:func:`dapo_exp.runner.claimed`), or None (the launcher locks it)."""
    return BACKENDS.pick(cfg.backend.name)(cfg, claim)
