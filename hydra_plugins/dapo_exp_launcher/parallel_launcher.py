"""``hydra/launcher=parallel``: the jobs of a sweep side by side on one CPU machine, every core busy.

A thin layer over the Hydra plugin ``hydra-joblib-launcher`` (joblib's ``loky`` process pool):
it picks how many jobs run at once and how many threads each gets so that
``jobs x threads = cores``, sets those threads in every worker (``OMP_NUM_THREADS`` and the
other thread-pool variables before the worker starts, and ``torch.set_num_threads`` at the
start of every job), then hands the sweep to joblib. Why: at the toy's size one step is
bound by per-op overhead, and a second thread barely speeds up generation, so two one-thread
jobs side by side do far more per second than one two-thread job.

Worker processes are reused from job to job: a worker pays the imports once, not once per job.
A job that raises is recorded as failed by ``run.py`` and the others go on (``run.py`` exits 1
at the end, naming the failed jobs); a worker process
that dies (killed, out of memory) stops the sweep, and running the same command again resumes
it (finished jobs are skipped).

SIGINT (Ctrl-C, which reaches the whole process group) or SIGTERM (to the group, or to the sweep's
own process only) stops the sweep as it stops a single run (:class:`SweepStop`): the sweep's process
says so in one line and writes the sweep's stop file; every running job finishes its step, writes a
checkpoint and a summary ``stopped``; no job starts after it (a job not started leaves nothing
behind); the workers exit and the sweep exits with 128 + the signal after one closing line. Running
the same command again resumes it. A second signal stops everything at once (the running jobs are
recorded ``failed``, their checkpoints kept).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

log = logging.getLogger(__name__)

# what the worker processes read their thread-pool sizes from (OpenMP: torch's CPU kernels)
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


class Plan(NamedTuple):  # (not a dataclass: Hydra's plugin scan runs this module outside sys.modules)
    jobs: int  # jobs at once
    threads: int  # threads per job
    cores: int  # cores shared


def available_cores() -> int:
    """The CPUs this process may run on (its affinity mask, else ``os.cpu_count()``)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def plan(n_jobs: int, *, jobs: int | None = None, threads: int | None = None, cores: int | None = None) -> Plan:
    """Jobs at once and threads per job for a sweep of ``n_jobs`` on ``cores`` (None = :func:`available_cores`).

    Unset values fill the cores: ``jobs = min(n_jobs, cores // threads)`` (``threads`` = 1 when
    unset too), then ``threads = cores // jobs``. So 12 jobs on 2 cores run 2 x 1 thread, 2 jobs
    on 16 cores run 2 x 8 threads. Values given are kept as they are (even if they oversubscribe).
    """
    cores = cores or available_cores()
    for name, value in (("jobs", jobs), ("threads_per_job", threads), ("cores", cores)):
        if value is not None and value < 1:
            raise ValueError(f"hydra.launcher.{name} must be >= 1 or null, got {value}")
    if jobs is None:
        jobs = max(1, min(n_jobs, cores // (threads or 1)))
    return Plan(jobs=jobs, threads=threads or max(1, cores // jobs), cores=cores)


@contextmanager
def worker_environ(values: dict[str, str]) -> Iterator[None]:
    """``values`` set in the environment while the pool starts (its workers inherit them), then restored."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def worker_threads(threads: int) -> dict[str, str]:
    """The thread-pool variables, each set to ``threads`` (:func:`worker_environ`)."""
    return {k: str(threads) for k in THREAD_VARS}


STOP_FILE = ".stop"  # in the sweep directory while a stop is under way (its content: the signal's name)
NOT_STARTED, STOPPED = "not started: the sweep was stopped", "stopped with a checkpoint"  # what such jobs return


def _worker_signal(signum: int, frame: Any) -> None:
    """A worker's handler between jobs: the signal is noted (no job starts after it), nothing is raised
    (loky's worker would die of the ``KeyboardInterrupt``, and the sweep with it)."""
    from dapo_exp import rundir

    rundir.note_signal(signal.Signals(signum).name)


class WithThreads:
    """The task function, run with ``threads`` torch threads (picklable: it travels to the workers).

    In the worker it also keeps the sweep's stop: SIGINT / SIGTERM between jobs are noted, not raised;
    a job asked to start after a stop (a signal this worker received, or the sweep's stop file) does not
    start and leaves nothing behind (it returns :data:`NOT_STARTED`); a job stopped cleanly (:class:`dapo_exp.rundir.RunStopped`: its
    checkpoint and summary ``stopped`` written) returns :data:`STOPPED`, so the pool waits for the other jobs to do
    the same instead of killing them."""

    def __init__(self, task_function: TaskFunction, threads: int) -> None:
        self.task_function, self.threads = task_function, threads

    def __call__(self, cfg: DictConfig) -> Any:
        import torch

        from dapo_exp import rundir
        from dapo_exp.hydra_setup import job_output_dir

        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                if signal.getsignal(s) is not _worker_signal:
                    signal.signal(s, _worker_signal)
        if rundir.sweep_stop():
            rundir.remove_if_nothing_computed(job_output_dir())  # Hydra made its directory: nothing in it
            return NOT_STARTED
        torch.set_num_threads(self.threads)
        try:
            return self.task_function(cfg)
        except rundir.RunStopped as stop:  # its checkpoint and summary "stopped" are written
            rundir.note_signal(stop.signame)
            return STOPPED


class SweepStop:
    """The sweep's own process during the pool's work: the first SIGINT / SIGTERM says in one line what
    happens and writes the stop file (``<sweep dir>/.stop``, which every job reads at each step boundary);
    the second raises ``KeyboardInterrupt`` (stop at once). Installed only in the main thread.

    A second signal that lands while a finalizer runs (a ``__del__``, a weakref callback: Python cannot raise
    there, and would print it as "Exception ignored" and go on waiting for the pool) is not printed but sent
    again a moment later (:class:`dapo_exp.rundir.FinalizerSignals`), as a single run's is (``runner.StopRequest``)."""

    def __init__(self, sweep_dir: str) -> None:
        from dapo_exp import rundir

        self.path = Path(sweep_dir) / STOP_FILE
        self.signame: str | None = None
        self._old: dict[int, Any] = {}
        self._finalizers = rundir.FinalizerSignals()  # a second signal raised in a finalizer: sent again

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.signame is not None:
            self._finalizers.at_once = signal.Signals(signum)
            raise KeyboardInterrupt(f"second signal ({name}): stopping at once")
        self.signame = name
        self.path.write_text(name)
        print(f"[dapo-exp] {name}: the sweep stops: each running job finishes its step and writes a checkpoint, "
              "no other job starts; send it again to stop at once", file=sys.stderr, flush=True)

    def __enter__(self) -> SweepStop:
        self.path.unlink(missing_ok=True)  # a stop file left by a sweep killed before it could remove it
        self._finalizers.__enter__()
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._finalizers.__exit__(*exc)
        self.path.unlink(missing_ok=True)


class ParallelLauncher(Launcher):
    """``hydra/launcher=parallel`` (conf/hydra/launcher/parallel.yaml): :func:`plan`, then hydra-joblib-launcher."""

    def __init__(self, jobs: int | None = None, threads_per_job: int | None = None,
                 cores: int | None = None, verbose: int = 0) -> None:
        self.jobs, self.threads_per_job, self.cores, self.verbose = jobs, threads_per_job, cores, verbose
        self.context: dict[str, Any] = {}

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.context = {"hydra_context": hydra_context, "task_function": task_function, "config": config}
        try:  # run.py looks there for failed jobs when the sweep ends (the jobs run in worker processes)
            from dapo_exp.analysis.callback import note_sweep

            note_sweep(config.hydra.sweep.dir)
        except Exception:  # noqa: BLE001 - only the exit code depends on it
            pass

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        try:  # imported here: a missing plugin fails when this launcher is picked, not at every Hydra start
            from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher
        except ImportError as exc:
            raise ImportError("hydra/launcher=parallel needs hydra-joblib-launcher (a dependency of dapo-exp): "
                              "pip install -e . (or pip install hydra-joblib-launcher)") from exc
        p = plan(len(job_overrides), jobs=self.jobs, threads=self.threads_per_job, cores=self.cores)
        log.info("parallel launcher: %d jobs, %d at once x %d threads on %d cores",
                 len(job_overrides), p.jobs, p.threads, p.cores)
        pool = JoblibLauncher(n_jobs=p.jobs, verbose=self.verbose)
        pool.setup(**{**self.context, "task_function": WithThreads(self.context["task_function"], p.threads)})
        sweep_dir = Path(str(self.context["config"].hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        with worker_environ(worker_threads(p.threads) | worker_env(sweep_dir / STOP_FILE)), \
                SweepStop(str(sweep_dir)) as stop:
            returns = pool.launch(job_overrides, initial_job_idx)
        from dapo_exp import rundir

        rundir.note_refused_returns(returns)  # a worker's own note stays in the worker: run.py's closing line reads ours
        if stop.signame:
            told = [r.return_value if r.status.name == "COMPLETED" else None for r in returns]
            print(f"[dapo-exp] sweep stopped by {stop.signame}: {told.count(STOPPED)} job(s) stopped with a "
                  f"checkpoint, {told.count(NOT_STARTED)} not started; re-run the same command to resume",
                  file=sys.stderr, flush=True)
            raise rundir.RunStopped(stop.signame)
        return returns


def worker_env(stop_file: Path) -> dict[str, str]:
    """The workers' view of the sweep's stop (:func:`worker_environ`): where its stop file is, and that
    the sweep's process says the one line."""
    from dapo_exp import rundir

    return {rundir.SWEEP_STOP_ENV: str(stop_file), rundir.QUIET_STOP_ENV: "1"}
