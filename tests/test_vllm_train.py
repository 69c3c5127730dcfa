"""A short `rollout=vllm` toy run through the real training loop (vLLM's CPU build in CI)."""

import json
import os

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# the whole test command (bash .ci/test) runs this with verl's interpreter, whose environment holds vLLM's CPU build
pytest.importorskip("vllm", reason="vllm is not installed here: bash .ci/test runs this in verl's environment "
                                   "(.venv-verl), which has it")

from dapo_exp import rundir  # noqa: E402
from dapo_exp.train import train  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_vllm_toy_run_with_dynamic_sampling_logs_mismatch_and_follows_updates(tmp_path, small_cfg):
    s = train(small_cfg(tmp_path, "rollout=vllm", "fixes=full", "train.steps=3"))
    assert s["status"] == "finished"
    rows = [json.loads(x) for x in (tmp_path / rundir.METRICS).read_text().splitlines()]
    steps = [r for r in rows if "rollout/logp_absdiff_max" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        assert r["dynamic_sampling/gen_rounds"] >= 1
        # step 2 and 3 sample after the optimizer updated the trainer: a failed in-place
        # weight sync would show up here as a large gap between vLLM's and the trainer's log-probs
        assert r["rollout/logp_absdiff_max"] < 1e-3, r
        assert abs(r["rollout/ratio_mean"] - 1.0) < 1e-3
    assert any(r["actor/grad_norm"] > 0 for r in steps)
