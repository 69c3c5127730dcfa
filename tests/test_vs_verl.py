"""The verl-side benchmark's pure parts: its overrides translate to verl as the same work, and verl's log is
read as the timed steps it should be (the benchmark itself runs verl: docs/results/benchmarks.md)."""

from __future__ import annotations

import argparse

import pytest

from dapo_exp.backends import verl as vb
from dapo_exp.benchmarks import vs_verl
from dapo_exp.hydra_setup import compose_config


def _args(*argv: str) -> argparse.Namespace:
    return vs_verl.parse_args(list(argv))


def test_verls_side_translates_to_the_same_work(tmp_path):
    args = _args("--prompts", "2", "--responses", "8", "--tokens", "24", "--micro-batch", "8", "--steps", "3")
    cfg = compose_config([o for o in vs_verl.verl_overrides(args, model_path="tiny", out=tmp_path)
                          if not o.startswith("hydra.")])  # run.py's own: the run directory
    v = vb.translate(cfg, label="bench").values
    assert (v["data.train_batch_size"], v["actor_rollout_ref.rollout.n"], v["data.max_response_length"]) == (2, 8, 24)
    # one update per step: the mini-batch is the whole batch (verl counts prompts)
    assert v["actor_rollout_ref.actor.ppo_mini_batch_size"] == 2
    assert v["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == 8
    assert v["actor_rollout_ref.actor.loss_agg_mode"] == "token-mean"
    assert (v["actor_rollout_ref.actor.clip_ratio_low"], v["actor_rollout_ref.actor.clip_ratio_high"]) == (0.2, 0.28)
    assert v["trainer.total_training_steps"] == 1 + 3 + 1 and v["trainer.val_before_train"] is False
    job = vb.translate(cfg, label="bench")
    assert "actor_rollout_ref.rollout.ignore_eos=true" in job.overrides  # every response --tokens long


def test_verls_timed_steps_are_read_from_its_log_and_their_work_checked():
    rows = [{"step": s, "data": {"timing_s/step": 10.0 + s, "response_length/mean": 24, "response_length/min": 24,
                                 "response_length/max": 24}} for s in (1, 2, 3, 4, 5)]
    timed = vs_verl.verl_steps(rows, warmup=1, steps=3)
    assert [r["timing_s/step"] for r in timed] == [12.0, 13.0, 14.0]  # step 1 warm-up, step 5 validates: left out
    vs_verl.check_verl_work(_args("--tokens", "24"), timed)
    with pytest.raises(AssertionError, match=r"timing_s/step for step\(s\) \[4\]"):
        vs_verl.verl_steps([r for r in rows if r["step"] != 4], warmup=1, steps=3)
    short = [{**timed[0], "response_length/min": 7}]
    with pytest.raises(AssertionError, match="not all 24 tokens long"):
        vs_verl.check_verl_work(_args("--tokens", "24"), short)


def test_bad_sizes_are_refused():
    with pytest.raises(SystemExit):
        _args("--steps", "0")
    with pytest.raises(SystemExit):
        _args("--prompts", "3", "--responses", "3", "--micro-batch", "2")


def test_verls_versions_are_read_from_backend_pythons_interpreter(tmp_path, monkeypatch):
    """The summary's versions line runs verl's interpreter (``backend.python``'s default); a missing one is said,
    not raised (a benchmark that ran for half an hour must still print its figures)."""
    from dapo_exp.config import BackendConfig

    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'verl 0.9.1, vllm 0.32.0, torch 2.13.0+cpu'\n")
    fake.chmod(0o755)
    monkeypatch.setattr(BackendConfig, "python", str(fake))
    assert vs_verl.verl_versions() == "verl 0.9.1, vllm 0.32.0, torch 2.13.0+cpu"
    monkeypatch.setattr(BackendConfig, "python", str(tmp_path / "missing" / "python"))
    assert vs_verl.verl_versions().startswith("(versions unreadable: ")
