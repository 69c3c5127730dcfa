"""Entry point: ``python run.py [overrides]`` trains one run; ``python run.py -m ...`` a sweep.

A thin ``@hydra.main`` wrapper over :func:`dapo_exp.train.train`, which tests call
directly with a composed config. ``python run.py -m --cfg job <sweep>`` prints the
config of every job of the sweep without running it. In a multirun, a job that
fails is recorded (``summary.json`` with ``status: failed``) and the sweep goes on;
a single run re-raises. Config errors (bad values, unknown keys, composition errors)
are printed as one line without a traceback (:mod:`dapo_exp.cli_errors`), and a single
run that fails before its first step (a bad value, a missing data file, an unreachable hub
model) leaves no directory behind (:func:`dapo_exp.rundir.remove_if_nothing_computed`; a sweep
keeps such a job's directory, marked ``failed``, for its list of failed jobs).
Before anything of the run directory is written (Hydra's ``.hydra/`` record included: Hydra is
told not to write it, :func:`dapo_exp.hydra_setup.write_hydra_record` writes it after), the
directory is locked (a second writer is refused, exit 1) and the config it records is compared
with this one (:func:`dapo_exp.runner.claimed`): another result-changing config is refused in one
line naming the keys (exit 2), unless ``run.on_config_change=restart|branch``. A multirun without
``sweep=`` is named after its swept overrides (``multirun/fixes=grpo,clip,clip_ds,full``).
SIGTERM / SIGINT stop a run cleanly after its current step (exit code 128 + the signal); a
second signal stops it at once, with one line (the run recorded as failed, its checkpoints kept).
A multirun whose jobs failed (or were refused: another config, an unwritable directory) runs the
others, prints their table, then one line counting those jobs and the finished ones and naming the command
as given, which takes them up again; exit 1. A sweep job whose run another process is
running (the same sweep started twice at once) waits for it, then takes the run up: a finished run
is skipped, so both commands end in success and each run is trained once. ``sweep=`` must name a directory inside ``multirun/`` (refused before anything is
written otherwise). torch's thread count is chosen per run before any compute
(:func:`dapo_exp.hydra_setup.choose_threads`: ``DAPO_THREADS`` / ``OMP_NUM_THREADS`` if set, one
thread for the toy, else the free cores) and logged. See docs/reference/cli.md.
"""

import copy
import logging
import os
import re
import sys
import time

from dapo_exp.quiet import quiet

quiet()  # third-party noise off before anything imports it (dapo_exp.quiet)

import hydra
from omegaconf import DictConfig

try:  # the package's fixes, then the outside ones (DAPO_EXP_FIXES, entry points): before the schema is assembled
    import dapo_exp.fixes  # noqa: F401
except ImportError as exc:  # an outside fix module that cannot be imported: one line naming it, exit 2
    from dapo_exp.fixes.base import ExtensionError

    if not isinstance(exc, ExtensionError):
        raise
    print(f"error: {exc}", file=sys.stderr)
    raise SystemExit(2) from None

from dapo_exp import rundir
from dapo_exp.cli_errors import check_known_keys, exit_if_config_error, one_line_errors
from dapo_exp.hydra_setup import (
    check_repeated_overrides,
    check_sweep_name,
    default_sweep_name,
    dry_run_sweep,
    job_output_dir,
    move_log_files,
    register_resolvers,
    set_gc,
    set_threads,
    write_hydra_record,
)
from dapo_exp.preflight import precheck
from dapo_exp.rundir import RunDirError, RunLockedError, record_failure, recorded_threads, remove_if_nothing_computed

CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conf")
register_resolvers()
log = logging.getLogger("run")


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | rundir.RefusedJob | None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from dapo_exp.runner import ConfigChangedError

    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    task_cfg = copy.deepcopy(cfg)  # as Hydra composed it: what .hydra/config.yaml records
    cfg.out_dir = job_output_dir()
    if multirun:  # jobs run in this process: run.py checks them at the end
        from dapo_exp.analysis.callback import note_sweep

        note_sweep(HydraConfig.get().sweep.dir)
    try:
        check_known_keys(cfg)  # a `+key=...` the schema does not declare would be silently ignored
        try:
            summary = run_job(cfg, task_cfg)
        except RunLockedError as exc:
            if not multirun or isinstance(exc, RunDirError):
                raise
            # the same sweep started twice: its twin runs this job now; wait, then take it up (a finished
            # run is skipped, a stopped or failed one resumed) instead of calling the sweep refused
            print(f"[dapo-exp] job {cfg.out_dir}: {' '.join(str(exc).split())}; waiting for it to end, then taking "
                  "the run up from there", file=sys.stderr, flush=True)
            rundir.RunLock(cfg.out_dir).wait_until_free()
            summary = run_job(cfg, task_cfg)
    except (RunLockedError, ConfigChangedError) as exc:  # another writer, or another config: touch nothing
        if not multirun:
            print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
            raise SystemExit(1 if isinstance(exc, RunLockedError) else 2) from None
        print(f"[dapo-exp] job {cfg.out_dir} skipped: {exc}", file=sys.stderr, flush=True)  # not its log file
        rundir.note_refused_job(str(cfg.out_dir))  # this process's command: the jobs of an in-process launcher
        return rundir.RefusedJob(str(cfg.out_dir))  # a launcher whose jobs run elsewhere notes it from here
    except Exception as exc:
        if not multirun:
            remove_if_nothing_computed(cfg.out_dir)  # failed before its first step: no run directory
            exit_if_config_error(exc, CONFIG_DIR)  # one line, no traceback
            exit_if_run_failure(exc, cfg.out_dir)  # one line, the traceback in run.log, exit 3
            raise  # anything else is a bug: its traceback, exit 1
        record_failure(cfg.out_dir, exc)  # a sweep keeps a failed job's directory, marked failed
        log.exception("job %s failed; the sweep goes on (status recorded in summary.json)", cfg.out_dir)
        return None
    return (summary or {}).get("final", {}).get("eval/acc_avg")


def run_job(cfg: DictConfig, task_cfg: DictConfig) -> dict | None:
    """One job: its directory locked and its recorded config checked before anything of it is written
    (:func:`dapo_exp.runner.claimed`), Hydra's record written, torch's threads set (a resumed run keeps its own
    count: :func:`dapo_exp.hydra_setup.choose_threads`), then the run."""
    from dapo_exp.runner import claimed
    from dapo_exp.train import train

    with claimed(cfg) as out:
        if str(out) != job_output_dir():  # run.on_config_change=branch
            move_log_files(job_output_dir(), out)
        write_hydra_record(out, task_cfg)
        threads, why = set_threads(cfg, recorded=recorded_threads(out))  # before any compute
        set_gc()  # a launcher's worker process too (dapo_exp.hydra_setup.GC_YOUNG)
        log.info("torch threads: %d (%s)", threads, why)
        return train(cfg, claim=out)  # claimed once, here: the trainer takes the claim over


def run_failures() -> tuple[type[BaseException], ...]:
    """What a run can meet that is not a bug: divergence, a collapsed policy at dynamic sampling's cap, no
    usable checkpoint, a checkpoint or another file of the run that cannot be written (a full disk). Their
    messages name the cause and the fix."""
    from dapo_exp.checkpoint import CheckpointError, CheckpointWriteError
    from dapo_exp.rollout.dynamic_sampling import DynamicSamplingCapError
    from dapo_exp.rundir import RunWriteError
    from dapo_exp.runner import TrainingDiverged

    return TrainingDiverged, DynamicSamplingCapError, CheckpointError, CheckpointWriteError, RunWriteError


def exit_if_run_failure(exc: BaseException, out_dir: str) -> None:
    """A run failure (:func:`run_failures`) ends a single run in one line on stderr, naming its log; the
    traceback goes to the run's log file only; exit code 3 (2: a refusal, 1: a bug or a failed sweep)."""
    if not isinstance(exc, run_failures()):
        return
    import traceback

    text = "".join(traceback.format_exception(exc))
    where = ""
    for handler in [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]:
        try:
            if handler.stream is None:  # the job log opens at its first line: none yet
                handler.stream = handler._open()
            handler.stream.write(text)
            handler.flush()
            if os.path.exists(handler.baseFilename):  # not removed with a run directory where nothing was computed
                where = where or f" (traceback: {handler.baseFilename})"
        except OSError:  # no log to write (a full disk, its directory removed): the line alone
            pass
    print(f"error: {' '.join(str(exc).split())}{where}", file=sys.stderr, flush=True)
    raise SystemExit(3) from None


