#!/usr/bin/env bash
# Question: on the CPU testbed regime built for it, does each fix act through the mechanism the
#           DAPO paper gives for it, in the predicted direction? One study per fix: GRPO with the
#           fix off vs on, paired by seed (dapo_exp/analysis/studies.py lists each study's regime,
#           mechanism metrics and predicted signs; README "What the toy shows").
#             clip_higher          experiment=toy_clip          the rare strategy's share, entropy
#             dynamic_sampling     experiment=toy_ds            effective (non-zero advantage) batch
#             token_level_loss     experiment=toy_degeneration  share of looping responses, length
#             overlong_filtering   experiment=toy_overlong      the long strategy's share
#             overlong_punishment  experiment=toy_overlong      truncation rate
# Usage:    bash sweeps/toy_studies.sh [STUDY ... | all] [-- hydra overrides]
#           SEEDS=0,1,2,3,4 (default; at least 5 for a claim)
# Runs:     10 per study = 2 arms x 5 seeds; 50 for all five.
# Cost:     CPU (2 cores): one warm start per regime (about 1-2.5 min, cached), then about 25-50 s
#           per run; see the sweep log (sweeps/README.md) for the measured wall time of each study.
# Output:   multirun/toy_<regime>_<fix>/ per study (the Hydra callback's table and curves in
#           analysis/), and the study's paired table and curves in multirun/toy_<regime>_<fix>/study/
#           (python -m dapo_exp.analysis study multirun/<sweep> --study <fix>).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(bash .ci/venv --find)}"  # the project's interpreter (.venv, or the active environment)
SEEDS="${SEEDS:-0,1,2,3,4}"
studies=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do studies+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
if [ ${#studies[@]} -eq 0 ] || [ "${studies[0]}" = all ]; then
    mapfile -t studies < <("$PY" -c "from dapo_exp.analysis.studies import STUDIES; print('\n'.join(STUDIES))")
fi
for s in "${studies[@]}"; do
    { read -r sweep; read -r cmd; } < <("$PY" -c "import sys; from dapo_exp.analysis.studies import STUDIES; s = STUDIES[sys.argv[1]]; print(s.sweep); print(s.command(sys.argv[2]))" "$s" "$SEEDS")
    [ -n "${cmd:-}" ] || { echo "toy_studies.sh: no study $s (see dapo_exp/analysis/studies.py)" >&2; exit 2; }
    echo "[toy_studies] $cmd $*"
    # shellcheck disable=SC2086  # the study's command, words split on purpose, run with the project's interpreter
    "$PY" ${cmd#python } "$@"
    "$PY" -m dapo_exp.analysis study "multirun/$sweep" --study "$s"
done
