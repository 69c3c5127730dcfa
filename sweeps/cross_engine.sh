#!/usr/bin/env bash
# Question: does the same toy ablation give the same verdict on both engines? GRPO against one DAPO fix
#           with a large, fast effect on the toy (the Soft Overlong Punishment on experiment=toy_overlong:
#           it cut truncation from 30% to 7% of samples natively, 2026-11-22), trained by dapo-exp's own
#           trainer and by verl 0.9.1's (backend=verl train.device=cpu: vLLM's CPU build generates),
#           the same task, warm start, verifier, sizes and seeds; each arm's endpoint compared across
#           engines, the fix's effect estimated on each engine, and the seconds per step of each.
# Runs:     20 = 2 engines x 2 arms (overlong_punishment=disabled,soft) x 5 seeds (SEEDS=0,1,2,3,4),
#           20 rollout steps of 16 prompts x 8 responses, held-out avg@4 on 64 problems every 10 steps.
# Launcher: the native runs side by side (hydra/launcher=parallel); the verl runs one after another
#           (each starts its own Ray and vLLM), seed by seed so that a cut-short sweep leaves pairs.
# Cost:     CPU, 2 cores: native about 30 s a run; verl about 4-6 min a run (start-up, validation and
#           shutdown dominate: sweeps/README.md, 2026-11-27). One GPU: an estimate of 1 min a native run.
# SLURM:    the verl half as SLURM jobs (one node each): add backend.launch=slurm; the native half as a
#           SLURM array: bash sweeps/cross_engine.sh hydra/launcher=slurm hydra.launcher.gpus_per_node=null
# Needs:    verl's environment (.venv-verl: bash .ci/install-verl).
# Output:   multirun/cross_engine_native/, multirun/cross_engine_verl/, and the comparison (tables, curves
#           side by side, seconds per step) in multirun/cross_engine/ (sweeps/checks/cross_engine.py).
# Extra overrides pass through to both engines' sweeps: bash sweeps/cross_engine.sh train.steps=30
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(bash .ci/venv --find)}"  # the project's interpreter (.venv, or the active environment)
SEEDS="${SEEDS:-0,1,2,3,4}"
STUDY=(experiment=toy_overlong fixes=grpo train.steps=20 eval.every=10 logger=none)
"$PY" run.py -m hydra/launcher=parallel sweep=cross_engine_native "${STUDY[@]}" \
    seed="$SEEDS" overlong_punishment=disabled,soft "$@"
"$PY" run.py -m sweep=cross_engine_verl backend=verl train.device=cpu "${STUDY[@]}" \
    seed="$SEEDS" overlong_punishment=disabled,soft "$@"
"$PY" sweeps/checks/cross_engine.py multirun/cross_engine_native multirun/cross_engine_verl multirun/cross_engine
