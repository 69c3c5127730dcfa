#!/usr/bin/env bash
# Question: do the DAPO fixes help, one group at a time? Naive GRPO vs + Clip-Higher vs
#           + Dynamic Sampling vs the full released recipe (+ token-level loss + soft overlong punishment).
# Runs:     12 = 4 configurations (grpo, clip, clip_ds, full) x 3 seeds (SEEDS=0,1,2).
# Launcher: hydra/launcher=parallel: the runs side by side, jobs x threads = cores
#           (conf/hydra/launcher/parallel.yaml); a launcher given as an extra override wins
#           (hydra/launcher=basic: one after another; hydra/launcher=slurm below).
# Cost:     CPU toy (default config = the testbed's headroom regime, 2 cores; 2026-11-22, 374b14f,
#           warm start cached): 173.8-182.2 s for the 12 runs with the parallel launcher, 223.2 s
#           one after another (hydra/launcher=basic), 288.5-306.5 s one after another with the
#           loops of before issue 14 (1.66-1.68x; sweeps/README.md).
#           One GPU, toy config: ~1 min per run -> ~10-15 min (estimate). A 0.5B-1.5B model on
#           task=dapo_math: hours per run (estimate: measure one run first).
# Regime:   the cost and seed figures above and below are the fast regime's (experiment=toy_fast: 16
#           prompts per step, the toy's default until 2026-11-25), as are the committed results: pass
#           experiment=toy_fast to reproduce them. The default (64 prompts per step) takes about 3.3x the
#           time per run and needs 4-5 seeds per arm for 5 points of final accuracy between two
#           configurations one fix apart (docs/how-to/seeds-and-studies.md).
# Seeds:    from the pilot, `python -m dapo_exp.analysis plan sweeps/results/2026-11-22-four_presets/table.csv
#           --delta 5` (the four-preset sweep on the toy, 3 seeds; final acc): sd across seeds 4.37 pp (8 df),
#           sd of per-seed differences to grpo 6.14 pp (6 df) -> 14 seeds per configuration for power 0.8 at
#           delta 5 pp, unpaired and paired (22 / 26 with the sd at its 80% upper bound). 95% half-widths with
#           3 / 5 / 10 seeds: mean ±10.9 / 5.4 / 3.1 pp, paired difference ±15.3 / 7.6 / 4.4 pp.
# SLURM:    bash sweeps/four_presets.sh hydra/launcher=slurm hydra.launcher.partition=<partition> \
#               hydra.launcher.gpus_per_node=1 hydra.launcher.timeout_min=120
#           (one job per run; needs the `slurm` extra: pip install -e ".[slurm]").
# Output:   multirun/four_presets/<overrides>/ per run; at the end the Hydra callback writes
#           multirun/four_presets/analysis/ (table.md/.csv/.tex, figures/) and prints the table.
#           Again later: python -m dapo_exp.analysis multirun/four_presets
# Extra overrides pass through: bash sweeps/four_presets.sh train.steps=60 logger=none
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(bash .ci/venv --find)}"  # the project's interpreter (.venv, or the active environment)
SEEDS="${SEEDS:-0,1,2}"
"$PY" run.py -m hydra/launcher=parallel sweep=four_presets fixes=grpo,clip,clip_ds,full seed="$SEEDS" "$@"
