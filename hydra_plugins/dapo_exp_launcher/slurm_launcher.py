"""``hydra/launcher=slurm``: the sweep as one SLURM array job (submitit), and a sweep that outlives a lost job.

``hydra-submitit-launcher`` submits the sweep as one array job and then waits for the results in
order, raising at the first job that did not complete: one ``scancel`` (or a node failure, or a job
killed for memory) ends the sweep command with a submitit traceback while the other jobs run on,
and no table is printed. This subclass does the launch itself: it builds submitit's executor with the
plugin's settings (:func:`executor_settings`: the same ``sbatch`` lines as ``hydra/launcher=submitit_slurm``
would write), submits the same array job, and then waits for every job: a job that ended without a
result is named, by its run directory and its SLURM state, in one line; the others' results go on to
the analysis; and ``run.py`` exits 1 at the end naming the lost jobs (:func:`dapo_exp.rundir.lost_jobs`).
Running the same command again resumes them from their checkpoints (finished runs are skipped).

What runs in the job is the plugin's own: ``__call__`` (the job composes its config and runs) and
``checkpoint`` (the time-limit warning's requeue) are inherited, so each job is submitted with the
plugin's arguments, in the plugin's order.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus

try:  # the extra `slurm`; without it this module must still import (Hydra's plugin scan imports it)
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as _PluginLauncher
except ImportError:  # pragma: no cover - exercised where the extra is not installed
    _PluginLauncher = None

log = logging.getLogger(__name__)

# the plugin's settings that go to submitit's executor when it is built, not to update_parameters
INIT_KEYS = ("submitit_folder", "max_num_timeout")


class _Missing:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise ImportError('hydra/launcher=slurm needs hydra-submitit-launcher: pip install -e ".[slurm]"')


def executor_settings(params: Mapping[str, Any], cluster: str = "slurm") -> tuple[dict[str, Any], dict[str, Any]]:
    """The keyword arguments of ``submitit.AutoExecutor(cluster=cluster, **init)`` and of its
    ``update_parameters(**update)`` for the launcher's settings ``params`` (``hydra.launcher`` without
    ``_target_``), as ``hydra-submitit-launcher`` passes them, so that a sweep submits what the plugin's
    documentation and ``hydra/launcher=submitit_slurm`` promise: the folder of submitit's files and the
    number of requeues after a time-out are the executor's own (``max_num_timeout`` as
    ``slurm_max_num_timeout``); the settings every submitit executor knows (``BaseQueueConf``: ``timeout_min``,
    ``gpus_per_node``, ``mem_gb``, ...) keep their names; the others are SLURM's (``partition`` as
    ``slurm_partition``)."""
    from omegaconf import OmegaConf

    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf

    common = set(OmegaConf.structured(BaseQueueConf).keys())
    init = {"folder": params["submitit_folder"]}
    if "max_num_timeout" in params:
        init[f"{cluster}_max_num_timeout"] = params["max_num_timeout"]
    update = {key if key in common else f"{cluster}_{key}": value
              for key, value in params.items() if key not in INIT_KEYS}
    return init, update


class SlurmLauncher(_PluginLauncher or _Missing):  # type: ignore[misc]
    """The plugin's ``SlurmLauncher`` whose :meth:`launch` submits the array job itself and waits for
    every job, naming the lost ones."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """Submit one array job of ``job_overrides`` (numbered from ``initial_job_idx``), then wait for each
        job in turn (:meth:`_result`); a job lost on the way is a result with nothing in it, not an error."""
        import submitit
        from hydra.core.singleton import Singleton
        from hydra.core.utils import filter_overrides

        from dapo_exp import rundir

        if not job_overrides:  # nothing to submit: no executor, no sweep directory, no submitit warning
            return []
        init, update = executor_settings(self.params, self._EXECUTOR)
        executor = submitit.AutoExecutor(cluster=self._EXECUTOR, **init)
        executor.update_parameters(**update)
        self._make_sweep_dir()
        calls = []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            # the arguments of the inherited __call__ (and of checkpoint's resubmission), in its order
            calls.append((list(overrides), "hydra.sweep.dir", idx, f"job_id_for_{idx}", Singleton.get_state()))
        jobs = executor.map_array(self, *zip(*calls))
        returns = [self._result(job, list(overrides)) for job, overrides in zip(jobs, job_overrides)]
        rundir.note_refused_returns(returns)  # a job refused in its SLURM job's process: named by run.py at the end
        return returns

    def _make_sweep_dir(self) -> None:
        """Create the sweep directory before the jobs start (each job writes its run directory inside it, and
        submitit's folder is under it), with ``hydra.sweep.mode`` (octal) where the config sets one."""
        sweep = self.config.hydra.sweep
        log.info(f"Submitit '{self._EXECUTOR}' sweep output dir : {sweep.dir}")
        sweep_dir = Path(str(sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        if "mode" in sweep:
            os.chmod(sweep_dir, mode=int(str(sweep.mode), 8))

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
