#!/usr/bin/env bash
# The checks that need a GPU, in one command sized for a short loan of one GPU machine (about 8 minutes
# on one H100): the GPU tests, the toy ablation on CUDA, the trainer's step at the qwen0.5b_gsm8k preset's
# micro-batch shape (speed and peak memory), and the preset itself through run.py with a random
# 0.5B-shaped Qwen2 (rollout=hf: vLLM is not on the machine), which measures the per-step cost lines of
# conf/experiment/qwen0.5b_gsm8k.yaml and docs/how-to/gpu.md. Results: sweeps/results/<date>-gpu/.
#
#   bash sweeps/checks/gpu_check.sh OUT [phase ...]     # phases: env preset shape tests toy (default: all)
#
# Needs: torch with CUDA, transformers, pandas, scipy, statsmodels, matplotlib, tabulate (the GPU machine
# has them); hydra-core, omegaconf, antlr4-python3-runtime, hydra-joblib-launcher and pyDOE3 as wheels in
# .whl/ when they are not installed (installed here under /tmp/site). Every phase has its own time limit
# and writes OUT/<phase>.log, so one failing phase does not cost the others.
# It runs the project's interpreter, as the recipes under sweeps/ do (.ci/venv: the active environment, else
# .venv); PYTHON=<interpreter> names another (a GPU machine without the project's environment: PYTHON=python3).
# CPU smoke test of the script itself (no GPU; tiny sizes): DEVICE=cpu SIZE=0.4M SCALE=smoke bash ... OUT
set -u -o pipefail
OUT=${1:?usage: gpu_check.sh OUT [phase ...]}
shift
PHASES=${*:-env preset shape tests toy}
DEVICE=${DEVICE:-cuda}
SIZE=${SIZE:-0.5B}
SCALE=${SCALE:-full}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/../.." || exit 1
PY="${PYTHON:-$(bash .ci/venv --find)}"  # the project's interpreter (.venv, or the active environment)
[ -n "$PY" ] || { echo "gpu_check.sh: no project environment (bash .ci/install makes one); or name an interpreter: PYTHON=python3" >&2; exit 1; }
WORK=${WORK:-/tmp/gpu_check}
rm -rf "$WORK" && mkdir -p "$WORK"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
if [ -d .whl ] && ! "$PY" -c "import hydra, omegaconf, pyDOE3" 2>/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "wheel install failed"; exit 1; }
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

phase_env() {
    date -u; uptime; nvidia-smi 2>&1 | head -15
    "$PY" -c "import torch, transformers, hydra; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-', 'transformers', transformers.__version__,
'hydra', hydra.__version__)"
    git log -1 --format='commit %H %s' 2>/dev/null || true
}

phase_tests() {
    timeout 170 "$PY" -m pytest tests/test_gpu.py -q -p no:cacheprovider 2>&1 | tail -25
}

phase_toy() {
    # the README's four presets on the embedded toy, on CUDA, one seed (plumbing: nothing concluded from it)
    local t0=$SECONDS extra=() rc
    [ "$SCALE" = smoke ] && extra=(experiment=toy_fast train.steps=2)
    timeout 160 "$PY" run.py -m fixes=grpo,clip,clip_ds,full seed=0 "train.device=$DEVICE" logger=none \
        hydra/launcher=parallel sweep=gpu_check_toy "hydra.sweep.dir=$WORK/toy" "${extra[@]}" 2>&1 | tail -40
    rc=$?
    echo "toy ablation wall $((SECONDS - t0)) s"
    cat "$WORK/toy/analysis/table.md"
    return $rc
}

phase_shape() {
    # the preset's micro-batch: 16 rows = 2 prompts x 8 responses; the cost estimate's ~450 tokens per row
    # (prompt ~150 BPE tokens + ~300 response), then the worst case: a 512-token prompt and responses truncated
    # at rollout.max_response_len=1024; share_prompt_forward on (the default) and off
    local shape=qwen2.5-0.5b steps=3 rc=0
    [ "$SCALE" = smoke ] && shape=0.4M steps=1
    for args in "--prompt 150 --response 300 --share-prompts" "--prompt 512 --response 1024 --share-prompts" \
                "--prompt 512 --response 1024"; do
        echo "== --batch 16 --group 8 $args"
        # shellcheck disable=SC2086
        timeout 90 "$PY" -m dapo_exp.benchmarks.trainer_throughput --shape $shape --batch 16 --group 8 \
            --steps $steps --device "$DEVICE" $args 2>&1 | tail -6 || rc=$?
    done
    return $rc
}

