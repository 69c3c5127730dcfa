"""Hydra callback: the comparison table and curves at the end of every multirun.

Enabled in conf/config.yaml (``hydra.callbacks.analysis``). After the last job of
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

import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

_SWEEPS: list[str] = []  # the sweep directories this process ran (note_sweep), in order


def note_sweep(sweep_dir: Any) -> None:
    """Remember that this process runs a sweep into ``sweep_dir`` (for :func:`noted_sweeps`)."""
    if sweep_dir is not None and str(sweep_dir) not in _SWEEPS:
        _SWEEPS.append(str(sweep_dir))


def noted_sweeps() -> list[str]:
    return list(_SWEEPS)


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
        try:
            note_sweep(config.hydra.sweep.dir)
            print(launch_plan(config), flush=True)
        except Exception:  # noqa: BLE001 - never fail a sweep
            pass

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

            result = run_analysis(
                sweep_dir,
                out=os.path.join(sweep_dir, self.out_subdir),
                figures=self.figures,
                band=self.band,
                wandb_log=self._wandb_log(config),
            )
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
# adds about 5 s); a busy machine is slower (docs: benchmarks).
TOY_RUN_S = (25.0, 35.0)
TOY_PROMPTS = 16
# The toy's paired standard deviation of held-out accuracy between two arms of one seed, in points, as
# the verdict_cost benchmark measured it (docs: results): what the launch line's smallest detectable
# effect is computed from, the larger of the two fixes measured. Pooled over seeds 12-35 in two blocks
# on the 2-core machine (2026-11-24/25, sweeps/results/2026-11-25-verdict-cost-batch/pooled).
# The default regime (64 prompts per step, a 256 x 8 final evaluation), final accuracy: Clip-Higher
# 2.34 [1.68, 2.83], Token-level Loss 2.96 [2.05, 3.83].
TOY_DEFAULT_PAIRED_SD = 2.96
# The fast regime (experiment=toy_fast: 16 prompts, 64 x 4 evaluations), per endpoint: final
# Clip-Higher 5.67 [3.69, 7.16], Token-level Loss 7.82 [5.19, 10.10]; last_k_mean with k = 3 (steps
# 10, 20, 30) 3.46 [2.38, 4.32] and 4.06 [2.78, 5.05]. A regime neither of the two is quoted at the
# fast regime's spread, and the launch line says so.
TOY_FAST_PAIRED_SD = {"final": 7.8, "last_k_mean": 4.1}


def sweep_jobs(config: Any) -> list[list[str]]:
    """The jobs of the multirun ``config`` belongs to, as Hydra's basic sweeper expands them: the
    command line's overrides after ``hydra.sweeper.params`` (so ``seed=`` given there replaces the
    default seeds)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    params = OmegaConf.select(config, "hydra.sweeper.params", default=None) or {}
    args = [f"{k}={v}" for k, v in params.items()] + list(config.hydra.overrides.task)
    return BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(args), None)[0]


