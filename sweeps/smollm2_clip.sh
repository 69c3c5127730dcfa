#!/usr/bin/env bash
# Question: on a real pretrained model, does GRPO's policy entropy collapse, and does Clip-Higher (eps_high
#           0.28 > eps_low 0.2, DAPO §3.1) keep it up and change held-out accuracy? SmolLM2-135M-Instruct
#           (model=smollm2_135m, from its pinned wheel) on two-digit sums as chat turns with three worked
#           examples (experiment=smollm2_add2: base pass@1 about 0.34 at temperature 1), 8 rollout steps of
#           4 prompts x 8 responses, 4 updates of one group per step, lr 2e-5.
# Runs:     10 = 2 arms (fixes=grpo,clip) x 5 seeds (SEEDS=0,1,2,3,4), two at a time (one per core).
# Cost:     CPU, 2 cores: 18-19 min a run on a free core (notes.cpu_s_per_step, measured: 1065-1137 s), so about
#           95 min for the ten; the launch line prints the estimate for this machine and its load.
# SLURM:    one CPU job per run: bash sweeps/smollm2_clip.sh hydra/launcher=slurm hydra.launcher.gpus_per_node=null
#           (the wheel is downloaded and converted once, by the launch's checks, into model.package_cache: put
#           it on a shared file system, model.package_cache=/shared/models).
# Output:   multirun/smollm2_clip/ (the table with the Clip-Higher contrast, curves of entropy, clip
#           fractions, length and accuracy). The mechanisms, paired by seed (each run's mean over its last 3
#           training steps): "$PY" sweeps/checks/ladder_mechanisms.py multirun/smollm2_clip --rungs grpo,clip
#           --last 3 --metrics actor/entropy,actor/pg_clipfrac_higher,actor/pg_clipfrac_lower,reward/acc_mean
# Extra overrides pass through: bash sweeps/smollm2_clip.sh train.steps=16
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(bash .ci/venv --find)}"  # the project's interpreter (.venv, or the active environment)
SEEDS="${SEEDS:-0,1,2,3,4}"
"$PY" run.py -m hydra/launcher=parallel sweep=smollm2_clip experiment=smollm2_add2 fixes=grpo,clip seed="$SEEDS" \
    logger=none "$@"
