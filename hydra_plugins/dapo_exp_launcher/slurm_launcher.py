"""``hydra/launcher=slurm``: the plugin's submitit SLURM launcher, with a sweep that outlives a lost job.

``hydra-submitit-launcher`` submits the sweep as one array job and then waits for the results in
order, raising at the first job that did not complete: one ``scancel`` (or a node failure, or a job
killed for memory) ends the sweep command with a submitit traceback while the other jobs run on,
and no table is printed. This subclass submits the same way (its executor's settings are the
plugin's) but waits for every job: a job that ended without a result is named, by its run
directory and its SLURM state, in one line; the others' results go on to the analysis; and
``run.py`` exits 1 at the end naming the lost jobs (:func:`dapo_exp.rundir.lost_jobs`). Running the
same command again resumes them from their checkpoints (finished runs are skipped).

Everything else (``__call__`` in the job, ``checkpoint`` for the time-limit warning's requeue) is
the plugin's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus

try:  # the extra `slurm`; without it this module must still import (Hydra's plugin scan imports it)
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as _PluginLauncher
except ImportError:  # pragma: no cover - exercised where the extra is not installed
    _PluginLauncher = None

class _Missing:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise ImportError('hydra/launcher=slurm needs hydra-submitit-launcher: pip install -e ".[slurm]"')


class SlurmLauncher(_PluginLauncher or _Missing):  # type: ignore[misc]
    """The plugin's ``SlurmLauncher``; :meth:`launch` waits for every job and names the lost ones."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import submitit

        jobs: list[Any] = []
        real = submitit.AutoExecutor.map_array

        def keep(executor: Any, fn: Any, *iterables: Any) -> list[Any]:
            jobs.extend(real(executor, fn, *iterables))
            return [_NO_WAIT] * len(jobs)

        # the plugin builds the executor and submits as it always does (its settings, its array job); only
        # the wait for the results is ours: its map_array is wrapped for this call, its wait made a no-op
        submitit.AutoExecutor.map_array = keep
        try:
            super().launch(job_overrides, initial_job_idx)
        finally:
            submitit.AutoExecutor.map_array = real
        return [self._result(job, list(overrides)) for job, overrides in zip(jobs, job_overrides)]

    def _result(self, job: Any, overrides: list[str]) -> JobReturn:
        """The job's own result, or (it ended without one: cancelled, killed, failed outside the task) a
        completed return with nothing in it, the job named in :func:`dapo_exp.rundir.note_lost_job`."""
        from submitit.core.utils import FailedJobError, UncompletedJobError

        from dapo_exp import rundir

        try:
            return job.results()[0]
        except (UncompletedJobError, FailedJobError) as exc:
            where = self._job_dir(overrides)
            state = job.state
            first = next((ln for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
            why = f"SLURM job {job.job_id} ended {state} without a result ({first.strip()[:160]})"
            print(f"[dapo-exp] {where}: {why}", flush=True)
            rundir.note_lost_job(where, why)
            return JobReturn(overrides=overrides, working_dir=where, status=JobStatus.COMPLETED,
                             _return_value=None)

    def _job_dir(self, overrides: list[str]) -> str:
        """The run directory of the job with these overrides (as Hydra names it), else its overrides."""
        try:
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
            sweep = cfg.hydra.sweep
            return str(Path(str(sweep.dir)) / str(sweep.subdir))
        except Exception:  # noqa: BLE001 - a name for a message: the overrides do as well
            return " ".join(overrides)


class _NoWait:
    """Stands in for a submitted job in the plugin's own wait: its ``results()`` returns at once (the
    real wait, job by job, is :meth:`SlurmLauncher._result`)."""

    def results(self) -> list[None]:
        return [None]


_NO_WAIT = _NoWait()
