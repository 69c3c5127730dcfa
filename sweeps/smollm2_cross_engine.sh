#!/usr/bin/env bash
# Question: does the real model's Clip-Higher study give the same mechanism and verdict on verl's trainer?
#           The two arms of sweeps/smollm2_clip.sh (GRPO and + Clip-Higher on experiment=smollm2_add2:
#           SmolLM2-135M-Instruct on two-digit sums as chat turns) trained by verl 0.9.1's trainer on this
#           CPU (backend=verl train.device=cpu: vLLM's CPU build generates from the converted model
#           directory, FSDP2 trains on the CPU), then each arm compared with the native runs across engines
#           and the fix's effect on each engine (sweeps/checks/cross_engine.py).
# Runs:     4 = 2 arms (fixes=grpo,clip) x 2 seeds (SEEDS=0,1), one after another (each starts its own Ray
#           and vLLM); the native half is sweeps/smollm2_clip.sh's (run it first: its 5 seeds per arm).
# Prompts:  task.max_prompt_len=168 (add2's prompts are 161 tokens at most on SmolLM2's tokenizer, held by
#           tests/test_chat_tasks.py): verl pads every prompt to it (data.max_prompt_length), so its rows are 200
#           positions instead of the task's 320; natively it is only a cap no add2 prompt reaches, so the native
#           half (run at the preset's 288) trained on the same token streams.
# Cost:     before the cap, a verl step of 2 prompts x 8 responses took 146 s on the 2-core CPU (4.3x dapo-exp's,
#           python -m dapo_exp.benchmarks.three_engines, sweeps/README.md 2026-11-28 (evening)); this study's
#           steps are twice that work, so a run of 8 steps, two validations and start-up was estimated at 40-45
#           min, the four runs 2-3 hours one after another (each starts its own Ray and vLLM). Measured with the
#           cap (2026-11-28, seed 0 of each arm): 2,368-2,507 s a run, 230-308 s a step (generation 20 s, the
#           update 180 s, old log-probs 67 s), so about 2 h 40 min for the four; the seeds 1 (2026-11-29, load 2-5):
#           2,513-2,678 s.
# SLURM:    one job per run: add backend.launch=slurm (hydra/launcher=slurm is for the native half).
# Needs:    verl's environment (.venv-verl: bash .ci/install-verl).
# Output:   multirun/smollm2_clip_verl/ and the comparison in multirun/smollm2_cross_engine/.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(bash .ci/venv --find)}"  # the project's interpreter (.venv, or the active environment)
SEEDS="${SEEDS:-0,1}"
"$PY" run.py -m sweep=smollm2_clip_verl backend=verl train.device=cpu experiment=smollm2_add2 \
    fixes=grpo,clip seed="$SEEDS" logger=none task.max_prompt_len=168 "$@"
"$PY" sweeps/checks/cross_engine.py multirun/smollm2_clip multirun/smollm2_clip_verl multirun/smollm2_cross_engine \
    --arms grpo,clip --title "GRPO vs + Clip-Higher on SmolLM2-135M-Instruct (experiment=smollm2_add2)"
