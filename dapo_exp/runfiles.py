"""The files a run writes into its output directory: the contract between the
trainer (writer) and ``dapo_exp.analysis`` (reader). Plain constants, no imports.

Run directory layout::

    <run>/metrics.jsonl        one JSON object per line: {"step": int, "<ns>/<name>": float, ...}
                               training lines every rollout step; eval lines (keys "eval/...")
                               at the steps where evaluation ran (step 0 = before training)
    <run>/summary.json         written at the end (status "finished") or on a crash ("failed"):
                               {"status", "label", "preset", "switches": {fix: bool}, "seed",
                                "config": <resolved config>, "git_commit", "wall_time_s",
                                "steps_done", "final": {"eval/...": float}, "best": {...},
                                "base": {...eval at step 0}, "error": str | None}
    <run>/eval_samples.jsonl   every evaluation sample: {"step", "problem_id", "sample",
                               "prompt", "response", "answer", "pred", "correct", "length",
                               "truncated"}
    <run>/train_samples.jsonl  a few training rollouts per step (same keys + "reward", "group")
    <run>/checkpoints/step_<n>/ model.safetensors, trainer_state.pt (optimizer, scheduler,
                               RNG states, data position, step, eval history)
    <run>/wandb/               the W&B run (offline by default)
    <run>/.hydra/              Hydra's record of the composed config and overrides
"""

METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
EVAL_SAMPLES = "eval_samples.jsonl"
TRAIN_SAMPLES = "train_samples.jsonl"
CHECKPOINTS = "checkpoints"

STATUS_FINISHED = "finished"
STATUS_FAILED = "failed"
STATUS_RUNNING = "running"

# Main metric names (documented one line each with their formula in README.md).
EVAL_ACC = "eval/acc_avg"  # avg@k accuracy: mean over problems and k samples of correct
EVAL_PASS = "eval/pass_at_k"  # unbiased pass@k
EVAL_MAJ = "eval/maj_at_k"  # majority vote over normalised answers
EVAL_LEN = "eval/response_len_mean"
EVAL_TRUNC = "eval/truncated_frac"
EVAL_ENTROPY = "eval/entropy"
ENTROPY = "actor/entropy"
RESP_LEN = "response_length/mean"
RESP_LEN_MAX = "response_length/max"
TRUNC = "response_length/clip_ratio"
CLIP_HIGH = "actor/pg_clipfrac_higher"
CLIP_LOW = "actor/pg_clipfrac_lower"
ZERO_VAR = "dynamic_sampling/zero_var_frac"
GEN_ROUNDS = "dynamic_sampling/gen_rounds"
ROLLOUTS_PER_TRAINED = "dynamic_sampling/rollouts_per_trained"
CUM_ROLLOUTS = "compute/rollouts_total"
CUM_TOKENS = "compute/gen_tokens_total"
