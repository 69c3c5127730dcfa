"""End-to-end runs of the training loop on the toy (shrunken; see helpers.SMALL)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import NO_FIGURES, kill_during_step

from dapo_exp import rundir
from dapo_exp.train import train

ROOT = Path(__file__).resolve().parents[1]
PRESETS = sorted(p.stem for p in (ROOT / "conf" / "fixes").glob("*.yaml"))
# wall-clock figures differ between identical runs; everything else must not
VOLATILE = ("timing_s/", "perf/")
# The evaluations a test does not assert on, shrunk: the final evaluation on 1 sample per problem (8 x 1 instead of
# helpers.SMALL's 8 x 8, which was about half of a 2-step run's compute) and, where nothing reads step 0, no
# evaluation of the base policy. The final evaluation itself still runs (the summary's final accuracy).
FINAL_1 = "eval.final_samples=1"
NO_BASE_EVAL = "eval.before_training=false"


def metrics(run_dir):
    rows = [json.loads(x) for x in (Path(run_dir) / rundir.METRICS).read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_trains_two_steps(preset, tmp_path, small_cfg):
    s = train(small_cfg(tmp_path, f"fixes={preset}", FINAL_1, NO_BASE_EVAL))
    assert s["status"] == "finished" and s["steps_done"] == 2 and s["label"] == preset
    rows = metrics(tmp_path)
    steps = [r["step"] for r in rows if "reward/mean" in r]
    assert steps == [1, 2]
    for r in rows:
        if "reward/mean" in r:
            assert r["actor/n_updates"] >= 1 and r["dynamic_sampling/gen_rounds"] >= 1
    assert 0.0 <= s["final"]["eval/acc_avg"] <= 1.0
    assert json.loads((tmp_path / rundir.SUMMARY).read_text())["switches"] == s["switches"]


def test_same_seed_gives_identical_metrics_and_other_seed_differs(tmp_path, small_cfg):
    train(small_cfg(tmp_path / "a", "seed=3", FINAL_1))
    train(small_cfg(tmp_path / "b", "seed=3", FINAL_1))
    train(small_cfg(tmp_path / "c", "seed=4", FINAL_1))
    assert metrics(tmp_path / "a") == metrics(tmp_path / "b")
    assert metrics(tmp_path / "a") != metrics(tmp_path / "c")


# the default recipe, and a fix that draws randomness of its own: Clip-Cov detaching a random half of the tokens
# (a band holding every token's covariance), so that a resume drawing other tokens would change the metrics
RESUMED = {"full": (), "clip_cov": ("fixes=clip_cov", "algo.clip_cov_ratio=0.5", "algo.clip_cov_lb=-1e9",
                                    "algo.clip_cov_ub=1e9")}


@pytest.mark.parametrize("recipe", sorted(RESUMED))
def test_kill_and_resume_gives_identical_metrics(tmp_path, small_cfg, monkeypatch, recipe):
    # the final evaluation on 2 samples per problem (helpers.SMALL's 8 would be 4x the samples compared)
    overrides = ("train.steps=4", "checkpoint.every=2", "eval.every=2", "eval.final_samples=2", *RESUMED[recipe])
    train(small_cfg(tmp_path / "whole", *overrides))

    kill_during_step(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        train(small_cfg(tmp_path / "killed", *overrides))
    assert json.loads((tmp_path / "killed" / rundir.SUMMARY).read_text())["status"] == "failed"
    assert (tmp_path / "killed" / "checkpoints" / "step_0000002").exists()
    monkeypatch.undo()
    s = train(small_cfg(tmp_path / "killed", *overrides))  # the same command again: resumes
    assert s["status"] == "finished"
    assert metrics(tmp_path / "killed") == metrics(tmp_path / "whole")
    read = lambda d: (tmp_path / d / rundir.EVAL_SAMPLES).read_text()  # noqa: E731
    assert read("killed") == read("whole")


def test_a_run_is_frozen_and_its_resumed_progress_carries_the_checkpoint(tmp_path, small_cfg):
    """What a run is built from is frozen (no field bound again); what resume binds is its Progress: the newest
    checkpoint's state and step, the sampler at the state's position, the writers, a no-op tracker."""
    import dataclasses

    from dapo_exp import checkpoint, runner
    from dapo_exp.build import Progress, RunState, build_run
    from dapo_exp.tracking import NullTracker
    from dapo_exp.train import preflight

    cfg = small_cfg(tmp_path, "train.steps=2", FINAL_1, NO_BASE_EVAL)
    train(cfg)
    saved = RunState.from_checkpoint(checkpoint.read_state(tmp_path / rundir.CHECKPOINTS / "step_0000002")["state"])
    cleanup = []
    run = build_run(cfg, preflight(cfg), tmp_path, "resumed", cleanup)
    try:
        with pytest.raises(dataclasses.FrozenInstanceError):
            run.model = None
        progress = runner.resume(run)
        assert isinstance(progress, Progress) and progress.start_step == 2
        fields = ("sampler_position", "cum_rollouts", "cum_gen_tokens", "cum_trained_rollouts", "wandb_id",
                  "base_model", "history_gap", "config_json")
        assert [getattr(progress.state, f) for f in fields] == [getattr(saved, f) for f in fields]
        assert sorted(progress.state.evals) == sorted(saved.evals) == [2]
        assert progress.sampler.position == saved.sampler_position > 0
        assert set(progress.writers) == {rundir.METRICS, rundir.EVAL_SAMPLES, rundir.TRAIN_SAMPLES}
        assert isinstance(progress.tracker, NullTracker)
        with pytest.raises(dataclasses.FrozenInstanceError):
            progress.state = RunState()
    finally:
        for close in reversed(cleanup):
            close()


def test_rerun_of_finished_run_is_skipped(tmp_path, small_cfg):
    cfg = small_cfg(tmp_path, FINAL_1)
    first = train(cfg)
    before = (tmp_path / rundir.METRICS).stat().st_mtime_ns
    again = train(cfg)
    assert again == json.loads(json.dumps(first, default=str)) or again["status"] == "finished"
    assert (tmp_path / rundir.METRICS).stat().st_mtime_ns == before


def test_overlong_filtering_masks_truncated_responses(tmp_path, small_cfg):
    # a 6-token cap truncates every response (solutions are longer): with filtering,
    # no token is left in the loss, so the gradient is exactly zero. The policy is the shipped default warm
    # start, loaded as a model directory: model.path=tiny would build another warm start for a 6-token cap
    # (the cap is part of its key), 1.5-5 minutes of CI
    from helpers import shipped_default_model

    common = ("rollout.max_response_len=6", "algo.overlong_cache_len=2", "train.steps=1",
              f"model.path={shipped_default_model()}", FINAL_1, NO_BASE_EVAL)
    train(small_cfg(tmp_path / "on", "fixes=paper_2_of", *common))
    train(small_cfg(tmp_path / "off", "fixes=grpo", *common))
    on = [r for r in metrics(tmp_path / "on") if "reward/mean" in r][0]
    off = [r for r in metrics(tmp_path / "off") if "reward/mean" in r][0]
    assert on["response_length/clip_ratio"] == 1.0 == off["response_length/clip_ratio"]
    assert on["actor/masked_token_frac"] == 1.0 and on["actor/grad_norm"] == 0.0
    assert off["actor/masked_token_frac"] == 0.0


def test_config_error_before_compute_and_missing_model_path(tmp_path, small_cfg):
    with pytest.raises(FileNotFoundError, match="model.path"):
        train(small_cfg(tmp_path, "model.path=/nonexistent/qwen"))


@pytest.mark.slow
def test_user_sweep_writes_runs_wandb_and_table_and_rerun_skips(tmp_path, warm_cache):
    """`python run.py -m fixes=grpo,clip,clip_ds,full` (shrunken): 4 jobs, W&B offline, table at the end."""
    from helpers import SMALL

    args = [sys.executable, "run.py", "-m", "fixes=grpo,clip,clip_ds,full", "seed=0", f"hydra.sweep.dir={tmp_path}",
            *[a for a in SMALL if a != "logger=none"], "train.steps=1", FINAL_1, f"model.cache_dir={warm_cache}",
            NO_FIGURES]
    out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    runs = sorted(p.parent for p in tmp_path.glob("*/summary.json"))
    labels = sorted(json.loads((r / rundir.SUMMARY).read_text())["label"] for r in runs)
    assert labels == ["clip", "clip_ds", "full", "grpo"]
    assert all("model.cache_dir" not in r.name for r in runs)  # excluded from the job dir name
    for r in runs:
        assert (r / rundir.METRICS).stat().st_size > 0
        assert json.loads((r / rundir.SUMMARY).read_text())["status"] == "finished"
        assert list((r / "wandb").glob("offline-run-*/run-*.wandb")), f"no offline W&B run in {r}"
    assert "grpo" in out.stdout and (tmp_path / "analysis" / "table.md").exists()
    # the same sweep again, without the sweep-end analysis (Hydra's callbacks are no job's override: the same
    # jobs): its table and figures, drawn again from the same runs, were most of this second launch's cost
    again = subprocess.run([*args, "~hydra.callbacks.analysis"], cwd=ROOT, capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0 and again.stdout.count("already finished; skipping") == 4
    assert (again.stdout + again.stderr).count("already finished") == 4  # one line per skipped job, not two


@pytest.mark.slow
def test_a_failed_job_does_not_take_down_the_sweep(tmp_path, warm_cache):
    from helpers import SMALL

    # rollout.n=1 with dynamic sampling is rejected by validate(): that job fails, the other runs
    small = [a for a in SMALL if not a.startswith("rollout.n=")]
    args = [sys.executable, "run.py", "-m", "fixes=full", "rollout.n=1,4", "seed=0", f"hydra.sweep.dir={tmp_path}",
            *small, "train.steps=1", "train.mini_batch_size=4", "train.micro_batch_size=4", FINAL_1, NO_BASE_EVAL,
            f"model.cache_dir={warm_cache}", NO_FIGURES]
    out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=900)
    # the other job finishes and the table is printed; the sweep then names the failed job and exits 1
    assert out.returncode == 1, out.stderr[-3000:]
    assert "error: 1 job(s) of the sweep failed" in out.stderr
    # a job directory's full overrides are in .hydra/overrides.yaml (its name may be shortened)
    jobs = {p: (p / ".hydra" / "overrides.yaml").read_text() for p in tmp_path.iterdir() if (p / ".hydra").is_dir()}
    (bad_dir,) = [p for p, o in jobs.items() if "rollout.n=1\n" in o]
    (good_dir,) = [p for p, o in jobs.items() if "rollout.n=4\n" in o]
    bad = json.loads((bad_dir / rundir.SUMMARY).read_text())
    good = json.loads((good_dir / rundir.SUMMARY).read_text())
    assert bad["status"] == "failed" and "rollout.n" in bad["error"]
    assert good["status"] == "finished"


def test_token_budget_micro_batches_give_the_same_update(tmp_path, small_cfg):
    """Packing micro-batches by a token budget changes speed, not the gradient (same pg loss, grad norm)."""
    common = ("train.steps=1", "eval.before_training=false", "fixes=full", FINAL_1)
    train(small_cfg(tmp_path / "fixed", *common))
    train(small_cfg(tmp_path / "budget", *common, "train.token_budget=120"))
    a = [r for r in metrics(tmp_path / "fixed") if "actor/pg_loss" in r][0]
    b = [r for r in metrics(tmp_path / "budget") if "actor/pg_loss" in r][0]
    for k in ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/pg_clipfrac_higher", "reward/mean"):
        assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-7), k


@pytest.mark.slow
@pytest.mark.parametrize("mini_batch_size", [16, 8], ids=["one_update", "two_updates"])
def test_old_logprobs_from_the_update_forward_train_like_the_recompute(tmp_path, small_cfg, mini_batch_size):
    """The default (first mini-batch's old log-probs from its update forward) and
    train.recompute_old_logprobs=true give the same training metrics, step after step."""
    common = ("fixes=full", "eval.before_training=false", f"train.mini_batch_size={mini_batch_size}", FINAL_1)
    train(small_cfg(tmp_path / "skip", *common))
    train(small_cfg(tmp_path / "recompute", *common, "train.recompute_old_logprobs=true"))
    a = [r for r in metrics(tmp_path / "skip") if "actor/pg_loss" in r]
    b = [r for r in metrics(tmp_path / "recompute") if "actor/pg_loss" in r]
    assert len(a) == len(b) == 2
    for ra, rb in zip(a, b):
        assert ra["actor/n_updates"] == rb["actor/n_updates"] == 16 // mini_batch_size
        for k in ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/ppo_ratio_mean", "reward/mean"):
            assert ra[k] == pytest.approx(rb[k], rel=1e-5, abs=1e-7), k
    if mini_batch_size == 16:
        assert all(r["actor/ppo_ratio_mean"] == 1.0 for r in a)  # exactly on-policy


def test_resume_survives_a_half_written_jsonl_line(tmp_path, small_cfg, monkeypatch):
    """A kill in the middle of a write leaves a broken last line: resume drops it, never crashes on it."""
    overrides = ("train.steps=3", "checkpoint.every=2", "eval.final_samples=2")
    train(small_cfg(tmp_path / "whole", *overrides))
    cfg = small_cfg(tmp_path / "cut", *overrides)
    kill_during_step(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        train(cfg)
    monkeypatch.undo()
    for name in (rundir.METRICS, rundir.EVAL_SAMPLES):
        with (tmp_path / "cut" / name).open("a") as f:
            f.write('{"step": 3, "eval/acc_av')  # half-written
    assert train(cfg)["status"] == "finished"
    assert metrics(tmp_path / "cut") == metrics(tmp_path / "whole")


@pytest.mark.slow
def test_the_run_records_the_environment_that_decides_its_numbers(tmp_path, small_cfg):
    """Package versions, torch's thread count and the CPU go into config.json and summary.json."""
    import torch
    import transformers

    s = train(small_cfg(tmp_path, "train.steps=1", FINAL_1, NO_BASE_EVAL))
    for record in (s, json.loads((tmp_path / rundir.CONFIG).read_text())):
        env = record["environment"]
        assert env["packages"]["torch"] == torch.__version__
        assert env["packages"]["transformers"] == transformers.__version__
        assert env["torch_threads"] == torch.get_num_threads() and env["python"]
        assert env["cpu"] == rundir.cpu() and env["cpu"].endswith(torch.backends.cpu.get_cpu_capability())
