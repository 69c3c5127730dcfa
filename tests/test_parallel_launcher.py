"""``hydra/launcher=parallel``: jobs side by side on one CPU machine, jobs x threads = cores.

- :func:`plan` picks jobs at once and threads per job from the sweep size and the cores.
- A small multirun through the launcher (slow): both good jobs finish, side by side, each
  with the planned torch thread count (recorded in its config.json), and a failing job
  is recorded as failed without taking the others down; the sweep then exits 1 naming it.
- The warm-started tiny model, asked for by two processes at once, is built once (slow).
- Ctrl-C on a parallel sweep (SIGINT to its process group) stops each running job after its step with a
  checkpoint, starts no other job, and exits 130 after one closing line, leaving no process (slow); a second
  signal that lands in a finalizer of the sweep's process still stops it at once.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import SignalledInFinalizer

from dapo_exp import rundir

pytest.importorskip("hydra_plugins.hydra_joblib_launcher", reason="pip install hydra-joblib-launcher (a dependency)")
from hydra_plugins.dapo_exp_launcher.parallel_launcher import Plan, plan  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# The evaluations no assertion here reads, shrunk: no evaluation of the base policy, the final one on 1 sample per
# problem (helpers.SMALL's 8 x 8 was about half of a 2-step run's compute)
CHEAP_EVAL = ["eval.before_training=false", "eval.final_samples=1"]


@pytest.mark.parametrize("n_jobs, kwargs, expected", [
    (12, {"cores": 2}, Plan(jobs=2, threads=1, cores=2)),  # the toy sweep on this project's machine
    (2, {"cores": 16}, Plan(jobs=2, threads=8, cores=16)),  # fewer jobs than cores: more threads each
    (1, {"cores": 4}, Plan(jobs=1, threads=4, cores=4)),
    (12, {"cores": 8, "threads": 2}, Plan(jobs=4, threads=2, cores=8)),
    (12, {"cores": 8, "jobs": 3}, Plan(jobs=3, threads=2, cores=8)),
    (12, {"cores": 2, "jobs": 4}, Plan(jobs=4, threads=1, cores=2)),  # given values are kept
    (12, {"cores": 2, "threads": 4}, Plan(jobs=1, threads=4, cores=2)),
])
def test_plan_fills_the_cores(n_jobs, kwargs, expected):
    assert plan(n_jobs, **kwargs) == expected


def test_plan_refuses_a_non_positive_value():
    with pytest.raises(ValueError, match="hydra.launcher.jobs"):
        plan(4, jobs=0, cores=2)


def test_parallel_launcher_composes():
    from hydra import compose, initialize_config_dir

    from dapo_exp.hydra_setup import register_resolvers

    register_resolvers()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        la = compose("config", overrides=["hydra/launcher=parallel"], return_hydra_config=True).hydra.launcher
    assert la._target_ == "hydra_plugins.dapo_exp_launcher.parallel_launcher.ParallelLauncher"
    assert la.jobs is None and la.threads_per_job is None and la.cores is None


@pytest.mark.slow
def test_parallel_sweep_runs_jobs_side_by_side_with_their_threads(tmp_path, warm_cache):
    """Three jobs, two at a time with one thread each (cores=2): rollout.n=1 fails in validation
    (dynamic sampling needs groups of 2), the other two train, overlapping in time."""
    from helpers import SMALL

    small = [a for a in SMALL if not a.startswith("rollout.n=")]
    args = [sys.executable, "run.py", "-m", "hydra/launcher=parallel", "hydra.launcher.cores=2",
            "fixes=full", "rollout.n=1,2,4", "seed=0", f"hydra.sweep.dir={tmp_path}", "~hydra.callbacks.analysis", *small,
            "train.mini_batch_size=8", "train.micro_batch_size=4", *CHEAP_EVAL, f"model.cache_dir={warm_cache}"]
    out = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=900)
    # the failed job fails the sweep (exit 1, named), once the other two have finished
    assert out.returncode == 1, out.stderr[-3000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: 1 job(s) of the sweep failed, 2 finished: ") and "rollout.n=1" in last
    jobs = {p: (p / ".hydra" / "overrides.yaml").read_text() for p in tmp_path.iterdir() if (p / ".hydra").is_dir()}
    assert len(jobs) == 3
    spans = []
    for job_dir, overrides in jobs.items():
        summary = json.loads((job_dir / rundir.SUMMARY).read_text())
        if "rollout.n=1\n" in overrides:
            assert summary["status"] == "failed" and "rollout.n" in summary["error"]
            continue
        assert summary["status"] == "finished" and summary["steps_done"] == 2
        env = json.loads((job_dir / rundir.CONFIG).read_text())["environment"]
        assert env["torch_threads"] == 1 and env["omp_num_threads"] == "1"
        end = (job_dir / rundir.SUMMARY).stat().st_mtime
        spans.append((end - summary["wall_time_s"], end))
    (a0, a1), (b0, b1) = spans
    assert min(a1, b1) > max(a0, b0), f"the two jobs did not run side by side: {spans}"


@pytest.mark.slow
def test_the_warm_start_is_built_once_when_two_jobs_ask_at_once(tmp_path):
    """Two processes need the same (not yet cached) warm-started model: one builds it under the file
    lock, the other waits and reuses it."""
    code = (
        "from dapo_exp.hydra_setup import compose_config\n"
        "from dapo_exp.tasks.arith_warmstart import ensure_tiny_checkpoint\n"
        f"c = compose_config(['model.warmstart_steps=3', 'model.cache_dir={tmp_path}'])\n"
        "print('PATH', ensure_tiny_checkpoint(c.model, c.task, c.rollout.max_response_len))\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert sum(o.count("building the warm-started tiny model") for o in outs) == 1, outs
    paths = {line for o in outs for line in o.splitlines() if line.startswith("PATH ")}
    assert len(paths) == 1 and (Path(paths.pop()[5:]) / "config.json").is_file()


@pytest.mark.slow
def test_ctrl_c_on_a_parallel_sweep_stops_each_job_after_its_step_with_a_checkpoint(tmp_path, warm_cache):
    """SIGINT to the sweep's process group (what Ctrl-C sends): one line says what happens, both running
    jobs finish their step, checkpoint it and say ``stopped``, the third job never starts, the sweep exits 130
    after one closing line, and no process of it is left (no worker, no leaked semaphore)."""
    import os
    import signal
    import time

    from helpers import SMALL

    small = [a for a in SMALL if not a.startswith("train.steps=")]
    args = [sys.executable, "run.py", "-m", "hydra/launcher=parallel", "hydra.launcher.jobs=2", "fixes=grpo",
            "seed=0,1,2", f"hydra.sweep.dir={tmp_path}", "~hydra.callbacks.analysis", *small, "train.steps=500",
            "checkpoint.every=100", *CHEAP_EVAL, f"model.cache_dir={warm_cache}"]
    with open(tmp_path.parent / "ctrl_c.out", "w+") as out, open(tmp_path.parent / "ctrl_c.err", "w+") as err:
        proc = subprocess.Popen(args, cwd=REPO, stdout=out, stderr=err, text=True, start_new_session=True)
        deadline = time.monotonic() + 600
        # both running jobs have logged a training step (not merely started: a signal then would stop a job in
        # its set-up, with nothing trained)
        while sum('"reward/mean"' in p.read_text() for p in tmp_path.glob("*/metrics.jsonl")) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, Path(err.name).read_text()[-3000:]
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the sweep's process and its workers
        assert proc.wait(timeout=300) == 128 + signal.SIGINT, Path(err.name).read_text()[-3000:]
        stderr = Path(err.name).read_text()
    lines = stderr.strip().splitlines()
    assert "Traceback" not in stderr and "leaked" not in stderr, stderr[-3000:]
    assert [line for line in lines if "SIGINT" in line] == [
        "[dapo-exp] SIGINT: the sweep stops: each running job finishes its step and writes a checkpoint, "
        "no other job starts; send it again to stop at once",
        "[dapo-exp] sweep stopped by SIGINT: 2 job(s) stopped with a checkpoint, 1 not started; "
        "re-run the same command to resume"], stderr[-3000:]
    jobs = sorted(p for p in tmp_path.iterdir() if p.is_dir())
    assert len(jobs) == 2, jobs  # the job not started left nothing behind
    for job in jobs:
        summary = json.loads((job / rundir.SUMMARY).read_text())
        assert summary["status"] == "stopped" and summary["steps_done"] >= 1, summary
        assert (job / "checkpoints" / f"step_{summary['steps_done']:07d}").is_dir(), list((job / "checkpoints").iterdir())
    assert not (tmp_path / ".stop").exists()
    for _ in range(100):  # the workers are gone with the sweep
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("a process of the sweep outlived it")


def test_a_sweeps_stop_is_seen_only_in_a_sweeps_worker(monkeypatch, tmp_path):
    """A signal this process noted stops later runs only in a parallel sweep's worker: a test process (or any
    process running runs one after another) that once got a SIGTERM must not stop every later run."""
    monkeypatch.delenv(rundir.SWEEP_STOP_ENV, raising=False)
    with rundir.command_state():  # its own state, none of another test's signals
        rundir.note_signal("SIGTERM")
        assert rundir.sweep_stop() is None
        monkeypatch.setenv(rundir.SWEEP_STOP_ENV, str(tmp_path / ".stop"))
        assert rundir.sweep_stop() == "SIGTERM"  # this worker's own signal
    with rundir.command_state():
        assert rundir.sweep_stop() is None  # no signal, no stop file
        (tmp_path / ".stop").write_text("SIGINT")
        assert rundir.sweep_stop() == "SIGINT"  # the sweep's process got it (kill <pid>, not the group)


def test_a_sweeps_second_signal_that_lands_in_a_finalizer_still_stops_it_at_once(monkeypatch, tmp_path, capsys):
    """The sweep's process waits for its pool; a second signal stops it at once (KeyboardInterrupt). Where that
    signal lands inside a finalizer, Python cannot raise it there and would print "Exception ignored" and go on
    waiting: it is not printed, and it is raised again in the main thread as soon as the finalizer is left."""
    from hydra_plugins.dapo_exp_launcher.parallel_launcher import SweepStop

    seen, after = [], []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    with pytest.raises(KeyboardInterrupt, match=r"second signal \(SIGINT\)"):
        with SweepStop(str(tmp_path)) as stop:
            signal.raise_signal(signal.SIGINT)  # the first: the stop file, one line
            assert stop.signame == "SIGINT" and (tmp_path / ".stop").read_text() == "SIGINT"
            SignalledInFinalizer(signal.SIGINT)  # dropped at once: the second signal lands in its __del__
            time.sleep(5)  # (the pool's wait) the interrupt comes back within milliseconds, outside the finalizer
            after.append("not stopped")
    assert seen == [] and after == []
    assert sys.unraisablehook == seen.append  # the hook that was there is back
    assert not (tmp_path / ".stop").exists()  # the stop file goes with the sweep
    assert "SIGINT: the sweep stops" in capsys.readouterr().err
