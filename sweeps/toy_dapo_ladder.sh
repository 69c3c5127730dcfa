#!/usr/bin/env bash
# Question: on the testbed regime where every DAPO fix has its job in the same run (experiment=toy_dapo: a
#           rare better strategy behind the clip, groups of one outcome, correct long reasoning cut at the
#           cap, looping responses), does the cumulative ladder of Table 1 (naive GRPO -> + overlong
#           filtering -> + clip-higher -> + soft overlong punishment -> + token-level loss -> + dynamic
#           sampling) climb, and which rung moves its fix's mechanism metric?
# Runs:     60 = 6 ladder presets (paper_1_grpo .. paper_6_dapo) x 10 seeds (SEEDS=0,...,9: the committed
#           result's seeds, so that the default reproduces it).
# Launcher: hydra/launcher=parallel: the runs side by side, jobs x threads = cores (a launcher
#           given as an extra override wins: hydra/launcher=basic runs them one after another).
# Cost:     CPU toy, 2 cores, the shipped warm start: 24 min 34 s for the 60 runs (sweeps/README.md,
#           2026-11-28). One GPU: about 1 min per run (estimate, from the fast regime's sizes).
# Seeds:    10 per rung, paired by seed (rung MDEs 3.0-6.5 points); `python -m dapo_exp.analysis plan
#           multirun/toy_dapo_ladder/analysis/table.csv --delta 5` says how many more a 5-point rung contrast needs.
# SLURM:    bash sweeps/toy_dapo_ladder.sh hydra/launcher=slurm hydra.launcher.partition=<partition> \
#               hydra.launcher.gpus_per_node=null hydra.launcher.timeout_min=30
# Output:   multirun/toy_dapo_ladder/; the rung contrasts (contrasts.md), the table and the curves against
#           steps, rollouts and tokens in multirun/toy_dapo_ladder/analysis/.
# Extra overrides pass through: bash sweeps/toy_dapo_ladder.sh train.steps=60
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(bash .ci/venv --find)}"  # the project's interpreter (.venv, or the active environment)
SEEDS="${SEEDS:-0,1,2,3,4,5,6,7,8,9}"
"$PY" run.py -m hydra/launcher=parallel sweep=toy_dapo_ladder experiment=toy_dapo \
    fixes=paper_1_grpo,paper_2_of,paper_3_clip,paper_4_sop,paper_5_tl,paper_6_dapo \
    seed="$SEEDS" "$@"
