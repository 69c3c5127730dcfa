"""Tracking never branches the loop and never kills training."""

import json

from dapo_exp import rundir
from dapo_exp.tracking import NullTracker, WandbTracker, start_tracker


class BrokenRun:
    dir = None
    summary = {}

    def __init__(self):
        self.calls = 0

    def log(self, *a, **k):
        self.calls += 1
        raise ConnectionError("W&B backend went away")

    def finish(self, *a, **k):
        raise ConnectionError("still gone")


def test_none_backend_is_a_no_op():
    t = start_tracker("none", out_dir=".", config={}, project="p", group=None, name="n", tags=[])
    assert isinstance(t, NullTracker)
    t.log({"a": 1.0}, step=1)
    t.summary({"b": 2})
    t.finish()


def test_a_failing_wandb_run_degrades_to_a_no_op(caplog):
    run = BrokenRun()
    t = WandbTracker(run)
    t.log({"a": 1.0}, step=1)  # raises inside, swallowed
    t.log({"a": 2.0}, step=2)  # no second attempt once failed
    t.finish()
    assert run.calls == 1
    assert any("continuing without W&B" in r.getMessage() for r in caplog.records)


def test_training_survives_wandb_init_failure(tmp_path, small_cfg, monkeypatch):
    import wandb

    calls = []

    def boom(*a, **k):
        calls.append(k)
        raise RuntimeError("no W&B here")

    monkeypatch.setattr(wandb, "init", boom)
    s = train_small(tmp_path, small_cfg, "logger=wandb")
    assert len(calls) == 1  # W&B really was asked for, and failed
    assert s["status"] == "finished"
    assert json.loads((tmp_path / rundir.SUMMARY).read_text())["status"] == "finished"


def test_wandb_offline_run_holds_config_commit_and_tags(tmp_path, small_cfg):
    s = train_small(tmp_path, small_cfg, "logger=wandb", "sweep=demo")
    files = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1
    from dapo_exp.analysis.wandb_reader import parse_wandb_file

    rec = parse_wandb_file(files[0])
    text = json.dumps(rec.__dict__ if hasattr(rec, "__dict__") else rec, default=str)
    assert s["git_commit"] in text and "demo" in text and "clip_higher" in text


def train_small(tmp_path, small_cfg, *overrides):
    from dapo_exp.train import train

    return train(small_cfg(tmp_path, "train.steps=1", *overrides))
