#!/usr/bin/env bash
# Question: on the toy, does training the policy gradient on only the highest-entropy fifth of the tokens
#           (top_entropy=enabled: Wang et al. 2025, "Beyond the 80/20 Rule", Eq. 3, rho 0.2) change held-out
#           accuracy or entropy against GRPO on all tokens, paired by seed?
# Runs:     10 = 2 arms (top_entropy=disabled,enabled on fixes=grpo) x 5 seeds (SEEDS=0,1,2,3,4).
# Regime:   experiment=toy_fast (16 prompts per step, 30 steps): the toy's default of 2026-11-24, when this
#           study was first run (sweeps/results/2026-11-24-top-entropy, superseded by the re-run from the shipped
#           warm start, sweeps/results/2026-11-29-top-entropy).
# Launcher: hydra/launcher=parallel (jobs x threads = cores; hydra.launcher.cores=1 leaves one core to other work).
# Cost:     measured 2026-11-29 on 1 core of the 2-core machine beside a verl run (load 3.4 -> 2.8): 11 min 34 s
#           for the 10 runs, 49-84 s a run (the launch line's estimate was 18-25 min: it over-counts the load).
# SLURM:    bash sweeps/top_entropy.sh hydra/launcher=slurm hydra.launcher.partition=<partition>
# Output:   multirun/top_entropy/ (the Hydra callback's table and curves in analysis/); the paired effect:
#           python -m dapo_exp.analysis multirun/top_entropy
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(bash .ci/venv --find)}"  # the project's interpreter (.venv, or the active environment)
SEEDS="${SEEDS:-0,1,2,3,4}"
"$PY" run.py -m hydra/launcher=parallel experiment=toy_fast fixes=grpo top_entropy=disabled,enabled seed="$SEEDS" \
    logger=none sweep=top_entropy "$@"