make_gsm8k_files() {
    # GSM8K's schema (question, answer ending "#### N") with GSM8K-length word problems, built here
    "$PY" - "$WORK" <<'EOF'
import json, random, sys
rng = random.Random(0)
names = ["Natalia", "Weng", "Betty", "Julie", "James", "Albert", "Mark", "Tina", "Ken", "Alexis"]
things = ["clips", "apples", "books", "pencils", "marbles", "cookies", "stickers", "shells"]
def row():
    n, t = rng.choice(names), rng.choice(things)
    a, b, c = rng.randint(12, 90), rng.randint(2, 9), rng.randint(3, 40)
    q = (f"{n} sold {a} {t} to her friends in April, and then she sold {b} times as many {t} in May. "
         f"In June she gave away {c} {t} to her neighbours. How many {t} did {n} sell or give away "
         f"altogether in April, May and June?")
    return {"question": q, "answer": f"{a} + {a * b} + {c} = {a + a * b + c}\n#### {a + a * b + c}"}
for name, k in (("train", 512), ("test", 64)):
    with open(f"{sys.argv[1]}/{name}.jsonl", "w") as f:
        f.writelines(json.dumps(row()) + "\n" for _ in range(k))
EOF
}

phase_preset() {
    # experiment=qwen0.5b_gsm8k as shipped (64 prompts x 8 = 512 responses per step, mini-batch 128,
    # micro-batch 16, lr 1e-6, clip 0.2/0.28) with a random 0.5B-shaped Qwen2 and rollout=hf. A random
    # model never stops early: every response runs to the cap, so rollout.max_response_len=320 puts the
    # step at the cost estimate's ~300 generated tokens per response (0.15M per step). Steps 2-3 are
    # compiled; step 1 includes the decode's compilation.
    local model=$WORK/model steps=3 extra=()
    [ "$SCALE" = smoke ] && steps=1 extra=(train.prompts_per_step=2 train.mini_batch_size=16 train.micro_batch_size=8)
    "$PY" -m dapo_exp.benchmarks.random_models --out "$model" --size "$SIZE" --chat-template 2>&1 | tail -2
    make_gsm8k_files
    local t0=$SECONDS
    timeout 330 "$PY" run.py experiment=qwen0.5b_gsm8k "model.path=$model" model.name=random-q05 rollout=hf \
        "train.device=$DEVICE" logger=none fixes=clip seed=0 "train.steps=$steps" \
        "task.train_source=$WORK/train.jsonl" "task.eval_source=$WORK/test.jsonl" task.eval_limit=8 eval.k=1 \
        eval.before_training=false checkpoint.every=0 rollout.max_response_len=320 algo.overlong_cache_len=64 \
        "hydra.run.dir=$WORK/preset" "${extra[@]}" 2>&1 | tail -30
    local rc=$?
    echo "preset run wall $((SECONDS - t0)) s"
    cp "$WORK/preset/metrics.jsonl" "$OUT/preset_metrics.jsonl" 2>/dev/null
    "$PY" - "$WORK/preset/metrics.jsonl" <<'EOF'
import json, sys
keys = ["timing_s/gen", "timing_s/update_actor", "timing_s/step", "perf/gen_tokens_per_s",
        "perf/train_tokens_per_s", "perf/gpu_mem_peak_gib", "perf/gpu_mem_reserved_gib", "response_length/mean",
        "dynamic_sampling/rollouts_generated"]
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "timing_s/step" in r:
        print(f"step {r['step']}: " + ", ".join(f"{k} {r[k]:.2f}" for k in keys if k in r))
EOF
    return $rc
}

for phase in $PHASES; do
    t0=$SECONDS
    "phase_$phase" >"$OUT/$phase.log" 2>&1
    rc=$?
    echo "=== $phase: exit $rc in $((SECONDS - t0)) s" >>"$OUT/summary.txt"
    tail -12 "$OUT/$phase.log" >>"$OUT/summary.txt"
done
cat "$OUT/summary.txt"
