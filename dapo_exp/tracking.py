"""Experiment tracking: a W&B run or a no-op one, behind the same three methods.

The training loop never branches on logging: it calls ``tracker.log(...)``
whatever the backend. A W&B failure (import, init, or a log call) is reported
once and turns the tracker into a no-op; it never kills training. W&B runs are
offline by default (no network, no account); ``wandb sync <run>/wandb/offline-run-*``
uploads them later. An online run whose ``wandb.init`` fails (no network, server down,
no credentials) waits at most :data:`INIT_TIMEOUT_S` seconds (``WANDB_INIT_TIMEOUT``
overrides it; W&B's own default is 90 s) and then logs offline, with a warning.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

log = logging.getLogger(__name__)

# Metric namespaces and the x-axis each is plotted against in the W&B workspace.
STEP_METRIC = "train/step"
STEP_AXES = {
    "actor/*": STEP_METRIC,
    "critic/*": STEP_METRIC,
    "response_length/*": STEP_METRIC,
    "dynamic_sampling/*": STEP_METRIC,
    "reward/*": STEP_METRIC,
    "timing_s/*": STEP_METRIC,
    "perf/*": STEP_METRIC,
    "compute/*": STEP_METRIC,
    "rollout/*": STEP_METRIC,
    "optim/*": STEP_METRIC,
    "eval/*": STEP_METRIC,
}
# Seconds wandb.init may take in online mode before the run falls back to offline logging.
INIT_TIMEOUT_S = 20.0


class NullTracker:
    """Does nothing; same interface as :class:`WandbTracker`."""

    backend = "none"
    run_dir: str | None = None

    def log(self, metrics: dict[str, Any], step: int) -> None:  # noqa: D102
        pass

    def summary(self, values: dict[str, Any]) -> None:  # noqa: D102
        pass

    def finish(self, exit_code: int = 0) -> None:  # noqa: D102
        pass


class WandbTracker:
    """A W&B run; every call is guarded so a logging failure never stops training."""

    backend = "wandb"

    def __init__(self, run: Any) -> None:
        self.run = run
        self.run_dir = getattr(run, "dir", None)
        self._failed = False

    def _guard(self, what: str, fn, *args, **kwargs) -> None:
        if self._failed:
            return
        try:
            fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - logging must never kill training
            self._failed = True
            log.warning("W&B %s failed (%s); continuing without W&B", what, exc)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self._guard("log", self.run.log, {STEP_METRIC: step, **metrics}, step=step)

    def summary(self, values: dict[str, Any]) -> None:
        def _set() -> None:
            for k, v in values.items():
                self.run.summary[k] = v

        self._guard("summary", _set)

    def finish(self, exit_code: int = 0) -> None:
        self._guard("finish", self.run.finish, exit_code=exit_code)


def _define_axes(run: Any) -> None:
    """The x axes of the metric families and the best evaluation in the W&B summary."""
    run.define_metric(STEP_METRIC)
    for pattern, axis in STEP_AXES.items():
        run.define_metric(pattern, step_metric=axis)
    run.define_metric("eval/acc_avg", summary="max,last")


def start_tracker(
    backend: str,
    *,
    out_dir: str,
    config: dict[str, Any],
    project: str,
    group: str | None,
    name: str,
    tags: list[str],
    mode: str = "offline",
    entity: str | None = None,
    run_id: str | None = None,
) -> NullTracker | WandbTracker:
    """Start a tracker. ``backend="none"`` (or any failure) gives a :class:`NullTracker`.

    ``run_id`` makes a resumed run continue the same W&B run (``resume="allow"``). A run that
    cannot start in ``mode`` (online: no network, no credentials) within the init timeout
    falls back to offline logging with a warning.
    """
    if backend == "none" or mode == "disabled":
        return NullTracker()
    try:
        import wandb

        os.makedirs(out_dir, exist_ok=True)
        timeout = float(os.environ.get("WANDB_INIT_TIMEOUT", INIT_TIMEOUT_S))

        def init(run_mode: str):
            return wandb.init(
                project=project, entity=entity, group=group, name=name, tags=tags, config=config, dir=out_dir,
                mode=run_mode, id=run_id, resume="allow" if run_id else None, reinit="finish_previous",
                settings=wandb.Settings(silent=True, console="off", x_disable_stats=True, init_timeout=timeout),
            )

        t0 = time.monotonic()
        try:
            run = init(mode)
        except Exception as exc:  # noqa: BLE001
            if mode == "offline":
                raise
            log.warning(
                "W&B %s start failed after %.0f s (%s); logging offline instead into %s/wandb "
                "(upload later: wandb sync %s/wandb/offline-run-*)",
                mode, time.monotonic() - t0, str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                out_dir, out_dir,
            )
            # the failed attempt still holds the run id in W&B's service process: stop it first
            wandb.teardown()
            run = init("offline")
        _define_axes(run)
        return WandbTracker(run)
    except Exception as exc:  # noqa: BLE001
        log.warning("could not start W&B (%s); continuing without it", exc)
        return NullTracker()
