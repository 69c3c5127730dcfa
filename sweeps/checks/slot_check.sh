#!/usr/bin/env bash
# A quick check of a change to the slots, the plan or the steps: 17 short runs of the toy (3 steps of 8 prompts
# x 4, seed 0) that between them fill every slot with each built-in fix (the DAPO fixes and their variants,
# the GRPO family, top-entropy, both rollout corrections, three estimators of verl's registry, ReMax's with its
# greedy baseline among them, and a loss of it), in the checkout REPO, writing to OUT. About 1.5 min on one core.
# Compare two such outputs (before and after the change) with
#   python -m dapo_exp.benchmarks.compare_runs OUT_A OUT_B --new-metrics-ok
# (exit 0: every metric of every step identical; metrics the change added are listed, not counted).
# sweeps/checks/refactor_check.sh is the long check (the headline's 30-step runs, a kill and resume).
# usage: bash sweeps/checks/slot_check.sh REPO OUT [PYTHON]
set -uo pipefail
REPO="$(cd "$1" && pwd)"; OUT="$(mkdir -p "$2" && cd "$2" && pwd)"; PY="${3:-$REPO/.venv/bin/python}"
cd "$REPO"
export OMP_NUM_THREADS=1 WANDB_MODE=disabled
SMALL=(train.steps=3 train.prompts_per_step=8 rollout.n=4 train.mini_batch_size=16 train.micro_batch_size=8
       task.arith_n_eval=16 eval.k=2 eval.every=0 checkpoint.every=0 logger=none seed=0)
CONFIGS=("fixes=full" "fixes=paper_6_dapo" "fixes=grpo" "fixes=clip_cov" "fixes=kl_cov" "fixes=gspo" "fixes=cispo"
         "fixes=gmpo" "fixes=dr_grpo" "fixes=grpo top_entropy=enabled" "fixes=grpo rollout_correction=enabled"
         "fixes=grpo rollout_correction=icepop" "fixes=full algo.ds_signal=reward algo.ds_surplus=carry"
         "experiment=toy_overlong fixes=paper_6_dapo" "fixes=reinforce_pp overlong_punishment=soft" "fixes=gpg"
         "fixes=grpo remax=enabled")
failed=0
for i in "${!CONFIGS[@]}"; do
    name="$(printf '%02d' "$i")_$(echo "${CONFIGS[$i]}" | tr ' =' '_-')"
    # shellcheck disable=SC2086  # a config is several overrides
    if ! "$PY" run.py ${CONFIGS[$i]} "${SMALL[@]}" hydra.run.dir="$OUT/$name" > "$OUT/$name.log" 2>&1; then
        echo "FAILED: ${CONFIGS[$i]} (see $OUT/$name.log)"; failed=1
    fi
done
echo "slot check: ${#CONFIGS[@]} runs in $OUT"
exit $failed
