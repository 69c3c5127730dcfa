"""Entry point: ``python run.py [overrides]`` trains one run; ``python run.py -m ...`` a sweep.

A thin ``@hydra.main`` wrapper over :func:`dapo_exp.train.train`, which tests call
directly with a composed config. ``python run.py -m --cfg job <sweep>`` prints the
config of every job of the sweep without running it. In a multirun, a job that
fails is recorded (``summary.json`` with ``status: failed``) and the sweep goes on;
a single run re-raises. Config errors (bad values, unknown keys, composition errors)
are printed as one line without a traceback (:mod:`dapo_exp.cli_errors`), and a single
run that fails before writing anything leaves no directory behind. A multirun without
``sweep=`` is named after its swept overrides (``multirun/fixes=grpo,clip,clip_ds,full``).
SIGTERM / SIGINT stop a run cleanly after its current step (exit code 128 + the signal).
See README.md.
"""

import logging
import os
import sys

import hydra
from omegaconf import DictConfig

from dapo_exp.cli_errors import check_known_keys, exit_if_config_error, one_line_errors, remove_if_empty
from dapo_exp.hydra_setup import default_sweep_name, dry_run_sweep, job_output_dir, register_resolvers
from dapo_exp.rundir import RunLockedError, record_failure

CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conf")
register_resolvers()
log = logging.getLogger("run")


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from dapo_exp.train import train

    cfg.out_dir = job_output_dir()
    try:
        check_known_keys(cfg)  # a `+key=...` the schema does not declare would be silently ignored
        summary = train(cfg)
    except RunLockedError as exc:  # another process writes this run: touch nothing of it
        if HydraConfig.get().mode != RunMode.MULTIRUN:
            print(f"error: {exc}", file=sys.stderr)
            raise SystemExit(1) from None
        log.error("job %s skipped: %s", cfg.out_dir, exc)
        return None
    except Exception as exc:
        if HydraConfig.get().mode != RunMode.MULTIRUN:
            remove_if_empty(cfg.out_dir)  # failed before writing anything: no empty run directory
            exit_if_config_error(exc, CONFIG_DIR)  # one line, no traceback
            raise
        record_failure(cfg.out_dir, exc)
        log.exception("job %s failed; the sweep goes on (status recorded in summary.json)", cfg.out_dir)
        return None
    return (summary or {}).get("final", {}).get("eval/acc_avg")


if __name__ == "__main__":
    # a multirun that names no sweep is named after what it sweeps (its directory and W&B group)
    sys.argv += [f"sweep='{name}'"] if (name := default_sweep_name(sys.argv[1:])) else []  # quoted: it has , and =
    with one_line_errors(CONFIG_DIR):
        if not dry_run_sweep(sys.argv[1:], CONFIG_DIR):
            from dapo_exp.train import RunStopped

            try:
                main()
            except RunStopped as stop:  # SIGTERM / SIGINT: checkpointed and recorded; exit as the signal asks
                import signal

                sys.exit(128 + int(getattr(signal, stop.signame)))
