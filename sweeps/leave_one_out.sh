#!/usr/bin/env bash
# Question: which fix of the released recipe matters most? Remove one at a time from `full`
#           (clip-higher, dynamic sampling, token-level loss, soft overlong punishment) and compare
#           with `full` (the paper's verl re-runs: DAPO 52, without dynamic sampling 50).
# Runs:     15 = 5 configurations (full, full_no_clip, full_no_ds, full_no_tl, full_no_sop) x 3 seeds.
# Launcher: hydra/launcher=parallel: the runs side by side, jobs x threads = cores (a launcher
#           given as an extra override wins: hydra/launcher=basic runs them one after another).
# Cost:     CPU toy (default config, 2 cores): measured 27-38 s per run on the earlier toy (2026-11-22; the
#           testbed's headroom regime: 26-55 s per run, two at a time with the parallel launcher; 28 s per
#           run once the warm start is cached) -> about 7-10 min for 15 runs one after another.
#           One GPU, toy config: ~1 min per run -> ~15 min (estimate). A 0.5B-1.5B model on
#           task=dapo_math: hours per run (estimate: measure one run first).
# Regime:   the cost and seed figures above and below are the fast regime's (experiment=toy_fast: 16
#           prompts per step, the toy's default until 2026-11-25), as are the committed results: pass
#           experiment=toy_fast to reproduce them. The default (64 prompts per step) takes about 3.3x the
#           time per run and needs 4-5 seeds per arm for 5 points of final accuracy between two
#           configurations one fix apart (docs/how-to/seeds-and-studies.md).
# Seeds:    from the pilot, `python -m dapo_exp.analysis plan sweeps/results/2026-11-22-four_presets/table.csv
#           --delta 5` (the four-preset sweep on the toy, 3 seeds; final acc): sd across seeds 4.37 pp (8 df),
#           sd of per-seed differences to grpo 6.14 pp (6 df) -> 14 seeds per configuration for power 0.8 at
#           delta 5 pp, unpaired and paired (22 / 26 with the sd at its 80% upper bound). 95% half-widths with
#           3 / 5 / 10 seeds: mean ±10.9 / 5.4 / 3.1 pp, paired difference ±15.3 / 7.6 / 4.4 pp.
# SLURM:    bash sweeps/leave_one_out.sh hydra/launcher=slurm hydra.launcher.partition=<partition> \
#               hydra.launcher.gpus_per_node=1 hydra.launcher.timeout_min=120
# Output:   multirun/leave_one_out/; table and curves in multirun/leave_one_out/analysis/
#           (no grpo row here, so no difference column; analyse together with four_presets for one:
#            python -m dapo_exp.analysis multirun/four_presets multirun/leave_one_out --out analysis_out/loo)
# Extra overrides pass through: bash sweeps/leave_one_out.sh train.steps=60
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(bash .ci/venv --find)}"  # the project's interpreter (.venv, or the active environment)
SEEDS="${SEEDS:-0,1,2}"
"$PY" run.py -m hydra/launcher=parallel sweep=leave_one_out \
    fixes=full,full_no_clip,full_no_ds,full_no_tl,full_no_sop \
    seed="$SEEDS" "$@"
