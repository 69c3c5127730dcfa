#!/usr/bin/env bash
# Runs the four presets and the ladder's six rows (seed 0), plus the `full` preset killed with
# SIGKILL mid-run (a few seconds after its first checkpoint, however loaded the machine) and resumed, in the
# checkout REPO, writing to OUT. Compare two such outputs with
#   python -m dapo_exp.benchmarks.compare_runs OUT_A OUT_B --also killed/full::sweep/fixes=full,seed=0
# usage: bash sweeps/checks/refactor_check.sh REPO OUT [PYTHON]
# FIXES=<presets, comma-separated> replaces the four presets and the ladder's six rows; every preset of the older
# checkout: FIXES="$(cd OLD/conf/fixes && ls *.yaml | sed 's/\.yaml$//' | paste -sd,)"
set -uo pipefail
REPO="$(cd "$1" && pwd)"; OUT="$(mkdir -p "$2" && cd "$2" && pwd)"; PY="${3:-$REPO/.venv/bin/python}"
cd "$REPO"
export OMP_NUM_THREADS=1 WANDB_MODE=disabled
"$PY" run.py -m fixes="${FIXES:-grpo,clip,clip_ds,full,paper_1_grpo,paper_2_of,paper_3_clip,paper_4_sop,paper_5_tl,paper_6_dapo}" \
    seed=0 logger=none hydra/launcher=parallel hydra.sweep.dir="$OUT/sweep" > "$OUT/sweep.log" 2>&1
echo "sweep exit $?"
# killed 3 s after its first checkpoint (checkpoint.every=5) is written, then resumed
"$PY" run.py fixes=full seed=0 logger=none checkpoint.every=5 hydra.run.dir="$OUT/killed/full" > "$OUT/killed.log" 2>&1 &
pid=$!
until ls "$OUT/killed/full/checkpoints/"step_* >/dev/null 2>&1 || ! kill -0 "$pid" 2>/dev/null; do sleep 1; done
sleep 3; kill -9 "$pid" 2>/dev/null; wait "$pid"
echo "killed run exit $? (137 = killed)"; ls "$OUT/killed/full/checkpoints" 2>/dev/null
"$PY" run.py fixes=full seed=0 logger=none checkpoint.every=5 hydra.run.dir="$OUT/killed/full" >> "$OUT/killed.log" 2>&1
echo "resumed run exit $?"
