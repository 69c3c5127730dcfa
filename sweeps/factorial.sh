#!/usr/bin/env bash
# Question: how do the fixes interact? Every combination of the five switches (2^5 = 32
#           configurations), so main effects and interactions can be estimated, not only a ladder.
# Runs:     96 = 32 configurations x 3 seeds (SEEDS=0,1,2).
# Launcher: hydra/launcher=parallel: the runs side by side, jobs x threads = cores (a launcher
#           given as an extra override wins: hydra/launcher=basic runs them one after another).
# Cost:     CPU toy (default config, 2 cores): measured 27-38 s per run on the earlier toy (2026-11-22; the
#           testbed's headroom regime: 26-55 s per run, two at a time with the parallel launcher; 28 s per
#           run once the warm start is cached) -> about 45-64 min for 96 runs one after another.
#           One GPU, toy config: ~1 min per run -> ~1.5-2 hours (estimate). At model scale this is a
#           cluster job: 96 runs of hours each (estimate).
# Regime:   the cost and seed figures above and below are the fast regime's (experiment=toy_fast: 16
#           prompts per step, the toy's default until 2026-11-25), as are the committed results: pass
#           experiment=toy_fast to reproduce them. The default (64 prompts per step) takes about 3.3x the
#           time per run and needs 4-5 seeds per arm for 5 points of final accuracy between two
#           configurations one fix apart (docs/how-to/seeds-and-studies.md).
# Seeds:    from the pilot, `python -m dapo_exp.analysis plan sweeps/results/2026-11-22-four_presets/table.csv
#           --delta 5` (the four-preset sweep on the toy, 3 seeds; final acc): sd across seeds 4.37 pp (8 df),
#           sd of per-seed differences to grpo 6.14 pp (6 df) -> 14 seeds per configuration for power 0.8 at
#           delta 5 pp, unpaired and paired (22 / 26 with the sd at its 80% upper bound). 95% half-widths with
#           3 / 5 / 10 seeds: mean ±10.9 / 5.4 / 3.1 pp, paired difference ±15.3 / 7.6 / 4.4 pp;
#           a main effect or interaction of the 2^(5-1) half fraction ±2.6 / 1.9 / 1.4 pp (the full factorial,
#           with twice the runs, about 1/sqrt(2) of that).
# SLURM:    bash sweeps/factorial.sh hydra/launcher=slurm hydra.launcher.partition=<partition> \
#               hydra.launcher.gpus_per_node=1 hydra.launcher.timeout_min=120 hydra.launcher.array_parallelism=32
# Output:   multirun/factorial/; table and curves in multirun/factorial/analysis/. Runs are labelled
#           from their switches (dapo_exp.config.config_label): preset names where they match
#           (grpo, clip, full, paper_6_dapo ...), else e.g. "clip+sop+of".
# Base preset is `grpo` (no fix), so the five switch groups alone decide the configuration.
# Extra overrides pass through: bash sweeps/factorial.sh train.steps=60
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(bash .ci/venv --find)}"  # the project's interpreter (.venv, or the active environment)
SEEDS="${SEEDS:-0,1,2}"
"$PY" run.py -m hydra/launcher=parallel sweep=factorial fixes=grpo \
    clip_higher=disabled,enabled \
    dynamic_sampling=disabled,enabled \
    token_level_loss=disabled,enabled \
    overlong_punishment=disabled,soft \
    overlong_filtering=disabled,enabled \
    seed="$SEEDS" "$@"