def launch_plan(config: Any) -> str:
    """One line at a sweep's start: its runs (configurations x seeds, saying where the seeds come from)
    and, for the toy on a local launcher, the expected wall time."""
    import os

    from omegaconf import OmegaConf

    jobs = sweep_jobs(config)
    seeds = {o.split("=", 1)[1] for job in jobs for o in job if o.startswith("seed=")}
    given = any(o.split("=", 1)[0].lstrip("+~") == "seed" for o in config.hydra.overrides.task)
    n_cfg = max(1, len(jobs) // max(1, len(seeds)))
    where = ("seed= given" if given else
             "seed= not given: the default seeds of hydra.sweeper.params.seed; seed=0 runs one, seed=0,1,... others")
    line = f"[sweep] {len(jobs)} runs: {n_cfg} configuration(s) x {max(1, len(seeds))} seed(s) ({where})"
    launcher = str(OmegaConf.select(config, "hydra.launcher._target_", default="") or "")
    toy = OmegaConf.select(config, "model.path", default=None) == "tiny"
    if not toy or not launcher.endswith(("BasicLauncher", "ParallelLauncher")):
        return line
    at_once = 1
    if launcher.endswith("ParallelLauncher"):
        at_once = OmegaConf.select(config, "hydra.launcher.jobs", default=None) or min(len(jobs), os.cpu_count() or 1)
    steps = OmegaConf.select(config, "train.steps", default=30) or 30
    prompts = OmegaConf.select(config, "train.prompts_per_step", default=TOY_PROMPTS) or TOY_PROMPTS
    scale = steps / 30 * (0.2 + 0.8 * prompts / TOY_PROMPTS)
    lo, hi = (t * scale * -(-len(jobs) // at_once) / 60 for t in TOY_RUN_S)
    n_seeds = max(1, len(seeds))
    return (f"{line}; expected wall time {lo:.0f}-{hi:.0f} min, {at_once} run(s) at a time on idle cores "
            f"(hydra/launcher=parallel runs one per core){_toy_detect(config, n_seeds)}")


def _get(config: Any, key: str, default: Any = None) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.select(config, key, default=default)


# the keys that make the toy's measured default regime (their schema defaults): the batch, the held-out set
# and the final evaluation
REGIME_KEYS = ("train.prompts_per_step", "train.mini_batch_size", "rollout.n", "task.arith_n_eval",
               "eval.final_problems", "eval.final_samples")


def default_regime(config: Any) -> bool:
    """Whether ``config`` runs the toy's measured default regime (the verdict_cost benchmark's
    ``batch4x``): no experiment preset (their warm starts differ), and the schema's defaults of
    :data:`REGIME_KEYS`, which another batch or a smaller held-out set would change."""
    from omegaconf import OmegaConf

    from dapo_exp.config import Config

    schema = OmegaConf.structured(Config)
    return (_get(config, "hydra.runtime.choices.experiment") in (None, "null")
            and all(_get(config, key) == OmegaConf.select(schema, key) for key in REGIME_KEYS))


def _toy_detect(config: Any, n_seeds: int) -> str:
    """What ``n_seeds`` seeds per arm detect on the toy, at the paired spread measured for its endpoint
    and regime (the default's final accuracy; otherwise experiment=toy_fast's, said so)."""
    from dapo_exp.analysis.verdicts import mde_paired, seeds_paired

    if n_seeds <= 1:
        return "; one seed: no interval, nothing can be concluded"
    endpoint, k = _get(config, "eval.endpoint", "final"), _get(config, "eval.endpoint_k", 3)
    fast = "" if _get(config, "hydra.runtime.choices.experiment") == "toy_fast" else " (at experiment=toy_fast's spread)"
    if default_regime(config) and endpoint == "final":
        sd, what = TOY_DEFAULT_PAIRED_SD, "final accuracy"
    elif endpoint == "last_k_mean" and k == 3:
        sd, what = TOY_FAST_PAIRED_SD["last_k_mean"], f"the mean accuracy of the last 3 evaluations{fast}"
    elif endpoint == "last_k_mean":  # measured for k = 3 only: final accuracy's larger spread, said so
        sd, what = TOY_FAST_PAIRED_SD["final"], (f"the mean accuracy of the last {k} evaluations (at experiment=toy_fast's final-accuracy "
                                         "spread)")
    else:
        sd, what = TOY_FAST_PAIRED_SD["final"], f"final accuracy{fast}"
    return (f"; {n_seeds} seeds per arm detect about {mde_paired(sd, n_seeds):.0f} points of {what} at power "
            f"0.8 on the toy ({seeds_paired(5.0, sd)} seeds detect 5)")


def failed_jobs(sweep_dir: str, since: float) -> list[tuple[str, str]]:
    """``(job directory, error)`` of every job under ``sweep_dir`` whose ``summary.json`` says ``failed``
    and was written at or after ``since`` (a time.time()): the jobs of the sweep started then that
    failed, not those of an earlier run of the same sweep directory."""
    out = []
    for summary in sorted(Path(sweep_dir).glob("*/summary.json")):
        try:
            if summary.stat().st_mtime < since - 1e-3:
                continue
            data = json.loads(summary.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("status") == "failed":
            error = " ".join(str(data.get("error") or "?").split())
            out.append((str(summary.parent), error[:200]))
    return out


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
