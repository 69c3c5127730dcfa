"""What a newcomer sees of W&B: where each run writes, unique run names, one offline folder per
run (also after a resume, its history complete) and one analysis summary run per sweep.

All offline (no network, no account): the ``.wandb`` files are read back with the project's own
reader (:mod:`dapo_exp.analysis.wandb_reader`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import SMALL, kill_during_step

from dapo_exp import rundir
from dapo_exp.analysis.wandb_reader import parse_wandb_file
from dapo_exp.train import train

ROOT = Path(__file__).resolve().parents[1]
WANDB = "logger=wandb"
LINE = "[dapo-exp] W&B"


def offline_folders(run_dir: Path) -> list[Path]:
    return sorted((Path(run_dir) / "wandb").glob("offline-run-*"))


def only_wandb_run(run_dir: Path):
    (folder,) = offline_folders(run_dir)
    (f,) = folder.glob("run-*.wandb")
    return parse_wandb_file(f)


def wandb_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(LINE)]


# --------------------------------------------------------------------------- #
# 1. One line per run: where W&B writes and in which mode                      #
# --------------------------------------------------------------------------- #
def test_a_run_prints_one_line_saying_where_wandb_writes_offline(tmp_path, warm_cache):
    job = tmp_path / "job"
    args = [sys.executable, "run.py", *[a for a in SMALL if a != "logger=none"], "train.steps=1",
            f"model.cache_dir={warm_cache}", f"hydra.run.dir={job}"]
    out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = wandb_lines(out.stdout)
    wdir = job.resolve() / "wandb"
    assert line == f"[dapo-exp] W&B offline: {wdir} (upload later: wandb sync {wdir}/offline-run-*)"
    assert len(offline_folders(job)) == 1


def test_one_line_with_wandb_and_none_without(tmp_path, small_cfg, capsys):
    train(small_cfg(tmp_path / "offline", "train.steps=1", WANDB))
    assert wandb_lines(capsys.readouterr().out) == [f"{LINE} offline: {tmp_path / 'offline' / 'wandb'} "
                                                    f"(upload later: wandb sync {tmp_path / 'offline' / 'wandb'}"
                                                    "/offline-run-*)"]
    train(small_cfg(tmp_path / "none", "train.steps=1"))  # SMALL has logger=none
    train(small_cfg(tmp_path / "disabled", "train.steps=1", WANDB, "logger.mode=disabled"))
    assert wandb_lines(capsys.readouterr().out) == []
    assert not (tmp_path / "none" / "wandb").exists() and not (tmp_path / "disabled" / "wandb").exists()


def test_tracker_says_where_it_writes(tmp_path):
    from dapo_exp.tracking import NullTracker, start_tracker

    assert NullTracker().describe() is None
    t = start_tracker("wandb", out_dir=str(tmp_path), config={}, project="p", group="g", name="n", tags=[],
                      mode="offline", run_id="describe-test")
    try:
        wdir = tmp_path / "wandb"
        assert t.describe() == f"W&B offline: {wdir} (upload later: wandb sync {wdir}/offline-run-*)"
        assert t.mode == "offline"
    finally:
        t.finish()


def test_online_fallback_line_says_offline(tmp_path, monkeypatch):
    """A run asked online whose start fails logs offline, and its line says so."""
    import wandb

    from dapo_exp.tracking import WandbTracker, start_tracker

    real = wandb.init

    def no_network(*a, **k):
        if k.get("mode") == "online":
            raise ConnectionError("no network")
        return real(*a, **k)

    monkeypatch.setattr(wandb, "init", no_network)
    t = start_tracker("wandb", out_dir=str(tmp_path), config={}, project="p", group="g", name="n", tags=[],
                      mode="online", run_id="fallback-line-test")
    try:
        assert isinstance(t, WandbTracker)
        assert t.describe().startswith(f"W&B offline: {tmp_path / 'wandb'} ")
    finally:
        t.finish()


def test_the_offline_file_is_complete_when_finish_returns(tmp_path):
    """W&B's service writes the ``.wandb`` file after ``run.finish()`` returns (wandb 0.31: about one
    run in four had no history yet when read at once); the tracker's finish waits for it."""
    from dapo_exp.tracking import start_tracker

    for i in range(16):
        t = start_tracker("wandb", out_dir=str(tmp_path / str(i)), config={}, project="p", group="g", name="n",
                          tags=[], mode="offline", run_id=f"complete-{i}")
        for s in range(5):
            t.log({"x": float(s)}, s)
        t.finish()
        wb = only_wandb_run(tmp_path / str(i))
        assert [h["train/step"] for h in wb.history] == [0, 1, 2, 3, 4] and wb.state == "finished", i


# --------------------------------------------------------------------------- #
# 2. Run names unique per run directory                                         #
# --------------------------------------------------------------------------- #
def test_run_names_differ_across_sweeps_for_the_same_label_and_seed(tmp_path, small_cfg):
    for sweep in ("a", "b"):
        train(small_cfg(tmp_path / sweep / "job", "train.steps=1", "fixes=grpo", "seed=0", WANDB, "sweep=demo"))
    ra, rb = only_wandb_run(tmp_path / "a" / "job"), only_wandb_run(tmp_path / "b" / "job")
    assert ra.name != rb.name and ra.id != rb.id
    assert ra.name.startswith("grpo-s0") and rb.name.startswith("grpo-s0")  # still readable
    assert ra.group == rb.group == "demo"


