#!/usr/bin/env bash
# Question: does the cumulative ladder of Table 1 of the DAPO paper (naive GRPO 30 -> + overlong
#           filtering 36 -> + clip-higher 38 -> + soft overlong punishment 41 -> + token-level loss 42
#           -> + dynamic sampling 50, AIME24 avg@32 at 32B) climb the same way here?
# Runs:     18 = 6 ladder presets (paper_1_grpo .. paper_6_dapo) x 3 seeds (SEEDS=0,1,2).
# Launcher: hydra/launcher=parallel: the runs side by side, jobs x threads = cores (a launcher
#           given as an extra override wins: hydra/launcher=basic runs them one after another).
# Cost:     CPU toy (default config = the testbed's headroom regime, 2 cores; 2026-11-22, d281f88):
#           30 runs (5 seeds) in 8 min with the parallel launcher, warm start cached.
#           One GPU, toy config: ~1 min per run -> ~20 min (estimate). A 0.5B-1.5B model on
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
# SLURM:    bash sweeps/paper_ladder.sh hydra/launcher=slurm hydra.launcher.partition=<partition> \
#               hydra.launcher.gpus_per_node=1 hydra.launcher.timeout_min=120
# Output:   multirun/paper_ladder/; table and curves in multirun/paper_ladder/analysis/ (the paper's
#           numbers sit in their own column, next to ours, never mixed).
# Extra overrides pass through: bash sweeps/paper_ladder.sh train.steps=60
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(bash .ci/venv --find)}"  # the project's interpreter (.venv, or the active environment)
SEEDS="${SEEDS:-0,1,2}"
"$PY" run.py -m hydra/launcher=parallel sweep=paper_ladder \
    fixes=paper_1_grpo,paper_2_of,paper_3_clip,paper_4_sop,paper_5_tl,paper_6_dapo \
    seed="$SEEDS" "$@"
