"""Hydra callback: the launch line at the start of every multirun, the comparison table and curves at its end.

Enabled in conf/config.yaml (``hydra.callbacks.analysis``). Before the first job,
:meth:`AnalysisCallback.on_multirun_start` prints the sweep's launch line (:func:`launch_plan`: runs,
configurations x seeds, the runs left, and what they cost: GPU-hours for a GPU preset, the expected
wall time on this machine for the toy) and refuses, exit 2, a sweep :func:`cost_refusal` refuses
(``run.py`` has refused it already, before Hydra started: :func:`dapo_exp.preflight.precheck`).
After the last job of
a sweep, :meth:`AnalysisCallback.on_multirun_end` analyses the sweep directory
(``hydra.sweep.dir``), writes ``<sweep dir>/analysis/`` (table.md/.csv/.tex,
effects.md/.csv/.tex, runs.csv, figures/) and prints the table and the figure
directory. When the sweep's runs log to W&B (``logger.backend=wandb``), the
analysis is logged too, as one run with job_type "analysis" in the sweep's group
and the runs' project and mode. It never raises: a failing analysis prints a
warning and the sweep's result stands.

After the table it names the jobs of this sweep that failed (:func:`failed_jobs`: a
``summary.json`` with status ``failed`` written since the sweep started); ``run.py`` then
exits non-zero, the other jobs having finished. The sweep directories of the process are
noted (:func:`note_sweep`: by this callback, by ``run.py``'s job function when the jobs run
in-process, by ``hydra/launcher=parallel``) so that ``run.py`` finds the failures even with
the callback removed (``~hydra.callbacks.analysis``).

This module imports only Hydra at import time (Hydra instantiates callbacks for
every run, single runs included); the analysis (pandas, matplotlib) is imported
when a multirun ends. Nothing here imports torch or the trainer.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback


def note_sweep(sweep_dir: Any) -> None:
    """Remember that the command under way runs a sweep into ``sweep_dir`` (for :func:`noted_sweeps`; kept in
    its :class:`dapo_exp.rundir.CommandState`)."""
    from dapo_exp import rundir

    sweeps = rundir.current_state().sweeps
    if sweep_dir is not None and str(sweep_dir) not in sweeps:
        sweeps.append(str(sweep_dir))


def noted_sweeps() -> list[str]:
    """The sweep directories noted by :func:`note_sweep` in the command under way, in order."""
    from dapo_exp import rundir

    return list(rundir.current_state().sweeps)


class AnalysisCallback(Callback):
    """``on_multirun_end``: run :func:`dapo_exp.analysis.report.run_analysis` over the sweep dir.

    ``out_subdir``: where under the sweep dir the files go; ``figures``: draw the curves.
    """

    def __init__(
        self, out_subdir: str = "analysis", figures: bool = True, band: str = "ci", wandb: bool | None = None
    ) -> None:
        self.out_subdir = out_subdir
        self.figures = figures
        self.band = band
        # None: log to W&B when the runs do (logger.backend == "wandb"); True / False: always / never
        self.wandb = wandb
        self.started = time.time()  # reset by on_multirun_start

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        self.started = time.time()
        refusal = None
        try:
            note_sweep(config.hydra.sweep.dir)
            print(launch_plan(config), flush=True)
            refusal = cost_refusal(config)
        except Exception:  # noqa: BLE001 - never fail a sweep
            pass
        if refusal:  # run.py refuses it before Hydra starts (preflight.precheck); this is the backstop
            print(f"error: {refusal}", file=sys.stderr, flush=True)
            raise SystemExit(2)  # not an Exception: Hydra's callback runner lets it through

    def _wandb_log(self, config: Any) -> dict | None:
        logger = config.get("logger") if hasattr(config, "get") else None
        backend = logger.get("backend") if logger is not None else None
        if self.wandb is False or (self.wandb is None and backend != "wandb"):
            return None
        mode = (logger.get("mode") if logger is not None else None) or "offline"
        if mode == "disabled":
            return None
        group = (logger.get("group") if logger is not None else None) or None
        return {"project": (logger.get("project") if logger is not None else None) or "dapo-exp",
                "mode": mode, "group": group}

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        try:
            import os

            sweep_dir = str(config.hydra.sweep.dir)
            if _nothing_ran(config):
                return
            if not os.path.isdir(sweep_dir):
                print(f"[analysis] sweep directory {sweep_dir} does not exist; nothing to analyse", flush=True)
                return
            from dapo_exp.analysis.report import run_analysis

            out = os.path.join(sweep_dir, self.out_subdir)
            with _one_writer(out):  # the same sweep started twice ends in two analyses: one after the other
                result = run_analysis(sweep_dir, out=out, figures=self.figures, band=self.band,
                                      wandb_log=self._wandb_log(config))
            print("\n[analysis] " + result.text(), flush=True)
            failed = failed_jobs(sweep_dir, self.started)
            if failed:
                print(f"[analysis] {len(failed)} job(s) of this sweep FAILED (not in the table): "
                      + "; ".join(f"{d}: {e}" for d, e in failed), flush=True)
        except Exception as exc:  # noqa: BLE001 - the analysis must never fail a sweep
            print(
                f"[analysis] WARNING: the analysis of the sweep failed ({type(exc).__name__}: {exc}); "
                "the runs are unaffected. Re-run it with: python -m dapo_exp.analysis <sweep dir>",
                file=sys.stderr,
                flush=True,
            )
            traceback.print_exc(file=sys.stderr)


# Wall time of one toy run of the fast regime (experiment=toy_fast: 30 steps of 16 prompts) with one
# torch thread, the basis of the launch estimate; it grows with the rollout batch about as
# 0.2 + 0.8 x prompts / 16 (the verdict_cost runs of 2026-11-25, two runs at a time: 24.6-27.3 s at 16
# prompts, and at 32 and 64 prompts 50 and 85 s, of which about 5 s was the benchmark's extra 256 x 8
# evaluation: 1.8x and 3.3x without it, against 1.8x and 3.4x by the formula; the headline sweep at the
# default's 64 prompts, two at a time, 2026-11-25: 73-93 s a run, 14 min for 20 runs, against
# 85-119 s and 14-20 min by the formula); the final evaluation's size is not counted (a 256 x 8 one
# adds about 5 s). A busy machine is slower (docs: benchmarks): launch_plan scales the time by the share
# of a core each run gets beside the load already there, (load + runs at once) / cores when above 1
# (issue 38: the headline sweep took 50 min on the 2 cores at a load of 4 and more; at load 4 this says 43-60).
TOY_RUN_S = (25.0, 35.0)
TOY_PROMPTS = 16
# The launch line's smallest detectable effect: dapo_exp.analysis.verdicts.seed_advice (the toy's measured spread).


@contextlib.contextmanager
def _one_writer(out: str) -> Iterator[None]:
    """Hold ``<out>/.lock`` (``flock``, waiting for a holder) while the analysis writes ``out``; no lock
    where the folder cannot be made or the filesystem has no ``flock`` (the analysis reports its own
    write errors)."""
    import fcntl

    try:
        os.makedirs(out, exist_ok=True)
        f = open(os.path.join(out, ".lock"), "a")  # noqa: SIM115 - closed below
    except OSError:
        yield
        return
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX)
        except OSError:
            pass
        yield


def sweep_jobs(config: Any) -> list[list[str]]:
    """The jobs of the multirun ``config`` belongs to, as Hydra's basic sweeper expands them
    (:func:`dapo_exp.hydra_setup.sweep_jobs`): the command line's overrides after ``hydra.sweeper.params``
    (so ``seed=`` given there replaces the default seeds)."""
    from omegaconf import OmegaConf

    from dapo_exp.hydra_setup import sweep_jobs as expanded

    params = OmegaConf.select(config, "hydra.sweeper.params", default=None) or {}
    return expanded(config.hydra.overrides.task, params)


# A sweep whose estimated cost is above this many GPU-hours and that would run several seeds per
# configuration must name its seeds on the command line (seed=...), or is refused before launch
# (:func:`cost_refusal`): the seeds multiply the cost, and a default should not multiply it unseen.
NAME_SEEDS_ABOVE_GPU_H = 100.0
# The preset's estimate of the GPU-seconds one rollout step costs, evaluations and checkpoints spread
# over the steps, whatever the job's layout (GPUs x seconds): notes.gpu_s_per_step of conf/experiment/*.yaml.
GPU_S_KEY = "notes.gpu_s_per_step"
# A CPU preset's measured seconds of one core per rollout step (its evaluations spread over the steps), on an
# idle core of the machine it names: notes.cpu_s_per_step of conf/experiment/*.yaml (the real-model presets).
CPU_S_KEY = "notes.cpu_s_per_step"
MEASURED = -1.0  # launch_plan's and run_cost_line's load: the 1-minute load average now


def cpu_minutes(config: Any, runs: int, at_once: int, cores: int, load: float | None) -> float | None:
    """Expected wall minutes of ``runs`` runs of a CPU preset (:data:`CPU_S_KEY`), ``at_once`` side by side on
    ``cores`` cores at ``load``: each run's thread gets ``cores / (load + at_once)`` of a core, at most one.
    None when the config declares no measured per-step cost."""
    per_step = _get(config, CPU_S_KEY)
    if per_step is None:
        return None
    slow = max(1.0, ((load or 0.0) + at_once) / cores)
    steps = int(_get(config, "train.steps", 0) or 0)
    return -(-runs // at_once) * steps * float(per_step) * slow / 60.0


def run_cost_line(config: Any, *, cores: int | None = None, load: float | None = MEASURED) -> str | None:
    """One run's cost before compute, for a CPU preset that declares its measured seconds per step
    (:data:`CPU_S_KEY`, the native trainer's), else None (and for ``backend=verl``, whose step costs differ)."""
    if _get(config, "backend.name") != "native":
        return None
    cores = cores or _cores(config)
    load = _load() if load == MEASURED else load
    minutes = cpu_minutes(config, 1, 1, cores, load)
    if minutes is None:
        return None
    at = "load unknown" if load is None else f"load {load:.1f} on {cores} core(s)"
    return (f"[dapo-exp] cost: ~{float(_get(config, CPU_S_KEY)):.0f} s of one core per step (measured, {CPU_S_KEY}) "
            f"x {_get(config, 'train.steps')} steps: about {minutes:.0f} min for this run at {at}")


def job_dir(config: Any, job: list[str]) -> Path:
    """The directory Hydra gives the job with overrides ``job`` in the sweep of ``config``:
    ``hydra.sweep.dir`` / its ``override_dirname`` (the excluded keys left out, sorted) as
    ``hydra.sweep.subdir`` names it (:func:`dapo_exp.hydra_setup.overrides_dirname`, then
    :func:`dapo_exp.hydra_setup.run_dirname`)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from dapo_exp.hydra_setup import overrides_dirname, run_dirname

    spec = config.hydra.job.config.override_dirname
    name = overrides_dirname(OverridesParser.create().parse_overrides(job), spec.exclude_keys, spec.item_sep,
                             spec.kv_sep)
    return Path(str(config.hydra.sweep.dir)) / run_dirname(name)


def finished_jobs(config: Any, jobs: list[list[str]]) -> list[list[str]]:
    """The jobs of ``jobs`` whose directory's ``summary.json`` says ``finished``: a re-run of the sweep
    skips them."""
    from dapo_exp import rundir

    done = []
    for job in jobs:
        try:
            status = (rundir.read_summary(job_dir(config, job)) or {}).get("status")
        except Exception:  # noqa: BLE001 - an unreadable job: counted as to run
            status = None
        if status == rundir.STATUS_FINISHED:
            done.append(job)
    return done


def _seed_source(config: Any) -> tuple[bool, str]:
    """(seeds given on the command line, where the seeds come from, as the launch line says it)."""
    given = any(o.split("=", 1)[0].lstrip("+~") == "seed" for o in config.hydra.overrides.task)
    if given:
        return True, "seed= given"
    experiment = _get(config, "hydra.runtime.choices.experiment")
    if experiment not in (None, "null") and _preset_declares_seeds(str(experiment)):
        return False, (f"seed= not given: experiment={experiment}'s seeds, its hydra.sweeper.params.seed; "
                       "seed=0 runs one, seed=0,1,... others")
    return False, ("seed= not given: the default seeds of hydra.sweeper.params.seed; seed=0 runs one, "
                   "seed=0,1,... others")


def _preset_declares_seeds(experiment: str) -> bool:
    from omegaconf import OmegaConf

    from dapo_exp.hydra_setup import CONFIG_DIR

    path = Path(CONFIG_DIR) / "experiment" / f"{experiment}.yaml"
    try:
        return OmegaConf.select(OmegaConf.load(path), "hydra.sweeper.params.seed", default=None) is not None
    except Exception:  # noqa: BLE001 - no such file, unreadable: not declared
        return False


def _load() -> float | None:
    import os

    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _cores(config: Any) -> int:
    from dapo_exp.hydra_setup import available_cores

    return int(_get(config, "hydra.launcher.cores") or available_cores())


def _at_once(config: Any, n_jobs: int, cores: int) -> int:
    """Runs side by side: one for Hydra's basic launcher; the parallel launcher's plan
    (``hydra.launcher.jobs``, else ``min(jobs, cores // threads_per_job)``)."""
    launcher = str(_get(config, "hydra.launcher._target_", "") or "")
    if not launcher.endswith("ParallelLauncher"):
        return 1
    jobs = _get(config, "hydra.launcher.jobs")
    return int(jobs or max(1, min(n_jobs, cores // int(_get(config, "hydra.launcher.threads_per_job") or 1))))


def gpu_hours(config: Any, runs: int) -> float | None:
    """``runs`` x ``train.steps`` x the preset's GPU-seconds per step (:data:`GPU_S_KEY`), in hours;
    None when the config declares no per-step cost."""
    per_step = _get(config, GPU_S_KEY)
    if per_step is None:
        return None
    return runs * int(_get(config, "train.steps", 0) or 0) * float(per_step) / 3600.0


def _hours(h: float) -> str:
    """An estimate's hours as precise as it is: two significant digits (``~37``, ``~1.8``, ``~67,000``)."""
    if h >= 100:
        return f"~{float(f'{h:.2g}'):,.0f}"
    return f"~{h:.0f}" if h >= 10 else f"~{h:.1f}"




def launch_plan(config: Any, *, cores: int | None = None, load: float | None = MEASURED) -> str:
    """One line at a sweep's start: its runs (configurations x seeds, saying where the seeds come from),
    the runs left when some are finished (a re-run skips them), and what the runs left cost: for a config
    that declares its GPU-seconds per step (:data:`GPU_S_KEY`, the GPU presets), GPU-hours; for the toy
    on a local launcher, the expected wall time on this machine (``cores``, default the CPUs this
    process may use or ``hydra.launcher.cores``; ``load``, default :data:`MEASURED`, None: unknown) and
    what its seeds detect."""
    if sequential(config):
        return _sequential_plan(config)
    jobs = sweep_jobs(config)
    seeds = {o.split("=", 1)[1] for job in jobs for o in job if o.startswith("seed=")}
    n_seeds = max(1, len(seeds))
    n_cfg = max(1, len(jobs) // n_seeds)
    _, where = _seed_source(config)
    line = f"[sweep] {len(jobs)} runs: {n_cfg} configuration(s) x {n_seeds} seed(s) ({where})"
    done = len(finished_jobs(config, jobs))
    left = len(jobs) - done
    if done:
        line += f"; {done} finished, {left} left to run (a re-run skips finished runs)"
    if not left:
        return line
    hours = gpu_hours(config, left)
    if hours is not None:
        experiment = _get(config, "hydra.runtime.choices.experiment")
        whose = f"experiment={experiment}'s" if experiment not in (None, "null") else "the config's"
        return (f"{line}; estimated cost {_hours(hours)} GPU-hours for {left} run(s) x {_get(config, 'train.steps')} "
                f"steps x ~{float(_get(config, GPU_S_KEY)):,.0f} GPU-s per step ({whose} arithmetic estimate, "
                f"{GPU_S_KEY}; not a measurement)")
    launcher = str(_get(config, "hydra.launcher._target_", "") or "")
    from dapo_exp.analysis.verdicts import toy_setup

    toy = toy_setup(lambda key: _get(config, key))  # the toy's task and model: its measured run times hold
    local = launcher.endswith(("BasicLauncher", "ParallelLauncher"))
    native_cost = _get(config, CPU_S_KEY) is not None and _get(config, "backend.name") == "native"
    if not local or (not toy and not native_cost):
        return line
    cores = cores or _cores(config)
    load = _load() if load == MEASURED else load
    at_once = _at_once(config, left, cores)
    minutes = cpu_minutes(config, left, at_once, cores, load) if native_cost else None
    if minutes is not None:
        machine = "load unknown: as if idle" if load is None else f"load {load:.1f}"
        return (f"{line}; expected wall time ~{minutes:.0f} min for {left} run(s) x {_get(config, 'train.steps')} "
                f"steps x ~{float(_get(config, CPU_S_KEY)):.0f} s per step (measured, {CPU_S_KEY}), {at_once} at a "
                f"time on {cores} core(s) at {machine}")
    steps = _get(config, "train.steps", 30) or 30
    prompts = _get(config, "train.prompts_per_step", TOY_PROMPTS) or TOY_PROMPTS
    scale = steps / 30 * (0.2 + 0.8 * prompts / TOY_PROMPTS)
    # runs share the cores with the load already there: each run's thread gets cores / (load + runs) of a core
    slow = max(1.0, ((load or 0.0) + at_once) / cores)
    lo, hi = (t * scale * slow * -(-left // at_once) / 60 for t in TOY_RUN_S)
    if load is None:
        machine = f"{cores} core(s), load unknown: as if idle"
    else:
        free = max(1, cores - int(round(load)))
        machine = f"{cores} core(s) at load {load:.1f}: {free} free"
        if slow > 1.0:
            machine += f", so {slow:.1f}x slower than on idle cores"
    hint = " (hydra/launcher=parallel runs one per core)" if launcher.endswith("BasicLauncher") and cores > 1 else ""
    return (f"{line}; expected wall time {lo:.0f}-{hi:.0f} min for {left} run(s), {at_once} at a time on "
            f"{machine}{hint}{_toy_detect(config, n_seeds)}{regime_note(config)}")


def sequential(config: Any) -> bool:
    """Whether the sweep of ``config`` is a sequential one (``hydra/sweeper=sequential``)."""
    return str(_get(config, "hydra.sweeper._target_", "") or "").endswith("SequentialSweeper")


def _sequential_plan(config: Any) -> str:
    """The launch line of a sequential sweep: its configurations and its seed budget (the sweeper prints
    its rule next, and a line per comparison after each round)."""
    jobs = [[o for o in job if not o.startswith("seed=")] for job in sweep_jobs(config)]
    n_cfg = len({tuple(j) for j in jobs})
    most = int(_get(config, "hydra.sweeper.max_seeds", 0) or 0)
    return (f"[sweep] sequential (hydra/sweeper=sequential): {n_cfg} configuration(s), seeds added in rounds until "
            f"every comparison is decided, at most {most} per configuration ({n_cfg * most} runs at most); the "
            "default seeds of hydra.sweeper.params.seed do not apply")


# what a sweep on each toy regime can show (docs/explanation/testbed.md): the default's warm start and task
# (and toy_fast's, toy_headroom's) give no DAPO fix the job the paper gives it; toy_dapo gives each one
NO_JOB_REGIMES = (None, "null", "toy_fast", "toy_headroom")


def regime_note(config: Any) -> str:
    """One sentence for the launch line: what the toy regime of ``config`` can show about the fixes."""
    experiment = _get(config, "hydra.runtime.choices.experiment")
    if experiment in NO_JOB_REGIMES:
        return ("; on this regime no DAPO fix has the job the paper gives it, so a rung shows what a fix costs "
                "or breaks, not the benefit the paper reports (experiment=toy_dapo gives each fix its job)")
    if experiment == "toy_dapo":
        return ("; on this regime each DAPO fix has its job in the same run: each rung's mechanism metric says "
                "whether the fix did it (docs/explanation/testbed.md)")
    return ""


def cost_refusal(config: Any) -> str | None:
    """Why a sweep must not start as given, or None: its runs left are estimated above
    :data:`NAME_SEEDS_ABOVE_GPU_H` GPU-hours, it runs more than one seed per configuration and the
    command line names none (the seeds are a default's: the root config's or the preset's). A
    ``backend.dry_run`` launches nothing and is never refused, nor is a sequential sweep (its seed budget,
    ``hydra.sweeper.max_seeds``, is a key of its own, and ``seed=`` is refused there)."""
    if _get(config, "backend.dry_run") or sequential(config):  # a sequential sweep's budget is its own key
        return None
    jobs = sweep_jobs(config)
    seeds = sorted({o.split("=", 1)[1] for job in jobs for o in job if o.startswith("seed=")},
                   key=lambda s: (len(s), s))
    given, _ = _seed_source(config)
    if given or len(seeds) <= 1:
        return None
    left = len(jobs) - len(finished_jobs(config, jobs))
    hours = gpu_hours(config, left)
    if hours is None or hours <= NAME_SEEDS_ABOVE_GPU_H:
        return None
    n_cfg = max(1, len(jobs) // len(seeds))
    one = gpu_hours(config, n_cfg) or 0.0
    return (f"this sweep is estimated at {_hours(hours)} GPU-hours ({left} run(s) left: {n_cfg} configuration(s) "
            f"x {len(seeds)} seed(s) a default chose), over {NAME_SEEDS_ABOVE_GPU_H:g} GPU-hours: name the seeds on "
            f"the command line to launch it, seed={','.join(seeds)} for these {len(seeds)} or seed=0 for one "
            f"({_hours(one)} GPU-hours)")


def _get(config: Any, key: str, default: Any = None) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.select(config, key, default=default)


def default_regime(config: Any) -> bool:
    """Whether ``config`` runs the toy's measured default regime (the verdict_cost benchmark's ``batch4x``):
    :func:`dapo_exp.analysis.verdicts.toy_regime` of its values and its experiment preset."""
    from dapo_exp.analysis.verdicts import toy_regime

    return toy_regime(lambda key: _get(config, key), _get(config, "hydra.runtime.choices.experiment")) == "default"


def _toy_detect(config: Any, n_seeds: int) -> str:
    """What ``n_seeds`` seeds per arm detect on the toy: :func:`dapo_exp.analysis.verdicts.seed_advice` for
    its regime and endpoint, the advice every other place prints too."""
    from dapo_exp.analysis.verdicts import seed_advice, toy_regime

    if n_seeds <= 1:
        return "; one seed: no interval, nothing can be concluded"
    regime = toy_regime(lambda key: _get(config, key), _get(config, "hydra.runtime.choices.experiment"))
    advice = seed_advice(regime, _get(config, "eval.endpoint", "final"), _get(config, "eval.endpoint_k", 3))
    mde, for_five = advice.detects(n_seeds), advice.seeds(5.0)
    five = "" if round(mde) == 5 else f" ({for_five} seeds detect 5)"  # not "5 seeds detect 5 (5 seeds detect 5)"
    return f"; {n_seeds} seeds per arm detect about {mde:.0f} points of {advice.what} at power 0.8 on the toy{five}"


def _job_summaries(sweep_dir: str, since: float = 0.0) -> list[tuple[str, dict]]:
    """``(job directory, its summary)`` of every job under ``sweep_dir`` whose ``summary.json`` was written at
    or after ``since`` (a time.time()); an unreadable one is left out."""
    out = []
    for summary in sorted(Path(sweep_dir).glob("*/summary.json")):
        try:
            if summary.stat().st_mtime < since - 1e-3:
                continue
            data = json.loads(summary.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            out.append((str(summary.parent), data))
    return out


def failed_jobs(sweep_dir: str, since: float) -> list[tuple[str, str]]:
    """``(job directory, error)`` of every job under ``sweep_dir`` whose ``summary.json`` says ``failed``
    and was written at or after ``since``: the jobs of the sweep started then that failed, not those of an
    earlier run of the same sweep directory."""
    return [(job, " ".join(str(data.get("error") or "?").split())[:200])
            for job, data in _job_summaries(sweep_dir, since) if data.get("status") == "failed"]


def finished_runs(sweep_dir: str) -> list[str]:
    """The job directories under ``sweep_dir`` whose ``summary.json`` says ``finished`` (this run of the
    sweep's and earlier ones': the runs its table has)."""
    return [job for job, data in _job_summaries(sweep_dir) if data.get("status") == "finished"]


def _nothing_ran(config: Any) -> bool:
    """A backend=verl dry run ran nothing, and a SLURM launch only submitted the jobs: no analysis yet."""
    from omegaconf import OmegaConf

    backend = OmegaConf.select(config, "backend", default=None)
    if backend is None or backend.get("name", "native") == "native":
        return False
    if backend.get("dry_run"):
        print("[analysis] backend.dry_run=true: nothing ran, nothing to analyse", flush=True)
        return True
    if backend.get("launch") == "slurm":
        print("[analysis] the jobs were submitted to SLURM; when they have ended: "
              f"python -m dapo_exp.analysis {config.hydra.sweep.dir}", flush=True)
        return True
    return False
