"""Experiment tracking: a W&B run or a no-op one, behind the same three methods.

The training loop never branches on logging: it calls ``tracker.log(...)``
whatever the backend. A W&B failure (import, init, or a log call) is reported
once and turns the tracker into a no-op; it never kills training. W&B runs are
offline by default (no network, no account); ``wandb sync <run>/wandb/offline-run-*``
uploads them later. An online run whose ``wandb.init`` fails (no network, server down,
no credentials) waits at most :data:`INIT_TIMEOUT_S` seconds (``WANDB_INIT_TIMEOUT``
overrides it; W&B's own default is 90 s) and then logs offline, with a warning.

:meth:`WandbTracker.describe` is the one line a run prints about where W&B writes (offline: the
folder and the ``wandb sync`` command; online: the run's URL). Offline W&B cannot continue a run:
a run that logs offline under an id that already has offline folders in its directory (a resumed
run) removes them and replays its history (the rows of ``metrics.jsonl`` it kept) into a fresh
one, so each run directory holds one complete offline run (:func:`remove_offline_runs`).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path
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
    mode: str | None = None
    where: str | None = None

    def describe(self) -> str | None:
        """No line: nothing is logged outside the run directory's own files."""
        return None

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
        settings = getattr(run, "settings", None)
        self.mode: str | None = getattr(settings, "mode", None)
        # where the run goes: its URL online, the wandb folder offline
        self.where: str | None = None
        try:
            if self.mode == "online":
                self.where = run.url
            elif settings is not None:
                self.where = str(settings.wandb_dir).rstrip("/\\")
        except Exception:  # noqa: BLE001 - a description never stops training
            pass

    @property
    def offline(self) -> bool:
        """Whether the run logs offline (into its folder, uploaded later by ``wandb sync``)."""
        return self.mode in ("offline", "dryrun")

    def describe(self) -> str | None:
        """One line: where W&B writes and in which mode (what a run prints when its tracker starts)."""
        if self.offline and self.where:
            return f"W&B offline: {self.where} (upload later: wandb sync {self.where}/offline-run-*)"
        if self.mode == "online" and self.where:
            return f"W&B online: {self.where}"
        return f"W&B {self.mode}" if self.mode else None

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

    def replay(self, history: Iterable[dict[str, Any]]) -> None:
        """Log rows ``{"step": s, **metrics}`` again, in order (a resumed run's history, into its fresh
        offline folder), as the runner logged them: ``log(metrics, s)``."""
        for row in history:
            self.log({k: v for k, v in row.items() if k != "step"}, row["step"])

    def summary(self, values: dict[str, Any]) -> None:
        def _set() -> None:
            for k, v in values.items():
                self.run.summary[k] = v

        self._guard("summary", _set)

    def finish(self, exit_code: int = 0) -> None:
        """Finish the run and stop this process's W&B service: the service writes the run's
        ``.wandb`` file asynchronously, and without the stop the file can still lack its last
        records (even all history) when ``finish()`` returns (wandb 0.31; seen as a flaky CI test)."""
        self._guard("finish", self.run.finish, exit_code=exit_code)
        try:
            import wandb

            wandb.teardown()
        except Exception as exc:  # noqa: BLE001 - logging must never kill training
            log.warning("W&B service stop failed (%s)", exc)


def _define_axes(run: Any) -> None:
    """The x axes of the metric families and the best evaluation in the W&B summary."""
    run.define_metric(STEP_METRIC)
    for pattern, axis in STEP_AXES.items():
        run.define_metric(pattern, step_metric=axis)
    run.define_metric("eval/acc_avg", summary="max,last")


def wandb_folder(root: str | os.PathLike) -> Path:
    """The folder W&B writes its runs into under ``root`` (``wandb.init(dir=root)``): ``root/wandb``,
    or ``root/.wandb`` where that exists (W&B's own rule)."""
    dot = Path(root) / ".wandb"
    return dot if dot.is_dir() else Path(root) / "wandb"


def offline_runs(wandb_dir: str | os.PathLike, run_id: str) -> list[Path]:
    """The offline W&B folders of run ``run_id`` in ``wandb_dir`` (``offline-run-<time>-<id>``)."""
    d = Path(wandb_dir)
    return sorted(p for p in d.glob(f"offline-run-*-{run_id}") if p.is_dir()) if d.is_dir() else []


def remove_offline_runs(wandb_dir: str | os.PathLike, run_id: str) -> list[Path]:
    """Remove the offline folders of run ``run_id`` in ``wandb_dir`` (before a fresh offline run of
    that id replaces them: offline W&B cannot continue a run, each start would add a folder);
    returns what was removed. W&B's service of this process is stopped first when there is
    something to remove (a run of this process may still be writing into it)."""
    old = offline_runs(wandb_dir, run_id)
    if old:
        import wandb

        wandb.teardown()
        for p in old:
            shutil.rmtree(p, ignore_errors=True)
        latest = Path(wandb_dir) / "latest-run"
        if latest.is_symlink() and not latest.exists():
            latest.unlink(missing_ok=True)
    return old


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
    history: Iterable[dict[str, Any]] | None = None,
) -> NullTracker | WandbTracker:
    """Start a tracker. ``backend="none"`` (or any failure) gives a :class:`NullTracker`.

    ``run_id`` makes a resumed run continue its W&B run: online ``resume="allow"``; offline, the earlier
    folders of ``run_id`` are removed and ``history`` (rows ``{"step": s, **metrics}``) is logged again
    into a fresh one. A run that cannot start online within the init timeout logs offline, with a warning.
    """
    if backend == "none" or mode == "disabled":
        return NullTracker()
    try:
        import wandb

        os.makedirs(out_dir, exist_ok=True)
        timeout = float(os.environ.get("WANDB_INIT_TIMEOUT", INIT_TIMEOUT_S))

        def init(run_mode: str):
            if (offline := run_mode in ("offline", "dryrun")) and run_id:
                remove_offline_runs(wandb_folder(out_dir), run_id)
            return wandb.init(
                project=project, entity=entity, group=group, name=name, tags=tags, config=config, dir=out_dir,
                mode=run_mode, id=run_id, resume=None if offline or not run_id else "allow", reinit="finish_previous",
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
        tracker = WandbTracker(run)
        if run_id and tracker.offline:
            tracker.replay(history or ())
        return tracker
    except Exception as exc:  # noqa: BLE001
        log.warning("could not start W&B (%s); continuing without it", exc)
        return NullTracker()
