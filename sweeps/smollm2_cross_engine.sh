#!/usr/bin/env bash
# Question: does the real model's Clip-Higher study give the same mechanism and verdict on verl's trainer?
#           The two arms of sweeps/smollm2_clip.sh (GRPO and + Clip-Higher on experiment=smollm2_add2:
#           SmolLM2-135M-Instruct on two-digit sums as chat turns) trained by verl 0.9.1's trainer on this
#           CPU (backend=verl train.device=cpu: vLLM's CPU build generates from the converted model
#           directory, FSDP2 trains on the CPU), then each arm compared with the native runs across engines
#           and the fix's effect on each engine (sweeps/checks/cross_engine.py).
# Runs:     4 = 2 arms (fixes=grpo,clip) x 2 seeds (SEEDS=0,1), one after another (each starts its own Ray
#           and vLLM); the native half is sweeps/smollm2_clip.sh's (run it first: its 5 seeds per arm).
# Cost:     NOT RUN on the 2-core CPU: there verl's first step on this model did not end in 23 min (its update
#           alone 22 min at one thread; sweeps/README.md, 2026-11-28 (later)), so 4 runs of 8 steps would take
#           days. Run it on a GPU or the SLURM cluster; profile one verl step on the real model first.
# SLURM:    one job per run: add backend.launch=slurm (hydra/launcher=slurm is for the native half).
# Needs:    verl's environment (.venv-verl: bash .ci/install-verl).
# Output:   multirun/smollm2_clip_verl/ and the comparison in multirun/smollm2_cross_engine/.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(bash .ci/venv --find)}"  # the project's interpreter (.venv, or the active environment)
SEEDS="${SEEDS:-0,1}"
"$PY" run.py -m sweep=smollm2_clip_verl backend=verl train.device=cpu experiment=smollm2_add2 \
    fixes=grpo,clip seed="$SEEDS" logger=none "$@"
"$PY" sweeps/checks/cross_engine.py multirun/smollm2_clip multirun/smollm2_clip_verl multirun/smollm2_cross_engine \
    --arms grpo,clip --title "GRPO vs + Clip-Higher on SmolLM2-135M-Instruct (experiment=smollm2_add2)"