def failed_sweep_jobs(since: float) -> list[tuple[str, str]]:
    """After ``main()``: the jobs of the multirun just ended that failed (none for a single run)."""
    from dapo_exp.analysis.callback import failed_jobs, noted_sweeps

    return [job for sweep_dir in noted_sweeps() for job in failed_jobs(sweep_dir, since)]


def finished_sweep_jobs() -> int:
    """After ``main()``: how many jobs of the multirun's sweep directories have finished (its table's runs)."""
    from dapo_exp.analysis.callback import finished_runs, noted_sweeps

    return sum(len(finished_runs(sweep_dir)) for sweep_dir in noted_sweeps())


def as_given(argv: list[str]) -> str:
    """The command line as given (every override, the launcher's included), each word as the shell must pass it."""
    from dapo_exp.console import shell_word

    return " ".join(["python run.py", *map(shell_word, argv)])


def sweep_end_line(*, failed: list[tuple[str, str]], lost: list[tuple[str, str]], refused: list[str], finished: int,
                   rerun: str) -> str | None:
    """The closing line of a sweep some of whose jobs did not finish, else None: how many failed (an error
    they all share said once), ended without a result or were refused, how many of the sweep have finished,
    and ``rerun``, the command as given (every override, the launcher): it takes up only those jobs."""
    done = f"{finished} finished" if finished else "none finished"
    if failed:
        errors = {error for _, error in failed}
        same = f", each with the same error: {errors.pop()}" if len(failed) > 1 and len(errors) == 1 else ""
        return (f"error: {len(failed)} job(s) of the sweep failed, {done}{same}: {', '.join(d for d, _ in failed)}; "
                f"each one's summary.json has its error and traceback; `{rerun}` again re-runs only them")
    if lost:
        return (f"error: {len(lost)} job(s) of the sweep ended without a result, {done}: "
                f"{'; '.join(f'{d} ({why})' for d, why in lost)}; `{rerun}` again resumes them from their checkpoints")
    if refused:
        return (f"error: {len(refused)} job(s) of the sweep were refused and did not run, {done}: {', '.join(refused)} "
                f"(each one's reason is printed above); `{rerun}` again runs them once that is mended")
    return None


def interrupted(exc: KeyboardInterrupt) -> int:
    """One line for a run stopped at once (a second SIGTERM / SIGINT, or Ctrl-C before the loop); the exit code."""
    import signal

    found = re.search(r"\((SIG[A-Z]+)\)", str(exc))
    name = found.group(1) if found else "SIGINT"
    what = "a second " + name if found else name
    print(f"[dapo-exp] stopped at once by {what}: a run under way is recorded as failed with its checkpoints "
          "kept; re-run the same command to resume", file=sys.stderr, flush=True)
    return 128 + int(getattr(signal, name, signal.SIGINT))


if __name__ == "__main__":
    set_gc()  # the collector walks torch's and transformers' objects less often (dapo_exp.hydra_setup.GC_YOUNG)
    try:
        with one_line_errors(CONFIG_DIR):
            check_sweep_name(sys.argv[1:])  # sweep=../../x: refused before anything is written
            check_repeated_overrides(sys.argv[1:])  # fixes=gspo fixes=cispo: refused, not the last one silently
            # a multirun that names no sweep is named after what it sweeps (its directory and W&B group)
            sys.argv += [f"sweep='{name}'"] if (name := default_sweep_name(sys.argv[1:])) else []  # quoted: , and =
            precheck(sys.argv[1:], CONFIG_DIR)  # before torch: config errors, a sweep's cost, what jobs need
            if not dry_run_sweep(sys.argv[1:], CONFIG_DIR):
                from dapo_exp.train import RunStopped

                started = time.time()
                with rundir.command_state() as state:  # this command's stop, sweeps, lost and refused jobs
                    try:
                        main()
                    except RunStopped as stop:  # SIGTERM / SIGINT: checkpointed and recorded; exit as the signal asks
                        import signal

                        sys.exit(128 + int(getattr(signal, stop.signame)))
                    if line := sweep_end_line(failed=failed_sweep_jobs(started), lost=state.lost, refused=state.refused,
                                              finished=finished_sweep_jobs(), rerun=as_given(sys.argv[1:])):
                        print(line, file=sys.stderr)
                        sys.exit(1)
    except KeyboardInterrupt as exc:
        sys.exit(interrupted(exc))
