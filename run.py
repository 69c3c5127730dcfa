"""Entry point: ``python run.py [overrides]`` trains one run; ``python run.py -m ...`` a sweep.

A thin ``@hydra.main`` wrapper over :func:`dapo_exp.train.train`, which tests call
directly with a composed config. ``python run.py -m --cfg job <sweep>`` prints the
config of every job of the sweep without running it. In a multirun, a job that
fails is recorded (``summary.json`` with ``status: failed``) and the sweep goes on;
a single run re-raises. Config errors (bad values, unknown keys, composition errors)
are printed as one line without a traceback (:mod:`dapo_exp.cli_errors`), and a single
run that fails before writing anything leaves no directory behind. See README.md.
"""

import logging
import os
import sys

import hydra
from omegaconf import DictConfig

from dapo_exp.cli_errors import check_known_keys, exit_if_config_error, one_line_errors, remove_if_empty
from dapo_exp.hydra_setup import dry_run_sweep, job_output_dir, record_failure, register_resolvers

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
    with one_line_errors(CONFIG_DIR):
        if not dry_run_sweep(sys.argv[1:], CONFIG_DIR):
            main()
