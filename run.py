"""Entry point: ``python run.py [overrides]`` trains one run; ``python run.py -m ...`` a sweep.

A thin ``@hydra.main`` wrapper over :func:`dapo_exp.train.train`, which tests call
directly with a composed config. ``python run.py -m --cfg job <sweep>`` prints the
config of every job of the sweep without running it. See README.md.
"""

import os
import sys

import hydra
from omegaconf import DictConfig

from dapo_exp.hydra_setup import dry_run_sweep, job_output_dir, register_resolvers

CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conf")
register_resolvers()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    from dapo_exp.train import train

    cfg.out_dir = job_output_dir()
    summary = train(cfg)
    return (summary or {}).get("final", {}).get("eval/acc_avg")


if __name__ == "__main__":
    if not dry_run_sweep(sys.argv[1:], CONFIG_DIR):
        main()