# --------------------------------------------------------------------------- #
# 3. A resumed run: one offline folder, the whole history                       #
# --------------------------------------------------------------------------- #
def test_resumed_offline_run_leaves_one_folder_with_every_step(tmp_path, small_cfg, monkeypatch, capsys):
    cfg = small_cfg(tmp_path / "run", "train.steps=4", "checkpoint.every=2", "eval.every=2", WANDB)
    kill_during_step(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        train(cfg)
    monkeypatch.undo()
    first = offline_folders(tmp_path / "run")
    assert len(first) == 1
    # (the folder's name has the start time to the second: a resume within the same second reuses it, so the first
    # session's folder is marked, and the mark must be gone)
    (first[0] / "first-session").touch()
    assert train(cfg)["status"] == "finished"  # the same command again: resumes from step 2
    folders = offline_folders(tmp_path / "run")
    assert len(folders) == 1 and not (folders[0] / "first-session").exists()  # a fresh folder replaced the first
    assert len(wandb_lines(capsys.readouterr().out)) == 2  # one line per process start
    wb = only_wandb_run(tmp_path / "run")
    assert first[0].name.endswith(f"-{wb.id}")  # the same W&B run id: the stored one
    rows = [json.loads(x) for x in (tmp_path / "run" / rundir.METRICS).read_text().splitlines()]
    by_step: dict[int, dict] = {}
    for h in wb.history:
        step = h["train/step"]
        assert step not in by_step, f"step {step} logged twice"
        by_step[step] = h
    assert sorted(by_step) == sorted({r["step"] for r in rows}) == [0, 1, 2, 3, 4]
    for r in rows:  # every metric row of the run, train and eval, is in W&B with its values
        h = by_step[r["step"]]
        for k, v in r.items():
            if k != "step":
                assert h[k] == pytest.approx(v), (r["step"], k)
    assert wb.state == "finished"


# --------------------------------------------------------------------------- #
# 4. Re-analysing a sweep replaces its summary run                              #
# --------------------------------------------------------------------------- #
def test_analysing_twice_leaves_one_summary_run(tmp_path, monkeypatch):
    from fixtures_runs import make_sweep

    from dapo_exp.analysis.report import run_analysis

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    sweep = tmp_path / "multirun" / "demo"
    make_sweep(sweep, [("grpo", 0, 0.30, "finished"), ("grpo", 1, 0.34, "finished"),
                       ("clip", 0, 0.40, "finished"), ("clip", 1, 0.36, "finished")])
    out = sweep / "analysis"
    ids = [run_analysis(sweep, out=out, figures=False, wandb_log={"mode": "offline"}).wandb["id"] for _ in range(2)]
    assert ids[0] == ids[1]
    (folder,) = sorted((out / "wandb").glob("offline-run-*"))
    assert folder.name.endswith(ids[1])
    run = parse_wandb_file(next(folder.glob("run-*.wandb")))
    assert run.job_type == "analysis" and "comparison_table" in run.summary


# --------------------------------------------------------------------------- #
# Online: the URL, the server continues the run, nothing removed or replayed   #
# --------------------------------------------------------------------------- #
class OnlineRun:
    """What the tracker reads of an online ``wandb.Run`` (a real one needs a server)."""

    def __init__(self, **init_kwargs):
        from types import SimpleNamespace

        self.init_kwargs, self.logged = init_kwargs, []
        self.settings = SimpleNamespace(mode="online", wandb_dir="unused")
        self.url = "https://wandb.ai/me/dapo-exp/runs/grpo-s0-12345678"

    def define_metric(self, *a, **k):
        pass

    def log(self, row, step):
        self.logged.append((step, row))

    def finish(self, exit_code=0):
        pass


def test_online_run_continues_on_the_server_and_prints_its_url(tmp_path, monkeypatch):
    import wandb

    from dapo_exp.tracking import start_tracker

    earlier = tmp_path / "wandb" / "offline-run-20250101_000000-grpo-s0-12345678"
    earlier.mkdir(parents=True)  # e.g. an earlier session that fell back to offline: left alone online
    monkeypatch.setattr(wandb, "init", lambda **k: OnlineRun(**k))
    t = start_tracker("wandb", out_dir=str(tmp_path), config={}, project="p", group="g", name="grpo-s0-12345678",
                      tags=[], mode="online", run_id="grpo-s0-12345678", history=[{"step": 1, "a": 1.0}])
    assert t.describe() == "W&B online: https://wandb.ai/me/dapo-exp/runs/grpo-s0-12345678"
    assert t.run.init_kwargs["resume"] == "allow" and t.run.init_kwargs["id"] == "grpo-s0-12345678"
    assert t.run.logged == [] and earlier.is_dir()
