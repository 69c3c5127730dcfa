#!/usr/bin/env bash
# Question: on the toy's default regime, which of the GRPO family's published recipes changes
#           held-out accuracy or its mechanism metric against naive GRPO, paired by seed? GRPO, the
#           full DAPO recipe, Dr. GRPO (no std + constant normaliser), GSPO, CISPO, GMPO, Clip-Cov
#           and KL-Cov, and the recipes of verl's other registered estimators and losses (RLOO,
#           REINFORCE++, SAPO, GPG, DRO), each at its paper's values (conf/fixes/<name>.yaml;
#           dapo_exp/fixes/<name>.py).
# Runs:     65 = 13 configurations x 5 seeds (SEEDS=0,1,2,3,4); ARMS=<presets> runs some of them
#           (ARMS=grpo,rloo,reinforce_pp,sapo,gpg,dro: the verl-registry arms beside GRPO, 30 runs).
# Launcher: hydra/launcher=parallel (jobs x threads = cores); hydra/launcher=slurm below.
# Cost:     CPU toy, 2 cores, warm start cached: about 15 min for the 40 runs with the parallel
#           launcher (estimate from the four-preset sweep's ~15 s per run and job). One GPU, toy config: ~1 min
#           per run -> ~40 min (estimate). Measured: the 30 runs of the verl-registry arms (ARMS=grpo,rloo,
#           reinforce_pp,sapo,gpg,dro experiment=toy_fast) took 9.5 min on 2 cores (2026-11-29, a check beside it); the 65 runs
#           of all thirteen (experiment=toy_fast) 66 min beside installs and tests (load 1.2 -> 2.9;
#           sweeps/results/2026-11-30-family, the committed result).
# Regime:   the cost and seed figures above and below are the fast regime's (experiment=toy_fast: 16
#           prompts per step, the toy's default until 2026-11-25), as are the committed results: pass
#           experiment=toy_fast to reproduce them. The default (64 prompts per step) takes about 3.3x the
#           time per run and needs 4-5 seeds per arm for 5 points of final accuracy between two
#           configurations one fix apart (docs/how-to/seeds-and-studies.md).
# Seeds:    5 per arm is the floor for any claim here (sweeps/README.md); `python -m dapo_exp.analysis
#           plan multirun/family` says how many a 5-point accuracy effect needs at the measured spread.
# SLURM:    bash sweeps/family.sh hydra/launcher=slurm hydra.launcher.partition=<partition> \
#               hydra.launcher.gpus_per_node=1 hydra.launcher.timeout_min=120
# Output:   multirun/family/<overrides>/ per run; the Hydra callback writes multirun/family/analysis/
#           (table.md/.csv, figures/). Again later: python -m dapo_exp.analysis multirun/family
# Extra overrides pass through: bash sweeps/family.sh logger=none
# Not arms here: top_entropy=enabled (swept on its own: sweeps/results/2026-11-24-top-entropy) and
#           rollout_correction=enabled|icepop (switches without a preset;
#           rollout correction needs an engine that reports its log-probs, rollout=vllm). A two-level
#           design over switches that combine, for the attribution code (effects, aliasing):
#           python -m dapo_exp.analysis design fractional --switches dr_grpo_adv,gspo,top_entropy
#           prints one line of overrides per configuration (as sweeps/fractional.sh loops over them).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(bash .ci/venv --find)}"  # the project's interpreter (.venv, or the active environment)
SEEDS="${SEEDS:-0,1,2,3,4}"
ARMS="${ARMS:-grpo,full,dr_grpo,gspo,cispo,gmpo,clip_cov,kl_cov,rloo,reinforce_pp,sapo,gpg,dro}"
"$PY" run.py -m hydra/launcher=parallel sweep=family fixes="$ARMS" seed="$SEEDS" "$@"
