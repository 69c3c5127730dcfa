"""A real pretrained language model trained through the project: SmolLM2-135M-Instruct (model=smollm2_135m,
from its pinned wheel) on chat_arith's two-digit sums, two GRPO steps on this CPU, through `python run.py` as a
user runs it; its samples scored by the project's verifier as the run scored them. Skips, saying why, where
the package registry cannot be reached and no converted copy is cached (the smollm2_dir fixture)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dapo_exp import rundir
from dapo_exp.packaged_models import SMOLLM2_135M

ROOT = Path(__file__).resolve().parents[1]
# two steps of 1 prompt x 8 responses (at the base pass@1 of about 0.34, both steps' groups are all right or all
# wrong, so that no gradient flows, with a chance of about 0.1%), a 24-token cap; evaluations of 4 held-out
# problems x 2 samples
TWO_STEPS = ["experiment=smollm2_add2", "fixes=grpo", "train.steps=2", "train.prompts_per_step=1", "rollout.n=8",
             "train.mini_batch_size=8", "train.micro_batch_size=4", "rollout.max_response_len=24",
             "eval.problems=4", "eval.k=2", "eval.final_problems=4", "eval.final_samples=2", "eval.every=0",
             "checkpoint.every=0", "logger=none"]


@pytest.mark.slow
def test_smollm2_trains_two_grpo_steps_from_run_py_and_its_samples_score_as_logged(tmp_path, smollm2_dir):
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "run.py", *TWO_STEPS, f"hydra.run.dir={out}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # the launch line stated the measured cost before compute
    assert "s of one core per step (measured, notes.cpu_s_per_step)" in proc.stdout
    summary = json.loads((out / rundir.SUMMARY).read_text())
    assert summary["status"] == "finished" and summary["steps_done"] == 2
    assert summary["n_params"] == 134_515_008
    base = summary["base_model"]
    assert base["path"] == smollm2_dir
    assert base["source"]["wheel_sha256"] == SMOLLM2_135M.wheel_sha256
    assert base["source"]["member_sha256"] == SMOLLM2_135M.member_sha256
    rows = [json.loads(x) for x in (out / rundir.METRICS).read_text().splitlines()]
    steps = [r for r in rows if r.get("step", 0) >= 1 and "actor/grad_norm" in r]
    assert [r["step"] for r in steps] == [1, 2]
    # the policy moved: a gradient where a group was mixed, a finite loss, an entropy of a real model's sampling
    assert any(r["actor/grad_norm"] > 0 for r in steps), [(r["reward/acc_mean"], r["actor/grad_norm"]) for r in steps]
    assert all(abs(r["actor/pg_loss"]) < 1e3 for r in steps)
    assert all(0.05 < r["actor/entropy"] < 5.0 for r in steps)
    # every evaluated sample: the verifier, run again on the saved text, gives the run's own score
    from dapo_exp.tasks.verifier import get_verifier

    samples = [json.loads(x) for x in (out / rundir.EVAL_SAMPLES).read_text().splitlines()]
    assert len(samples) == 2 * 4 * 2  # before and after training, 4 problems x 2
    with get_verifier("math_dapo", 5.0, 1) as verifier:
        again = verifier.verify_batch([s["response"] for s in samples], [s["answer"] for s in samples])
    assert [r.correct for r in again] == [s["correct"] for s in samples]
    # a real instruct model shown worked examples answers in the format the reward reads
    assert sum("Answer:" in s["response"] for s in samples) >= len(samples) // 2
