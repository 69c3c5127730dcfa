#!/usr/bin/env bash
# Question: what does a sequential sweep (hydra/sweeper=sequential: seeds in rounds until an anytime-valid
#           interval decides) spend and conclude on the toy, against the fixed 5-seed design on the same
#           seeds? Three comparisons of different sizes on experiment=toy_dapo (the rungs of the committed
#           ladder, sweeps/results/2026-11-27-toy_dapo_ladder, where 5 seeds gave +9.1, +4.7 and -1.5 pp):
#           + Soft Overlong Punishment (large), + Dynamic Sampling (medium), + Token-level Loss (near null).
# Runs:     at most 120 = 3 comparisons x 2 configurations x 20 seeds (hydra.sweeper.max_seeds); the rule
#           stops earlier (the runs spent are the result). The seeds are the sweeper's: 0, 1, 2, ...
# Launcher: hydra/launcher=parallel: one seed of each configuration per round, side by side (2 cores).
# Cost:     CPU toy, 2 cores: a toy_dapo run 13-18 s (the ladder's runs.csv); measured in sweeps/README.md.
#           One GPU: an estimate of 1 min per run.
# SLURM:    bash sweeps/sequential_toy.sh hydra/launcher=slurm hydra.launcher.gpus_per_node=null (each round
#           is one array of the configurations' new seeds).
# Output:   multirun/sequential_toy_{sop,ds,tl}/ (sequential.json, the rounds; analysis/ with the
#           anytime-valid table), then the comparison with the fixed design in multirun/sequential_toy/
#           (sweeps/checks/sequential_toy.py).
# Extra overrides pass through to the three sweeps: bash sweeps/sequential_toy.sh hydra.sweeper.max_seeds=10
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(bash .ci/venv --find)}"  # the project's interpreter (.venv, or the active environment)
STUDY=(hydra/sweeper=sequential hydra/launcher=parallel experiment=toy_dapo)
"$PY" run.py -m sweep=sequential_toy_sop "${STUDY[@]}" fixes=paper_3_clip,paper_4_sop "$@"
"$PY" run.py -m sweep=sequential_toy_ds "${STUDY[@]}" fixes=paper_5_tl,paper_6_dapo "$@"
"$PY" run.py -m sweep=sequential_toy_tl "${STUDY[@]}" fixes=paper_4_sop,paper_5_tl "$@"
"$PY" sweeps/checks/sequential_toy.py multirun/sequential_toy_sop multirun/sequential_toy_ds \
    multirun/sequential_toy_tl --fixed sweeps/results/2026-11-27-toy_dapo_ladder/runs.csv --out multirun/sequential_toy
