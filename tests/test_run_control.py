"""Fault injection on the run directory and the loop: one writer per run, SIGTERM as a clean stop,
progress lines in non-interactive logs, bad JSONL lines, early interruption, a full disk."""

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import SignalledInFinalizer, compose_small

from dapo_exp import rundir
from dapo_exp.rundir import RunLock, RunLockedError
from dapo_exp.train import RunStopped, train

ROOT = Path(__file__).resolve().parents[1]
VOLATILE = ("timing_s/", "perf/")
# Each `python run.py` costs 6-10 CPU-s of start-up (torch, transformers, Hydra's composition, the model) before
# its first step, a train() call here about 1.5: a subprocess is launched where the command line is what is
# tested (its exit code, its one line, its log, a signal to it); a state to test a command on is made in this
# process, or shared by the tests of this module (module fixtures, copied where a test changes it).


def _copy(run_dir, to):
    """A copy of a module fixture's run directory, for a test that changes it."""
    import shutil

    shutil.copytree(run_dir, to, symlinks=True)
    return Path(to)


def _metrics(run_dir):
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rundir.read_jsonl(
        Path(run_dir) / rundir.METRICS)]


def _at_step(monkeypatch, step, action):
    """Run ``action()`` as train() starts rollout step ``step``."""
    import dapo_exp.train as T

    real, calls = T.collect_groups, {"n": 0}

    def hooked(*a, **k):
        calls["n"] += 1
        if calls["n"] == step:
            action()
        return real(*a, **k)

    monkeypatch.setattr(T, "collect_groups", hooked)


def _long_run(tmp_path, warm_cache, rows: int):
    """``python run.py`` of 500 small steps in a subprocess, returned once ``rows`` metric rows are logged."""
    import time

    from helpers import SMALL

    run_dir = tmp_path / "run"
    cmd = [sys.executable, "run.py", *SMALL, "train.steps=500", "checkpoint.every=100",
           f"model.cache_dir={warm_cache}", f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while len(rundir.read_jsonl(run_dir / rundir.METRICS)) < rows and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[0][-2000:]
        time.sleep(0.05)
    return proc, run_dir, cmd


# --------------------------------------------------------------------------- #
# one writer per run                                                            #
# --------------------------------------------------------------------------- #
def _hold_lock(run_dir: Path) -> subprocess.Popen:
    """Another process holding ``run_dir``'s lock as a writer does (its pid in the file); returns once held."""
    # the lock is held while its RunLock lives (its open file holds the flock): kept in a name until the process ends
    code = ("import sys, time; from dapo_exp.rundir import RunLock; lock = RunLock(sys.argv[1]).acquire(); "
            "print('held', flush=True); time.sleep(120)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(run_dir)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_writer_is_refused_naming_the_holder(tmp_path, small_cfg):
    holder = _hold_lock(tmp_path)
    try:
        with pytest.raises(RunLockedError, match=rf"in use by pid {holder.pid} on "):
            train(small_cfg(tmp_path))
    finally:
        holder.kill()
        holder.wait()
    assert not (tmp_path / rundir.SUMMARY).exists() and not (tmp_path / rundir.CONFIG).exists()


def test_a_run_directory_is_claimed_once_a_second_claim_in_the_process_is_a_bug(tmp_path):
    """run.py claims the run directory before anything is written and hands the claim to the trainer; a second
    acquisition by the holding process is refused as a bug (so every run.py test in the suite shows the trainer
    does not claim again), another process's as a second writer."""
    with RunLock(tmp_path):
        with pytest.raises(RuntimeError, match="claimed twice by this process"):
            RunLock(tmp_path).acquire()
        held = json.loads((tmp_path / rundir.LOCK).read_text())
        assert held["pid"] == os.getpid()  # the refused acquisition left the holder's lock alone
        code = "import sys; from dapo_exp.rundir import RunLock; RunLock(sys.argv[1]).acquire()"
        other = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
        assert other.returncode != 0 and f"in use by pid {os.getpid()}" in other.stderr
    assert (tmp_path / rundir.LOCK).read_text() == ""  # released


def test_the_trainer_takes_over_its_callers_claim_and_checks_the_directory_once(tmp_path, small_cfg, monkeypatch):
    """run.py's order: claimed(cfg) (lock, recorded config and base model checked), then train(cfg, claim=out):
    the configuration check runs once, and the run trains under the caller's lock."""
    from dapo_exp import runner

    calls = []
    check = runner.check_config_change
    monkeypatch.setattr(runner, "check_config_change", lambda cfg, out: calls.append(out) or check(cfg, out))
    cfg = small_cfg(tmp_path / "run", "train.steps=1")
    with runner.claimed(cfg) as out:
        summary = train(cfg, claim=out)
    assert summary["status"] == rundir.STATUS_FINISHED and summary["steps_done"] == 1
    assert calls == [out]


def _snapshot(run_dir: Path) -> dict[str, tuple[bytes, int]]:
    """Every file's bytes and mtime, but the lock's (taken and released by the refused command)."""
    return {str(p.relative_to(run_dir)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(run_dir.rglob("*")) if p.is_file() and p.name != rundir.LOCK}


# --------------------------------------------------------------------------- #
# one configuration per run directory                                           #
# --------------------------------------------------------------------------- #
@pytest.fixture(scope="module")
def resumable_run(tmp_path_factory, warm_cache):
    """A 2-step ``python run.py`` whose summary is then gone (as if killed after its last checkpoint): what a re-run
    resumes, so the state a wrong command could damage most, with the command's own .hydra record and run.log.
    Its output goes to a file, as a non-interactive log's (test_run_py_to_a_file_prints_progress_lines reads it).
    Returns (run directory, the command that made it, its output)."""
    from helpers import SMALL

    tmp = tmp_path_factory.mktemp("refusals")
    run_dir, log = tmp / "run", tmp / "out.log"
    base = [sys.executable, "run.py", *SMALL, "train.steps=2", "checkpoint.every=1", f"model.cache_dir={warm_cache}",
            f"hydra.run.dir={run_dir}"]
    with open(log, "w") as f:
        rc = subprocess.run(base, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=600).returncode
    text = log.read_text()
    assert rc == 0, text[-2000:]
    (run_dir / rundir.SUMMARY).unlink()
    return run_dir, base, text


@pytest.fixture(scope="module")
def one_step_run(tmp_path_factory, warm_cache):
    """A 1-step run trained in this process (``small_cfg(run, "train.steps=1")``), then its summary removed (as if
    killed after its checkpoint: the same command resumes it). Tests copy it (_copy) before changing it.
    Returns (run directory, the finished run's summary)."""
    run_dir = tmp_path_factory.mktemp("one_step") / "run"
    summary = train(compose_small(run_dir, "train.steps=1", warm_cache=warm_cache))
    (run_dir / rundir.SUMMARY).unlink()
    return run_dir, summary


@pytest.mark.slow
def test_a_rerun_with_another_config_is_refused_before_anything_is_written(resumable_run):
    run_dir, base, _ = resumable_run  # its summary gone: a re-run of its command would resume it
    before = _snapshot(run_dir)
    out = subprocess.run([*base, "optim.lr=1e-4", "algo.eps_high=0.3"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert lines[0].startswith(f"error: {run_dir} holds a run of another configuration "
                               "(algo.eps_high: 0.28 -> 0.3, optim.lr: 5e-05 -> 0.0001)"), lines
    assert "run.on_config_change=restart" in lines[0] and "run.on_config_change=branch" in lines[0]
    assert "Traceback" not in out.stderr + out.stdout
    assert _snapshot(run_dir) == before  # .hydra/config.yaml and overrides.yaml included


@pytest.mark.slow
def test_a_run_failure_is_one_line_naming_the_fix_with_its_traceback_in_run_log(tmp_path, one_step_run, warm_cache):
    """Issue 34: no usable checkpoint (and divergence, a collapsed policy, a full disk) printed 50-80 lines of
    traceback. Now one line on stderr, exit 3 (2: a refusal; 1: a bug), the traceback in the run's log."""
    from helpers import SMALL

    run_dir = _copy(one_step_run[0], tmp_path / "run")  # as if killed after its checkpoint: a re-run resumes
    (run_dir / "checkpoints" / "step_0000001" / "manifest.json").unlink()  # its only checkpoint is damaged
    out = subprocess.run([sys.executable, "run.py", *SMALL, "train.steps=2", f"model.cache_dir={warm_cache}",
                          f"hydra.run.dir={run_dir}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 3 and len(lines) == 1, out.stderr[-3000:]
    assert lines[0].startswith(f"error: no usable checkpoint in {run_dir / 'checkpoints'}: step_0000001: ")
    assert "To start this run over, move or delete" in lines[0] and lines[0].endswith(f"(traceback: {run_dir / 'run.log'})")
    assert "Traceback" not in out.stdout + out.stderr
    assert "Traceback (most recent call last)" in (run_dir / "run.log").read_text()
    assert rundir.read_summary(run_dir)["status"] == "failed"


@pytest.mark.slow
def test_restart_and_branch_are_explicit_and_a_longer_run_is_a_resume(tmp_path, one_step_run, small_cfg, capsys):
    from dapo_exp.runner import ConfigChangedError

    run_dir = _copy(one_step_run[0], tmp_path / "run")  # a 1-step run, resumable
    before = _snapshot(run_dir)
    with pytest.raises(ConfigChangedError, match=r"\(optim.lr: 5e-05 -> 0.0001\)"):
        train(small_cfg(run_dir, "train.steps=1", "optim.lr=1e-4"))
    assert _snapshot(run_dir) == before

    # branch: the old run untouched, the new config in <run>@<hash>, its own directory and config
    s = train(small_cfg(run_dir, "train.steps=1", "optim.lr=1e-4", "run.on_config_change=branch"))
    (branch,) = [p for p in tmp_path.iterdir() if p.name.startswith("run@")]
    assert s["status"] == "finished" and s["config"]["out_dir"] == str(branch)
    assert rundir.read_json(branch / rundir.CONFIG)["config"]["optim"]["lr"] == 1e-4
    assert _snapshot(run_dir) == before

    # restart: the old run deleted, this config starts over in the same directory
    s = train(small_cfg(run_dir, "train.steps=1", "seed=5", "run.on_config_change=restart"))
    assert s["status"] == "finished" and s["seed"] == 5
    assert rundir.read_json(run_dir / rundir.CONFIG)["config"]["seed"] == 5

    # train.steps may grow: the same config, run longer, resumes (an interrupted run); a finished run is
    # skipped, saying where a longer one goes
    assert train(small_cfg(run_dir, "train.steps=2", "seed=5"))["steps_done"] == 1
    assert "train.steps=2 asks for more: run the longer run in another directory" in capsys.readouterr().out
    (run_dir / rundir.SUMMARY).unlink()
    s = train(small_cfg(run_dir, "train.steps=2", "seed=5"))
    assert s["status"] == "finished" and s["steps_done"] == 2
    (run_dir / rundir.SUMMARY).unlink()  # not below what was trained: a checkpoint at step 2 is no 1-step run
    before = _snapshot(run_dir)
    with pytest.raises(ConfigChangedError, match="checkpoint at step 2, past train.steps=1"):
        train(small_cfg(run_dir, "train.steps=1", "seed=5"))
    assert _snapshot(run_dir) == before  # refused before config.json or the summary was written
    assert [r["step"] for r in rundir.read_jsonl(run_dir / rundir.METRICS) if "reward/mean" in r] == [1, 2]

    # the endpoint may change too (a sweep begun under another default): it only changes what the
    # summary reports, so an interrupted run resumes and records the endpoint it finished with
    (run_dir / rundir.SUMMARY).unlink(missing_ok=True)
    s = train(small_cfg(run_dir, "train.steps=3", "seed=5", "eval.endpoint=final"))
    assert s["status"] == "finished" and s["steps_done"] == 3 and s["endpoint"]["name"] == "final"


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["deleted", "not JSON"])
def test_with_config_json_lost_a_rerun_is_compared_with_the_checkpoints_own_config(tmp_path, one_step_run, small_cfg,
                                                                                   capsys, damage):
    """Issue 34: config.json deleted or damaged used to skip the check, and a re-run with another optim.lr
    resumed the old checkpoint at the old rate while recording the new one."""
    from dapo_exp.runner import ConfigChangedError

    run_dir = _copy(one_step_run[0], tmp_path / "run")  # resumable
    if damage == "deleted":
        (run_dir / rundir.CONFIG).unlink()
    else:
        (run_dir / rundir.CONFIG).write_text('{"config": ')
    before = _snapshot(run_dir)
    with pytest.raises(ConfigChangedError, match=r"\(optim.lr: 5e-05 -> 0.0001\)"):
        train(small_cfg(run_dir, "train.steps=2", "optim.lr=1e-4"))
    assert _snapshot(run_dir) == before
    assert "comparing with the config recorded in step_0000001" in capsys.readouterr().out

    s = train(small_cfg(run_dir, "train.steps=2"))  # the same config resumes, and config.json is written again
    assert s["status"] == "finished" and s["steps_done"] == 2
    assert rundir.read_json(run_dir / rundir.CONFIG)["config"]["optim"]["lr"] == 5e-5


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["basic", "parallel"])
def test_a_sweep_job_in_a_directory_of_another_config_is_skipped_untouched_and_the_sweep_exits_1(
        tmp_path, one_step_run, warm_cache, launcher):
    """Two jobs, each in a directory holding a run of another config. In-process jobs (basic) and jobs in the
    parallel launcher's worker processes (two at once on two cores: the refusal comes back as the job's return,
    rundir.RefusedJob, the worker's own note staying in the worker) end the same way: named, once each."""
    from helpers import SMALL

    jobs = [_copy(one_step_run[0], tmp_path / "sweep" / f"job{seed}") for seed in (0, 1)]  # resumable
    before = [_snapshot(job) for job in jobs]
    out = subprocess.run([sys.executable, "run.py", "-m", *SMALL, "train.steps=1", "optim.lr=1e-4", "seed=0,1",
                          f"model.cache_dir={warm_cache}", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                          "hydra.sweep.subdir=job${seed}", "hydra.callbacks={}", f"hydra/launcher={launcher}",
                          *(["hydra.launcher.jobs=2"] if launcher == "parallel" else [])], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stderr[-2000:]
    assert f"[dapo-exp] job {jobs[0]} skipped: {jobs[0]} holds a run of another configuration (optim.lr: 5e-05 -> " \
           "0.0001)" in out.stderr
    assert f"[dapo-exp] job {jobs[1]} skipped: {jobs[1]} holds a run of another configuration (" in out.stderr
    assert f"error: 2 job(s) of the sweep were refused and did not run, none finished: {jobs[0]}, {jobs[1]}" \
        in out.stderr
    assert [_snapshot(job) for job in jobs] == before


# every way a command is refused (issue 34, item 3): (what is wrong, the overrides added, the exit code)
REFUSALS = [
    ("an unknown key", ["+algo.no_such_key=1"], 2),
    ("an invalid value", ["train.mini_batch_size=7"], 2),
    ("a conflicting pair of fixes", ["gspo=enabled", "cispo=enabled"], 2),
    ("fixes= given twice", ["fixes=grpo", "fixes=full"], 2),
    ("an unknown choice of run.on_config_change", ["run.on_config_change=merge"], 2),
    ("another result-changing config", ["optim.lr=1e-4"], 2),
    ("fewer steps than its checkpoint", ["train.steps=1"], 2),
    ("another process running it", ["optim.lr=1e-4"], 1),  # the lock before the config: exit 1, not 2
]


@pytest.mark.slow
@pytest.mark.parametrize("why,extra,code", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_every_refusal_leaves_the_run_directory_byte_for_byte_as_it_was(resumable_run, why, extra, code):
    """Each refusal is one ``error:`` line with its exit code, and every file of the resumable run it was
    aimed at keeps its bytes and its mtime (.hydra's record, config.json, metrics, checkpoints, the log).
    With another process running it, Hydra writes nothing into the run directory before run.py has its lock:
    the live run's .hydra record and run.log stay as they were, and the line names the holder's pid."""
    run_dir, base, _ = resumable_run
    before = _snapshot(run_dir)
    holder = _hold_lock(run_dir) if why == "another process running it" else None
    try:
        out = subprocess.run([*base, *extra], cwd=ROOT, capture_output=True, text=True, timeout=300)
    finally:
        if holder:
            holder.kill()
            holder.wait()
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == code and len(lines) == 1 and lines[0].startswith("error: "), out.stderr[-3000:]
    if holder:
        assert lines[0].startswith(f"error: {run_dir} is in use by pid {holder.pid}"), lines
    assert _snapshot(run_dir) == before, why
    assert len(before) > 10 and any(name.startswith("checkpoints/") for name in before)


@pytest.mark.parametrize("why,extra,code", REFUSALS[:5], ids=[r[0] for r in REFUSALS[:5]])
def test_a_refused_new_run_leaves_no_directory(tmp_path, why, extra, code):
    """The refusals found before any run directory exists create none."""
    run_dir = tmp_path / "new"
    out = subprocess.run([sys.executable, "run.py", "logger=none", *extra, f"hydra.run.dir={run_dir}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == code and out.stderr.startswith("error: "), out.stderr[-3000:]
    assert not run_dir.exists() and list(tmp_path.iterdir()) == [], why


def test_which_config_keys_change_results():
    old = {"seed": 0, "out_dir": "a", "sweep": "x", "preset": "full", "optim": {"lr": 1e-5},
           "logger": {"backend": "wandb"}, "checkpoint": {"every": 10, "keep": 2}, "train": {"steps": 4},
           "model": {"path": "tiny", "cache_dir": "~/c"}, "run": {"on_config_change": "refuse"}}
    new = {**old, "out_dir": "b", "sweep": "y", "preset": "custom", "logger": {"backend": "none"},
           "checkpoint": {"every": 1, "keep": 5}, "model": {"path": "tiny", "cache_dir": "/elsewhere"},
           "run": {"on_config_change": "restart"}, "train": {"steps": 6}}
    assert rundir.config_differences(old, new, ignore=rundir.EXTENDABLE_KEYS) == []
    assert rundir.config_differences(old, new) == [("train.steps", 4, 6)]  # the analysis tells lengths apart
    changed = {**new, "seed": 1, "optim": {"lr": 1e-4}, "model": {"path": "other"}}
    assert [k for k, _, _ in rundir.config_differences(old, changed, ignore=rundir.EXTENDABLE_KEYS)] == \
        ["model.path", "optim.lr", "seed"]
    # a key one side lacks (recorded by another version of the schema) is not a difference
    assert rundir.config_differences({"algo": {"eps_high": 0.2}}, {"algo": {"eps_high": 0.2, "gmpo": False}}) == []


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path, capsys):
    (tmp_path / rundir.LOCK).write_text(json.dumps({"pid": 999999, "host": "elsewhere", "started": "then"}))
    with RunLock(tmp_path):
        assert json.loads((tmp_path / rundir.LOCK).read_text())["pid"] == os.getpid()
    assert "its last writer (pid 999999 on elsewhere) is gone" in capsys.readouterr().out


@pytest.fixture(scope="module")
def two_identical_commands(tmp_path_factory, warm_cache):
    """The resubmitted-job case with two real processes: ``python run.py`` of 500 small steps; once its first step
    is logged, the same command again (refused: the first holds the run's lock); then SIGTERM to the first. The
    first is paused (SIGSTOP) while the second runs: a live process holding its lock all the same, it trains no
    steps nobody reads meanwhile (it trained through the second's whole start-up, 5-30 s, before). Returns the
    first's pid, exit code and output, the second's CompletedProcess and the run directory."""
    first, run_dir, cmd = _long_run(tmp_path_factory.mktemp("two"), warm_cache, rows=2)
    try:
        first.send_signal(signal.SIGSTOP)
        second = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    finally:
        first.send_signal(signal.SIGCONT)
        first.send_signal(signal.SIGTERM)
        out_first = first.communicate(timeout=300)[0]
    return first.pid, first.returncode, out_first, second, run_dir


@pytest.mark.slow
def test_two_identical_commands_one_writes_the_other_is_refused(two_identical_commands):
    """The second exits naming the holder's pid and writes nothing; the first's files have each row once (it
    is then stopped with SIGTERM)."""
    pid, code, out_first, second, run_dir = two_identical_commands
    assert second.returncode != 0 and f"in use by pid {pid}" in second.stdout + second.stderr
    assert code == 128 + signal.SIGTERM, out_first[-2000:]
    rows = rundir.read_jsonl(run_dir / rundir.METRICS)
    keys = [(r["step"], "reward/mean" in r) for r in rows]
    assert len(keys) == len(set(keys))
    samples = rundir.read_jsonl(run_dir / rundir.EVAL_SAMPLES)
    ids = [(r["step"], r["problem_id"], r["sample"]) for r in samples]
    assert ids and len(ids) == len(set(ids))


# --------------------------------------------------------------------------- #
# SIGTERM / SIGINT                                                              #
# --------------------------------------------------------------------------- #
STOPPED_RUN = ("train.steps=3", "checkpoint.every=10")  # no periodic checkpoint: only the stop writes one


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, warm_cache):
    """The metrics of STOPPED_RUN uninterrupted: what each run stopped at step 2 and resumed must reproduce."""
    run_dir = tmp_path_factory.mktemp("whole") / "whole"
    train(compose_small(run_dir, *STOPPED_RUN, warm_cache=warm_cache))
    return _metrics(run_dir)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_cleanly_and_the_rerun_resumes_to_the_same_metrics(sig, tmp_path, small_cfg, monkeypatch,
                                                                          uninterrupted):
    overrides = STOPPED_RUN
    _at_step(monkeypatch, 2, lambda: os.kill(os.getpid(), sig))  # arrives during step 2
    with pytest.raises(RunStopped, match=signal.Signals(sig).name):
        train(small_cfg(tmp_path / "cut", *overrides))
    summary = rundir.read_summary(tmp_path / "cut")
    assert summary["status"] == rundir.STATUS_STOPPED and summary["steps_done"] == 2
    assert "re-run the same command to resume" in summary["error"]
    assert [p.name for p in (tmp_path / "cut" / rundir.CHECKPOINTS).glob("step_*")] == ["step_0000002"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored
    monkeypatch.undo()
    s = train(small_cfg(tmp_path / "cut", *overrides))
    assert s["status"] == "finished" and s["steps_done"] == 3
    assert _metrics(tmp_path / "cut") == uninterrupted


def test_a_signal_between_a_steps_checkpoint_check_and_the_next_step_still_checkpoints_that_step(
        tmp_path, small_cfg, monkeypatch, uninterrupted):
    """The race a loaded CI machine hit (2026-11-30): SIGTERM after step 2's checkpoint check, before step 3
    starts (here: as the progress bar is asked for step 3). The run stops after step 2 with step 2's checkpoint,
    and the rerun resumes to the uninterrupted metrics."""
    import tqdm.auto

    class LateSignal(tqdm.auto.tqdm):
        def __iter__(self):
            for step in super().__iter__():
                yield step
                if step == 2:  # the loop body of step 2 has ended, its checkpoint check included
                    os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(tqdm.auto, "tqdm", LateSignal)
    with pytest.raises(RunStopped, match="SIGTERM"):
        train(small_cfg(tmp_path / "cut", *STOPPED_RUN))
    summary = rundir.read_summary(tmp_path / "cut")
    assert summary["status"] == rundir.STATUS_STOPPED and summary["steps_done"] == 2
    assert [p.name for p in (tmp_path / "cut" / rundir.CHECKPOINTS).glob("step_*")] == ["step_0000002"]
    monkeypatch.undo()
    s = train(small_cfg(tmp_path / "cut", *STOPPED_RUN))
    assert s["status"] == "finished" and s["steps_done"] == 3
    assert _metrics(tmp_path / "cut") == uninterrupted


class _SchedulerHandler:
    """Stands in for submitit's SIGUSR2 handler (checkpoint the callable, requeue, exit): records what the
    run directory held when it was called; ``refuse`` makes it raise as submitit does when it will not requeue."""

    def __init__(self, run_dir, refuse=False):
        self.run_dir, self.refuse, self.calls = run_dir, refuse, []

    def __call__(self, signum, frame):
        ckpts = sorted(p.name for p in (self.run_dir / rundir.CHECKPOINTS).glob("step_*"))
        self.calls.append((signum, rundir.read_summary(self.run_dir), ckpts))
        if self.refuse:
            raise RuntimeError("Job not requeued because: timed-out too many times.")


@pytest.mark.slow
def test_the_time_limit_warning_checkpoints_the_step_then_lets_submitit_requeue(tmp_path, small_cfg, monkeypatch,
                                                                                uninterrupted):
    """SLURM's pre-timeout signal under submitit (SIGUSR2): the run ends its step, writes its checkpoint
    and a summary that says it is requeued, and only then calls submitit's handler (which requeues and
    exits); the requeued run resumes from that step, so no step is trained twice, to identical metrics."""
    overrides = STOPPED_RUN
    handler = _SchedulerHandler(tmp_path / "cut")
    old = signal.signal(signal.SIGUSR2, handler)
    try:
        _at_step(monkeypatch, 2, lambda: os.kill(os.getpid(), signal.SIGUSR2))  # arrives during step 2
        with pytest.raises(RunStopped, match="SIGUSR2"):
            train(small_cfg(tmp_path / "cut", *overrides))
        assert signal.getsignal(signal.SIGUSR2) is handler  # submitit's handler is back in place
    finally:
        signal.signal(signal.SIGUSR2, old)
    ((signum, summary, ckpts),) = handler.calls  # called once, after the stop was recorded
    assert signum == signal.SIGUSR2 and ckpts == ["step_0000002"]
    assert summary["status"] == rundir.STATUS_STOPPED and summary["steps_done"] == 2 and summary["requeued"] is True
    assert "time-limit warning" in summary["error"] and "requeues the job" in summary["error"]
    monkeypatch.undo()
    s = train(small_cfg(tmp_path / "cut", *overrides))  # the requeued job: the same command
    assert s["status"] == "finished" and s["steps_done"] == 3
    assert _metrics(tmp_path / "cut") == uninterrupted


def test_a_refused_requeue_is_written_in_the_summary(tmp_path, small_cfg, monkeypatch):
    handler = _SchedulerHandler(tmp_path / "cut", refuse=True)
    old = signal.signal(signal.SIGUSR2, handler)
    try:
        _at_step(monkeypatch, 1, lambda: os.kill(os.getpid(), signal.SIGUSR2))
        with pytest.raises(RuntimeError, match="not requeued"):
            train(small_cfg(tmp_path / "cut", "train.steps=3"))
    finally:
        signal.signal(signal.SIGUSR2, old)
    summary = rundir.read_summary(tmp_path / "cut")
    assert summary["status"] == rundir.STATUS_STOPPED and summary["steps_done"] == 1
    assert summary["requeued"] is False and "was not requeued: Job not requeued because" in summary["error"]


def test_sigusr2_keeps_its_default_outside_a_scheduler():
    """Without a handler for SIGUSR2 (no submitit), a run leaves the signal alone."""
    from dapo_exp.runner import StopRequest

    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL
    with StopRequest() as stop:
        assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL
        assert signal.getsignal(signal.SIGTERM) == stop._handle
    assert not stop.requeue


def test_a_set_up_stop_that_lands_in_a_finalizer_is_kept_and_not_printed(monkeypatch):
    """A signal during the set-up raises RunStopped where the set-up is; inside a finalizer (a ``__del__`` the
    garbage collector runs) Python cannot raise it and would print it as "Exception ignored": it is not printed,
    and the stop stays requested (the warm start and the loop read it). Another unraisable exception still
    reaches the hook that was there."""
    from dapo_exp.runner import StopRequest

    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)

    class FailsInFinalizer:
        def __del__(self):
            raise ValueError("not a stop")

    with StopRequest() as stop:
        SignalledInFinalizer(signal.SIGINT)  # dropped at once: its __del__ runs here
        assert stop.signame == "SIGINT"
        FailsInFinalizer()
    assert [type(u.exc_value) for u in seen] == [ValueError]  # the RunStopped was not handed on
    assert sys.unraisablehook == seen.append  # the hook that was there is back


def test_a_second_signal_that_lands_in_a_finalizer_still_stops_at_once(monkeypatch):
    """The second signal stops the run at once (KeyboardInterrupt). Where it lands inside a finalizer, Python
    cannot raise it there and would print it as "Exception ignored" and go on: it is not printed, and it is
    raised again in the main thread as soon as the finalizer is left."""
    from dapo_exp.runner import StopRequest

    seen, after = [], []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)

    with pytest.raises(KeyboardInterrupt, match=r"second signal \(SIGTERM\)"):
        with StopRequest() as stop:
            stop.phase = "loop"
            os.kill(os.getpid(), signal.SIGTERM)  # the first: stop after this step
            for _ in range(1000):
                pass
            assert stop.signame == "SIGTERM"
            SignalledInFinalizer(signal.SIGTERM)  # dropped at once: the second signal lands in its __del__
            time.sleep(5)  # the interrupt comes back within milliseconds, outside the finalizer
            after.append("not stopped")
    assert seen == [] and after == []
    assert sys.unraisablehook == seen.append


@pytest.mark.slow
def test_sigterm_to_the_process_exits_143_with_a_stopped_summary(two_identical_commands):
    """SIGTERM to `python run.py` mid-run (the first of the two commands above, its rows checked there)."""
    _, code, out, _, run_dir = two_identical_commands
    assert code == 128 + signal.SIGTERM, out[-2000:]
    summary = rundir.read_summary(run_dir)
    assert summary["status"] == "stopped" and 1 <= summary["steps_done"] < 500
    assert (run_dir / rundir.CHECKPOINTS / f"step_{summary['steps_done']:07d}").is_dir()
    assert "SIGTERM: stopping after this step" in out


# --------------------------------------------------------------------------- #
# what a log file shows                                                         #
# --------------------------------------------------------------------------- #
@pytest.mark.slow
def test_a_resumed_run_keeps_the_thread_count_it_started_with(tmp_path, resumable_run):
    """Float reductions depend on torch's thread count: a run resumed where the launcher (or OMP_NUM_THREADS) offers
    another count still computes with its own, recorded in config.json, so that it resumes to the numbers of an
    uninterrupted run (a parallel sweep re-run with one job left gives it every core)."""
    run_dir, base, _ = resumable_run
    started = rundir.recorded_threads(run_dir)
    assert started == rundir.read_json(run_dir / rundir.CONFIG)["environment"]["torch_threads"] >= 1
    assert rundir.recorded_threads(tmp_path) is None  # nothing to resume: no count to keep
    run_dir = _copy(run_dir, tmp_path / "run")
    cmd = [*(a for a in base if not a.startswith("hydra.run.dir=")), f"hydra.run.dir={run_dir}", "train.steps=3"]
    env = {k: v for k, v in os.environ.items() if k != "DAPO_THREADS"} | {"OMP_NUM_THREADS": str(started + 1)}
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    log = (run_dir / "run.log").read_text()
    assert f"torch threads: {started} (the count this run started with, kept on resume" in log, log[-2000:]
    assert f"(OMP_NUM_THREADS={started + 1} offered)" in log
    assert rundir.read_json(run_dir / rundir.CONFIG)["environment"]["torch_threads"] == started
    assert rundir.read_summary(run_dir)["steps_done"] == 3


@pytest.mark.slow
def test_run_py_to_a_file_prints_progress_lines(resumable_run):
    """`python run.py` with its output to a file (the 2-step run of resumable_run)."""
    text = resumable_run[2]
    # the first and the last step always print (others at most every logger.progress_every_s)
    for step in (1, 2):
        assert f"step {step}/2 | reward " in text and " s/step, eta " in text
    assert "finished 2 steps" in text


# --------------------------------------------------------------------------- #
# damaged files, early interruption, a full disk                                #
# --------------------------------------------------------------------------- #
@pytest.mark.slow
def test_resume_skips_json_lines_that_are_not_objects(tmp_path, one_step_run, small_cfg):
    run_dir = _copy(one_step_run[0], tmp_path / "run")  # as if killed after its checkpoint
    with open(run_dir / rundir.METRICS, "a") as f:
        f.write('42\n[1, 2]\n"text"\nnull\n{"step": 1, "torn": ')
    s = train(small_cfg(run_dir, "train.steps=2"))
    assert s["status"] == "finished" and s["steps_done"] == 2
    rows = rundir.read_jsonl(run_dir / rundir.METRICS)
    assert all(isinstance(r, dict) for r in rows) and "torn" not in json.dumps(rows)


@pytest.mark.slow
def test_an_early_interruption_says_what_the_rerun_discards(tmp_path, small_cfg, monkeypatch, capsys):
    overrides = ("train.steps=3", "checkpoint.every=10")

    def hard_kill():
        raise KeyboardInterrupt("killed")

    _at_step(monkeypatch, 2, hard_kill)
    with pytest.raises(KeyboardInterrupt):
        train(small_cfg(tmp_path, *overrides))
    assert rundir.read_summary(tmp_path)["status"] == "failed"
    monkeypatch.undo()
    capsys.readouterr()
    assert train(small_cfg(tmp_path, *overrides))["status"] == "finished"
    out = capsys.readouterr().out
    assert "no checkpoint, starting over (discarding the 2 metric rows of an earlier attempt, up to step 1)" in out


@pytest.mark.slow
def test_a_full_disk_leaves_a_consistent_failed_run(tmp_path, small_cfg, monkeypatch):
    import dapo_exp.checkpoint as C

    def no_space(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(C, "save_model", no_space)
    with pytest.raises(OSError, match="No space left"):
        train(small_cfg(tmp_path))
    summary = rundir.read_summary(tmp_path)
    assert summary["status"] == "failed" and "No space left" in summary["error"]
    leftovers = [p for p in tmp_path.rglob("*") if ".tmp" in p.name]
    assert not leftovers, leftovers
    assert not (tmp_path / rundir.LOCK).read_text()  # the lock was released


def test_a_multirun_without_a_sweep_name_is_named_after_what_it_sweeps():
    from dapo_exp.hydra_setup import MAX_DIRNAME, default_sweep_name

    assert default_sweep_name(["-m", "fixes=grpo,clip,clip_ds,full"]) == "fixes=grpo,clip,clip_ds,full"
    assert default_sweep_name(["-m", "seed=0,1", "fixes=grpo,full", "train.steps=5"]) == "fixes=grpo,full+seed=0,1"
    assert default_sweep_name(["-m", "fixes=grpo,clip", "sweep=mine"]) is None  # named by the user
    assert default_sweep_name(["fixes=grpo"]) is None  # a single run
    many = default_sweep_name(["-m", "seed=" + ",".join(map(str, range(100)))])
    assert len(many) <= MAX_DIRNAME and many != default_sweep_name(["-m", "seed=" + ",".join(map(str, range(99)))])


DAMAGED_LOCKS = {
    "not UTF-8": b"\xff\xfe\x00garbage\x80\x81",
    "not JSON": b"pid=1234 host=x",
    "JSON, not an object": b"[1, 2, 3]",
    "torn JSON": b'{"pid": 12',
}


@pytest.mark.parametrize("damage", list(DAMAGED_LOCKS))
def test_a_damaged_lock_nobody_holds_is_taken_over_with_one_warning(tmp_path, capsys, damage):
    (tmp_path / rundir.LOCK).write_bytes(DAMAGED_LOCKS[damage])
    with RunLock(tmp_path):
        assert json.loads((tmp_path / rundir.LOCK).read_text())["pid"] == os.getpid()
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("[dapo-exp] warning: taking over"), out
    assert str(tmp_path / rundir.LOCK) in out[0] and "unreadable" in out[0] and "no process holds it" in out[0]
    with RunLock(tmp_path):  # released cleanly: the next run takes it silently
        pass
    assert capsys.readouterr().out == ""


def test_a_damaged_lock_held_by_a_live_process_is_refused_naming_the_path(tmp_path):
    import fcntl

    lock = tmp_path / rundir.LOCK
    lock.write_bytes(DAMAGED_LOCKS["not UTF-8"])
    code = ("import fcntl, sys, time; f = open(sys.argv[1], 'rb'); fcntl.flock(f, fcntl.LOCK_EX); "
            "print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunLockedError) as err:
            RunLock(tmp_path).acquire()
        msg = str(err.value)
        assert "\n" not in msg and f"{tmp_path} is in use by another process" in msg
        assert f"its lock file {lock} is unreadable" in msg and "wait for it to end or stop it" in msg
        assert lock.read_bytes() == DAMAGED_LOCKS["not UTF-8"]  # a held lock is not touched
    finally:
        holder.kill()
        holder.wait()
    with open(lock, "rb") as f:  # the holder is gone: the flock is free again
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(f, fcntl.LOCK_UN)


def test_a_read_only_run_directory_fails_in_one_line_naming_the_path(tmp_path, monkeypatch):
    import builtins

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lock = run_dir / rundir.LOCK
    if os.geteuid() != 0:  # a real read-only directory
        run_dir.chmod(0o555)
    else:  # root ignores the mode bits: the open fails as it would for another user
        real_open = builtins.open

        def read_only_open(file, mode="r", *a, **k):
            if Path(file) == lock and any(c in mode for c in "wa+x"):
                raise PermissionError(errno.EACCES, "Permission denied", str(file))
            return real_open(file, mode, *a, **k)

        monkeypatch.setattr(builtins, "open", read_only_open)
    try:
        with pytest.raises(rundir.RunDirError) as err:
            RunLock(run_dir).acquire()
    finally:
        run_dir.chmod(0o755)
    msg = str(err.value)
    assert isinstance(err.value, RunLockedError)  # run.py prints it as one `error:` line; a sweep skips the job
    assert "\n" not in msg and err.value.__cause__ is None and err.value.__suppress_context__
    assert msg.startswith(f"cannot write the run directory {run_dir}: opening {lock} failed (Permission denied)")
    assert f"make {run_dir} writable" in msg
    assert not lock.exists()


def test_a_completely_full_disk_while_taking_the_lock_is_one_line(tmp_path, monkeypatch):
    """The lock file opens (an empty file needs no block) but its record cannot be written: the buffered write
    fails, and so would the flush that closing it tries again; one RunDirError line, the file closed."""
    import io

    class FullDisk(io.FileIO):
        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    opened = []

    def open_on_a_full_disk(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        opened.append(io.BufferedRandom(FullDisk(self.path, "a+")))
        return opened[-1]

    monkeypatch.setattr(RunLock, "_open", open_on_a_full_disk)
    with pytest.raises(rundir.RunDirError) as err:
        RunLock(tmp_path).acquire()
    msg = str(err.value)
    assert "\n" not in msg and err.value.__cause__ is None and err.value.__suppress_context__
    assert msg.startswith(f"cannot write the run directory {tmp_path}: writing {tmp_path / rundir.LOCK} failed "
                          "(No space left on device); free space"), msg
    assert opened[0].closed
    monkeypatch.undo()  # space again: the failed acquisition left nothing held, in this process or elsewhere
    RunLock(tmp_path).acquire().release()


# Run before run.py in its process: every file the run directory's records open for writing (rundir's own
# ``open``: the lock, Hydra's record, config.json, summary.json) is on a disk with no space left, except those
# named in SPARED; the file opens (creating an empty one needs no block) but no byte of it can be written.
_FULL_DISK = """
import builtins, errno, io
from pathlib import Path
import dapo_exp.rundir as rundir

class FullDisk(io.FileIO):
    def write(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

def full_open(file, mode="r", *args, **kwargs):
    spared = any(part in SPARED for part in Path(file).parts)
    if spared or not any(c in mode for c in "wax+"):
        return builtins.open(file, mode, *args, **kwargs)
    raw = FullDisk(file, mode.replace("b", "").replace("t", ""))
    buffered = io.BufferedRandom(raw) if "+" in mode else io.BufferedWriter(raw)
    return buffered if "b" in mode else io.TextIOWrapper(buffered, encoding=kwargs.get("encoding"))

rundir.open = full_open
"""


@pytest.mark.parametrize("spared, exit_code, file", [
    ((), 1, rundir.LOCK),  # the lock's record is the first write
    ((rundir.LOCK,), 3, ".hydra"),  # then Hydra's record of the command
    ((rundir.LOCK, ".hydra"), 3, rundir.SUMMARY),  # then the run's own records, the summary first
])
def test_a_completely_full_disk_is_one_line_whichever_file_it_stops(tmp_path, spared, exit_code, file):
    """A disk with no space left stops the run at its first write, whichever file that is: one ``error:`` line
    naming the file and the cause, no traceback, the exit code of its kind (1: the run directory cannot be
    locked, as a read-only one; 3: a run failure)."""
    from helpers import SMALL

    run_dir = tmp_path / "run"
    argv = ["run.py", *SMALL, "train.steps=1", f"hydra.run.dir={run_dir}"]
    code = f"SPARED = {spared!r}\n{_FULL_DISK}\nimport runpy, sys\nsys.argv = {argv!r}\nrunpy.run_path('run.py', run_name='__main__')"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == exit_code and len(lines) == 1, out.stderr[-3000:]
    assert lines[0].startswith("error: cannot write ") and str(run_dir / file) in lines[0], lines[0]
    assert "No space left on device" in lines[0] and "Traceback" not in out.stdout


def test_a_directory_where_the_lock_file_goes_is_one_line(tmp_path):
    (tmp_path / rundir.LOCK).mkdir()
    with pytest.raises(rundir.RunDirError, match=rf"opening {tmp_path / rundir.LOCK} failed .*; remove "):
        RunLock(tmp_path).acquire()


# --------------------------------------------------------------------------- #
# divergence is a named failure (issue 24)                                       #
# --------------------------------------------------------------------------- #
def _rows(run_dir):
    return rundir.read_jsonl(Path(run_dir) / rundir.METRICS)


@pytest.mark.slow
def test_a_diverging_run_fails_naming_what_went_non_finite_and_logs_nothing_of_that_step(tmp_path, small_cfg):
    from dapo_exp.runner import TrainingDiverged

    cfg = small_cfg(tmp_path, "optim.lr=1e6")
    for _ in range(2):  # a re-run fails the same way, never on the NaN weights of a checkpoint
        with pytest.raises(TrainingDiverged, match=r"^actor/grad_norm is nan at step 1: training diverged"):
            train(cfg)
        summary = rundir.read_summary(tmp_path)
        assert summary["status"] == "failed"
        assert summary["error"].startswith("TrainingDiverged: actor/grad_norm is nan at step 1")
        assert all(r["step"] == 0 for r in _rows(tmp_path))  # only the evaluation before training
        assert not rundir.read_jsonl(tmp_path / rundir.TRAIN_SAMPLES)
        assert not list((tmp_path / rundir.CHECKPOINTS).glob("step_*"))


@pytest.mark.slow
def test_weights_going_non_finite_stop_the_run_and_keep_the_last_good_checkpoint(tmp_path, small_cfg, monkeypatch):
    import torch

    from dapo_exp import steps
    from dapo_exp.runner import TrainingDiverged

    real, calls = steps.update_policy, {"n": 0}

    def poisoned(model, *a, **k):
        upd = real(model, *a, **k)
        calls["n"] += 1
        if calls["n"] == 2:  # step 2's update leaves a NaN in the weights (its loss and norm finite)
            with torch.no_grad():
                next(model.parameters()).view(-1)[:3] = float("nan")
        return upd

    monkeypatch.setattr(steps, "update_policy", poisoned)
    overrides = ("train.steps=3", "checkpoint.every=1")
    with pytest.raises(TrainingDiverged, match=r"^the weights are not finite \(.* has 3 nan and 0 inf of \d+ "
                                               r"values\) at step 2: .*step_0000001, is kept"):
        train(small_cfg(tmp_path, *overrides))
    assert rundir.read_summary(tmp_path)["status"] == "failed"
    assert [p.name for p in (tmp_path / rundir.CHECKPOINTS).glob("step_*")] == ["step_0000001"]
    assert max(r["step"] for r in _rows(tmp_path)) == 1
    monkeypatch.undo()
    s = train(small_cfg(tmp_path, *overrides))  # the re-run resumes from the last good checkpoint
    assert s["status"] == "finished" and s["steps_done"] == 3 and s["history_gap"] == []


# --------------------------------------------------------------------------- #
# logs as durable as checkpoints (issue 24)                                      #
# --------------------------------------------------------------------------- #
@pytest.mark.slow
def test_the_metric_rows_are_fsynced_before_their_checkpoint_is_published(tmp_path, small_cfg, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    metrics_file = str(tmp_path / rundir.METRICS)

    def fsync(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        steps = [r["step"] for r in rundir.read_jsonl(path)] if path == metrics_file else None
        events.append(("fsync", path, steps))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(dst), None))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    train(small_cfg(tmp_path, "train.steps=2", "checkpoint.every=1"))
    for step in (1, 2):
        published = events.index(("replace", str(tmp_path / rundir.CHECKPOINTS / f"step_{step:07d}"), None))
        synced = [e[2] for e in events[:published] if e[:2] == ("fsync", metrics_file)]
        assert synced and step in synced[-1], (step, synced)


@pytest.mark.slow
def test_rows_lost_before_a_checkpoint_are_reported_and_the_summary_records_the_gap(tmp_path, resumable_run,
                                                                                    small_cfg, capsys):
    run_dir = _copy(resumable_run[0], tmp_path / "run")  # 2 steps, as if the machine died after its last checkpoint
    lines = (run_dir / rundir.METRICS).read_text().splitlines(keepends=True)
    assert [json.loads(x)["step"] for x in lines] == [0, 1, 2, 2]  # base eval, steps 1 and 2, step 2's eval
    (run_dir / rundir.METRICS).write_text("".join(lines[:2]))  # a power loss: step 2's rows never reached the disk
    capsys.readouterr()
    s = train(small_cfg(run_dir, "train.steps=3"))
    out = capsys.readouterr().out
    assert f"warning: {run_dir / rundir.METRICS} has no row for 1 of the 2 steps up to the checkpoint (step 2)" in out
    assert s["status"] == "finished" and s["history_gap"] == [2]
    assert rundir.read_summary(run_dir)["history_gap"] == [2]
    assert "history gap: no metric row for step 2" in out
    assert [r["step"] for r in _rows(run_dir) if "reward/mean" in r] == [1, 3]


BAD_ROWS = {
    "a row with a string step": ('{"step": "3", "reward/mean": 1.0}\n', 'its step is \'3\' (str), not an int'),
    "a torn row": ('{"step": 1, "reward/mean": 0.', "not valid JSON (torn by a kill?)"),
    "a row without a step": ('{"reward/mean": 1.0}\n', "its step is None (NoneType), not an int"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_an_unusable_metric_row_is_skipped_with_a_warning_never_fatal(tmp_path, one_step_run, small_cfg, capsys, case):
    text, why = BAD_ROWS[case]
    run_dir = _copy(one_step_run[0], tmp_path / "run")  # as if the machine died after its last checkpoint
    with open(run_dir / rundir.METRICS, "a") as f:
        f.write(text)
    capsys.readouterr()
    s = train(small_cfg(run_dir, "train.steps=2"))
    out = capsys.readouterr().out
    assert f"[dapo-exp] warning: {run_dir / rundir.METRICS} line 4: {why}" in out and "skipped" in out
    assert s["status"] == "finished" and s["steps_done"] == 2 and s["history_gap"] == []
    assert all(type(r["step"]) is int for r in _rows(run_dir))
    assert [r["step"] for r in _rows(run_dir) if "reward/mean" in r] == [1, 2]


# --------------------------------------------------------------------------- #
# a full disk still leaves a summary                                             #
# --------------------------------------------------------------------------- #
@pytest.mark.slow
def test_a_completely_full_disk_still_leaves_a_failed_summary(tmp_path, small_cfg, monkeypatch):
    """The disk fills up right after the start: no new file, no append, no atomic rewrite succeeds. The
    summary reserved at the start is overwritten in place, so the analysis reads the run as failed, not
    killed."""
    from dapo_exp.analysis.runs import load_runs

    real_atomic, started = rundir.write_text_atomic, []

    def no_space(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    def atomic(path, text):
        if Path(path).name == rundir.CONFIG and not started:  # the start's records: then the disk is full
            started.append(path)
            return real_atomic(path, text)
        if Path(path).name == rundir.SUMMARY and not (Path(path).parent / rundir.CONFIG).exists():
            return real_atomic(path, text)  # the small summary, written first
        no_space()

    monkeypatch.setattr(rundir, "write_text_atomic", atomic)
    monkeypatch.setattr(rundir.JsonlWriter, "write", no_space)
    with pytest.raises(OSError, match="No space left"):
        train(small_cfg(tmp_path, "train.steps=1"))
    monkeypatch.undo()
    summary = rundir.read_summary(tmp_path)
    assert summary["status"] == "failed" and "No space left on device" in summary["error"]
    assert summary["label"] and summary["seed"] == 0
    assert (tmp_path / rundir.SUMMARY).stat().st_size == rundir.SUMMARY_RESERVE  # overwritten in place
    (row,) = load_runs(tmp_path).runs.to_dict("records")
    assert row["status"] == "failed" and "No space left" in row["exclude_reason"]


def test_a_summary_that_still_says_running_reads_as_killed_once_its_writer_is_gone(tmp_path):
    import socket

    from dapo_exp.analysis.runs import load_runs

    for name, pid in (("dead", 999999), ("alive", os.getpid())):
        d = tmp_path / name
        d.mkdir()
        rundir.reserve_summary(d, {"status": "running", "label": "grpo", "seed": 0})
        (d / rundir.LOCK).write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "started": "then"}))
    runs = load_runs(tmp_path).runs.set_index("run")
    assert runs.loc["dead", "status"] == "killed" and "its writer is gone" in runs.loc["dead", "exclude_reason"]
    assert runs.loc["alive", "status"] == "running"


# --------------------------------------------------------------------------- #
# one configuration per table row                                               #
# --------------------------------------------------------------------------- #
def test_runs_that_share_a_label_but_differ_are_separate_rows_and_the_table_says_so(tmp_path):
    from dapo_exp.analysis.runs import load_runs
    from dapo_exp.analysis.table import comparison_table, table_markdown

    def run(name, seed, steps, model, lr=5e-5):
        d = tmp_path / name
        d.mkdir()
        config = {"seed": seed, "preset": "full", "sweep": "s", "out_dir": str(d), "logger": {"backend": "none"},
                  "train": {"steps": steps}, "model": {"path": model}, "optim": {"lr": lr}}
        rundir.write_json(d / rundir.SUMMARY, {"status": "finished", "label": "full", "seed": seed, "config": config,
                                               "final": {"eval/acc_avg": 0.5}, "switches": {}})

    run("a", 0, 1, "tiny")
    run("b", 1, 4, "tiny")
    run("c", 2, 4, "tiny")
    run("d", 3, 4, "/models/other")
    run("e", 0, 6, "tiny")
    data = load_runs(tmp_path)
    labels = dict(zip(data.runs["run"], data.runs["label"]))
    assert labels == {"a": "full [model.path=tiny, train.steps=1]", "b": "full [model.path=tiny, train.steps=4]",
                      "c": "full [model.path=tiny, train.steps=4]", "d": "full [model.path=/models/other, train.steps=4]",
                      "e": "full [model.path=tiny, train.steps=6]"}
    assert set(data.history["label"]) <= set(labels.values())
    (note,) = data.notes
    assert note.startswith("the 5 runs labelled full differ in model.path, train.steps: shown as 4 separate")
    table = comparison_table(data)
    assert len(table) == 4 and table.loc["full [model.path=tiny, train.steps=4]", "n"] == 2
    assert f"Note: {note}." in table_markdown(table)
    same = load_runs([tmp_path / "b", tmp_path / "c"])  # the same config, two seeds: pooled, no note
    assert set(same.runs["label"]) == {"full"} and same.notes == []


def test_runs_from_different_base_weights_are_never_pooled(tmp_path):
    """Two machines' builds of the same warm start differ (floating-point order): the same command
    and seeds then reach different accuracies. summary.json records the base weights' hash, and
    runs that share a label and config but not their base weights are separate rows."""
    from dapo_exp.analysis.runs import BASE_WEIGHTS, load_runs

    def run(name, seed, sha):
        d = tmp_path / name
        d.mkdir()
        config = {"seed": seed, "preset": "grpo", "model": {"path": "tiny"}, "train": {"steps": 30}}
        summary = {"status": "finished", "label": "grpo", "seed": seed, "config": config, "switches": {},
                   "final": {"eval/acc_avg": 0.5}}
        if sha:
            summary["base_model"] = {"path": "/somewhere/tiny-e5562a88c7a049a3", "sha256": sha}
        rundir.write_json(d / rundir.SUMMARY, summary)

    run("here0", 0, "a" * 64)
    run("here1", 1, "a" * 64)
    run("there0", 0, "b" * 64)
    run("older", 2, None)  # a run from before the hash was recorded: not a difference
    data = load_runs(tmp_path)
    labels = dict(zip(data.runs["run"], data.runs["label"]))
    assert labels["here0"] == labels["here1"] == f"grpo [model.base_sha256={'a' * 12}]"
    assert labels["there0"] == f"grpo [model.base_sha256={'b' * 12}]"
    assert data.runs.set_index("run").loc["here0", BASE_WEIGHTS] == "a" * 12
    (note,) = data.notes
    assert "differ in model.base_sha256" in note and "never pooled" in note
    from dapo_exp.analysis.table import comparison_table

    notes = comparison_table(data).attrs["notes"]
    assert any(n.startswith("the runs start from 2 different base weights") for n in notes), notes


def test_a_finished_run_records_its_base_weights(one_step_run):
    from dapo_exp.tasks.arith_warmstart import weights_sha256

    s = one_step_run[1]  # the summary of a finished 1-step run
    assert s["base_model"]["sha256"] == weights_sha256(s["model_path"]) and len(s["base_model"]["sha256"]) == 64
    assert len(s["base_model"]["files_sha256"]) == 64 and "tokenizer.json" in s["base_model"]["files"]


def test_a_resumed_run_records_the_base_weights_it_started_from(tmp_path, one_step_run, small_cfg, monkeypatch):
    """The base weights are recorded at the start and checkpointed: a resumed run reports the identity its
    checkpoint recorded, never one computed again at the end (a base whose files changed is refused at resume:
    the test below)."""
    from dapo_exp import runner

    run_dir, first = _copy(one_step_run[0], tmp_path / "r"), one_step_run[1]  # an interrupted run, resumed from its
    monkeypatch.setattr(runner, "base_model", lambda path: {"path": path, "sha256": "f" * 64})  # step-1 checkpoint
    longer = train(small_cfg(run_dir, "train.steps=2"))
    assert longer["steps_done"] == 2 and longer["base_model"] == first["base_model"]
    assert train(small_cfg(tmp_path / "fresh", "train.steps=1"))["base_model"]["sha256"] == "f" * 64  # the check bites


def test_a_file_the_base_model_loads_changed_under_a_killed_run_is_refused_naming_it(tmp_path, small_cfg):
    """Issue 48: the ids of "7" and "8" swapped in model.path's tokenizer.json under a killed run, and the same
    command resumed it without a word (36 values changed, the summary kept the old identity). Every file the base
    model loads is compared with the checkpoint's record: a change is refused in one line naming the file and
    how to start over, before anything is written; the file restored, the run resumes."""
    import shutil

    from helpers import shipped_default_model

    from dapo_exp.runner import ConfigChangedError

    model, run_dir = tmp_path / "model", tmp_path / "r"
    shutil.copytree(shipped_default_model(), model)
    train(small_cfg(run_dir, "train.steps=1", f"model.path={model}"))
    (run_dir / rundir.SUMMARY).unlink()  # killed after its step-1 checkpoint: the same command resumes it
    genuine = (model / "tokenizer.json").read_text()
    tok = json.loads(genuine)
    vocab = tok["model"]["vocab"]
    vocab["7"], vocab["8"] = vocab["8"], vocab["7"]
    (model / "tokenizer.json").write_text(json.dumps(tok))
    before = _snapshot(run_dir)
    with pytest.raises(ConfigChangedError) as refused:
        train(small_cfg(run_dir, "train.steps=2", f"model.path={model}"))
    msg = str(refused.value)
    assert "\n" not in msg and "tokenizer.json (SHA-256 " in msg and "model.safetensors" not in msg, msg
    assert f"delete {run_dir}" in msg and "another directory" in msg, msg
    assert _snapshot(run_dir) == before

    (model / "generation_config.json").unlink()  # a loaded file gone is a change too, named with the other
    with pytest.raises(ConfigChangedError,
                       match=r"generation_config.json \(SHA-256 \w{12} -> removed\), tokenizer.json"):
        train(small_cfg(run_dir, "train.steps=2", f"model.path={model}"))

    shutil.copy(shipped_default_model() / "generation_config.json", model)
    (model / "tokenizer.json").write_text(genuine)
    assert train(small_cfg(run_dir, "train.steps=2", f"model.path={model}"))["steps_done"] == 2


def test_a_run_never_writes_through_a_link_that_leaves_its_directory(tmp_path, one_step_run, small_cfg):
    """Issue 48: with checkpoints/ replaced by a link to a folder outside the run, saves and pruning happened in the
    link's target. A link under the run directory that leads out of it (a dangling one too) is refused before
    anything is written, naming the link; links that stay inside (W&B's latest-run) are the run's own."""
    import shutil

    run_dir, outside = _copy(one_step_run[0], tmp_path / "r"), tmp_path / "elsewhere"  # killed after its checkpoint
    shutil.move(run_dir / rundir.CHECKPOINTS, outside)
    (run_dir / rundir.CHECKPOINTS).symlink_to(outside)
    before, theirs = _snapshot(run_dir), _snapshot(outside)
    with pytest.raises(rundir.RunDirError, match=rf"{run_dir / rundir.CHECKPOINTS} is a link to {outside}, outside"):
        train(small_cfg(run_dir, "train.steps=2"))
    assert _snapshot(outside) == theirs and _snapshot(run_dir) == before

    other = tmp_path / "other"
    (other / "wandb" / "offline-run-1").mkdir(parents=True)
    (other / "wandb" / "latest-run").symlink_to(other / "wandb" / "offline-run-1")  # inside: the run's own
    logs = other / "wandb" / "offline-run-1" / "logs"
    logs.mkdir()
    (logs / "debug-core.log").symlink_to(tmp_path / "wandb-cache" / "core-debug.log")  # W&B's own link to its cache
    RunLock(other).acquire().release()
    (other / rundir.METRICS).symlink_to(tmp_path / "nowhere" / rundir.METRICS)  # dangling, and outside
    with pytest.raises(rundir.RunDirError, match=rf"{other / rundir.METRICS} is a link to {tmp_path / 'nowhere'}"):
        RunLock(other).acquire()
    assert not (tmp_path / "nowhere").exists()


# --------------------------------------------------------------------------- #
# a signal during the warm start                                                  #
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_the_warm_start_stops_it_within_seconds(tmp_path, sig):
    """The warm-start build takes minutes; a signal stops it before its next supervised step, with one line,
    the run recorded as stopped and nothing of the build left to trust."""
    import time

    from helpers import SMALL

    from dapo_exp.tasks.arith_warmstart import cache_problem

    cache, run_dir = tmp_path / "cache", tmp_path / "run"
    cmd = [sys.executable, "run.py", *SMALL, "model.warmstart_steps=100000", f"model.cache_dir={cache}",
           f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines = []
    for line in proc.stdout:  # until the build has begun
        lines.append(line)
        if "building the warm-started tiny model" in line:
            break
    assert proc.poll() is None, "".join(lines)[-2000:]
    time.sleep(1.0)
    proc.send_signal(sig)
    rest, _ = proc.communicate(timeout=60)  # a hang guard: 100000 warm-start steps would take hours
    out = "".join(lines) + rest
    assert proc.returncode == 128 + sig, out[-2000:]
    name = signal.Signals(sig).name
    said = [ln for ln in rest.splitlines() if name in ln]
    assert said == [f"[dapo-exp] {name}: stopping the set-up within seconds (nothing trained yet is lost); re-run "
                    "the same command to start again"], out[-2000:]
    assert "Traceback" not in out
    summary = rundir.read_summary(run_dir)
    assert summary["status"] == "stopped" and f"stopped by {name} during the set-up" in summary["error"]
    built = [p for p in cache.iterdir() if p.is_dir()]
    assert all(cache_problem(p) for p in built)  # nothing of the build is trusted (nothing was saved)


# --------------------------------------------------------------------------- #
# a run that fails before its first step                                          #
# --------------------------------------------------------------------------- #
OFFLINE_SOURCES = {
    "data": ["task=dapo_math"],
    "model": ["model.path=Qwen/Qwen2.5-0.5B"],
}


def _offline_env(tmp_path):
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_OFFLINE": "1",
            "OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize("what", list(OFFLINE_SOURCES))
def test_a_run_failing_before_its_first_step_leaves_no_directory_for_data_and_model_alike(tmp_path, what):
    run_dir = tmp_path / "run"
    out = subprocess.run([sys.executable, "run.py", "logger=none", *OFFLINE_SOURCES[what], f"hydra.run.dir={run_dir}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, env=_offline_env(tmp_path))
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), out.stderr[-2000:]
    assert not run_dir.exists()


DAPO_MATH_SETS = ("BytedTsinghua-SIA/DAPO-Math-17k", "BytedTsinghua-SIA/AIME-2024")  # task=dapo_math's two sets


def _fake_cached_copy(hf_home: Path, repo: str) -> None:
    """A data set's snapshot in the hub's cache layout, holding one damaged file: cached, but not loadable."""
    snapshot = "0123456789abcdef0123456789abcdef01234567"
    root = hf_home / "hub" / f"datasets--{repo.replace('/', '--')}"
    (root / "snapshots" / snapshot).mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(snapshot)
    (root / "snapshots" / snapshot / "data.parquet").write_text("not a parquet file\n")


def test_an_offline_data_set_not_in_the_cache_is_refused_once_before_any_job(tmp_path):
    """HF_HUB_OFFLINE=1 and a data set this machine has never cached: the sweep is refused in one line naming the
    field and the set, exit 2, before any job or directory (not each job failing with a traceback)."""
    sweep = tmp_path / "sweep"
    out = subprocess.run([sys.executable, "run.py", "-m", "logger=none", "hydra/launcher=basic", *OFFLINE_SOURCES["data"],
                          "seed=0,1", f"hydra.sweep.dir={sweep}"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=_offline_env(tmp_path))
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
    assert lines[0].startswith(f"error: task.train_source: {DAPO_MATH_SETS[0]} is not in the Hugging Face cache")
    assert "HF_HUB_OFFLINE=1" in lines[0] and not sweep.exists()


@pytest.fixture(scope="module")
def offline_data_sweep(tmp_path_factory):
    """``run.py -m`` of two jobs (seeds 0 and 1, the basic launcher named: it runs them in its process) whose data
    sets are in the offline cache (so the launch check passes) but cannot be loaded from it (a damaged copy): each
    job fails alike. Returns (its argv, its sweep directory, the CompletedProcess)."""
    tmp = tmp_path_factory.mktemp("offline_sweep")
    sweep = tmp / "sweep"
    for repo in DAPO_MATH_SETS:
        _fake_cached_copy(tmp / "hf", repo)
    argv = ["-m", "logger=none", "hydra/launcher=basic", *OFFLINE_SOURCES["data"], "seed=0,1", f"hydra.sweep.dir={sweep}"]
    out = subprocess.run([sys.executable, "run.py", *argv], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=_offline_env(tmp))
    return argv, sweep, out


# a model the hub cannot give is refused before any job: test_preflight.py
def test_in_a_sweep_such_a_job_is_marked_failed_before_any_compute(offline_data_sweep):
    _, sweep, out = offline_data_sweep
    assert out.returncode == 1, out.stderr[-2000:]
    jobs = sorted(p.parent for p in sweep.rglob(rundir.SUMMARY))
    assert len(jobs) == 2, jobs
    for job in jobs:
        summary = rundir.read_summary(job)
        assert summary["status"] == "failed" and summary["error"]
        assert rundir.nothing_computed(job)  # no metric row, no checkpoint, no sample: only the records of a start


def test_a_sweep_whose_jobs_all_fail_alike_ends_in_one_line_counting_them_and_naming_the_command(offline_data_sweep):
    """No job finished: the closing line says so (not "the others finished"), gives the error they share once,
    and the command to take them up again is the one given, every override and the launcher kept."""
    argv, _, out = offline_data_sweep
    assert out.returncode == 1, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: 2 job(s) of the sweep failed, none finished, each with the same error: "), last
    assert f"`python run.py {' '.join(argv)} \"sweep='seed=0,1'\"` again re-runs only them" in last, last


def test_the_closing_line_of_a_sweep_counts_each_kind_of_job(tmp_path):
    import runpy

    end = runpy.run_path(str(ROOT / "run.py"), run_name="run")["sweep_end_line"]
    rerun = "python run.py -m hydra/launcher=parallel fixes=grpo,clip"
    assert end(failed=[], lost=[], refused=[], finished=4, rerun=rerun) is None
    line = end(failed=[("a", "boom"), ("b", "bang")], lost=[], refused=[], finished=2, rerun=rerun)
    assert line == (f"error: 2 job(s) of the sweep failed, 2 finished: a, b; each one's summary.json has its error and "
                    f"traceback; `{rerun}` again re-runs only them")
    assert "each with the same error: boom:" in end(failed=[("a", "boom"), ("b", "boom")], lost=[], refused=[],
                                                    finished=0, rerun=rerun)
    assert end(failed=[], lost=[("c", "CANCELLED")], refused=[], finished=1, rerun=rerun).startswith(
        "error: 1 job(s) of the sweep ended without a result, 1 finished: c (CANCELLED)")
    assert ", none finished: d " in end(failed=[], lost=[], refused=["d"], finished=0, rerun=rerun)


def _note_everything(where: str) -> None:
    """What a command notes as it goes, each through the function its writer calls: the sweep (run.py's job
    function, the callback, the parallel launcher), a job lost (the SLURM launcher), a job refused (run.py),
    a signal (the stop watcher) and the run under way's watcher."""
    from dapo_exp.analysis.callback import note_sweep

    note_sweep(f"{where}/sweep")
    rundir.note_lost_job(f"{where}/lost", "CANCELLED")
    rundir.note_refused_job(f"{where}/refused")
    rundir.note_signal("SIGTERM")
    rundir.watch_stop(type("Watcher", (), {"signame": "SIGTERM"})())


def test_two_commands_in_one_process_see_nothing_of_each_other(monkeypatch, tmp_path):
    """Each command (``python run.py``, which opens rundir.command_state()) has its own stop, sweeps, lost and
    refused jobs: a second command in the same process (a test running several) sees none of the first's,
    where module globals made the second name the first's lost and refused jobs and count its sweep."""
    from dapo_exp.analysis.callback import noted_sweeps

    monkeypatch.setenv(rundir.SWEEP_STOP_ENV, str(tmp_path / ".stop"))  # where sweep_stop reads the signal noted
    with rundir.command_state() as first:
        _note_everything("a")
        assert (noted_sweeps(), rundir.lost_jobs(), rundir.refused_jobs()) == (["a/sweep"], [("a/lost", "CANCELLED")],
                                                                               ["a/refused"])
        assert rundir.sweep_stop() == rundir.stop_requested() == "SIGTERM"
        assert rundir.current_state() is first and first.refused == ["a/refused"]  # what run.py reads at the end
    with rundir.command_state() as second:
        assert second is not first and rundir.current_state() is second
        assert (noted_sweeps(), rundir.lost_jobs(), rundir.refused_jobs()) == ([], [], [])
        assert rundir.sweep_stop() is None and rundir.stop_requested() is None
        _note_everything("b")
        assert (noted_sweeps(), rundir.lost_jobs(), rundir.refused_jobs()) == (["b/sweep"], [("b/lost", "CANCELLED")],
                                                                               ["b/refused"])
    assert first.lost == [("a/lost", "CANCELLED")] and first.sweeps == ["a/sweep"]  # the first's own, untouched


def test_outside_a_command_the_process_keeps_its_own_state(monkeypatch, tmp_path):
    """With no command open (a library user calling train(), a parallel sweep's worker process, a test), the
    functions read and write the process's own state, which lasts as long as the process: a signal a worker
    received between two jobs is still there for the next job's sweep_stop. A command opened meanwhile does
    not see it, and it is back when the command closes."""
    from dapo_exp.analysis.callback import noted_sweeps

    monkeypatch.setattr(rundir, "_current", rundir.CommandState())  # this test's process state, restored after
    monkeypatch.setenv(rundir.SWEEP_STOP_ENV, str(tmp_path / ".stop"))
    process = rundir.current_state()
    rundir.note_signal("SIGINT")  # a worker's handler between jobs
    rundir.note_lost_job("x", "TIMEOUT")
    rundir.note_lost_job("x", "CANCELLED")  # noted once per job
    assert rundir.current_state() is process and rundir.sweep_stop() == "SIGINT"  # the next call still sees it
    with rundir.command_state():
        assert rundir.sweep_stop() is None and rundir.lost_jobs() == [] and noted_sweeps() == []
        rundir.note_signal("SIGTERM")
    assert rundir.current_state() is process and rundir.sweep_stop() == "SIGINT"
    assert rundir.lost_jobs() == [("x", "TIMEOUT")]


# --------------------------------------------------------------------------- #
# the busy-machine benchmark runs (its figures are measured by hand)             #
# --------------------------------------------------------------------------- #
@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="no autogroup scheduling in this kernel")
def test_a_nice_busy_loop_in_its_own_session_is_nice_as_a_scheduling_group_too():
    """With autogroup scheduling a new session is a group of its own: os.nice(19) alone left the --quick busy
    loop a whole core of two beside the test suite; the group's nice must be 19 as well."""
    from dapo_exp.benchmarks.busy_machine import start_busy, stop_busy

    procs = start_busy(1, own_session=True, nice=19)
    try:
        deadline = time.time() + 20
        text = ""
        while time.time() < deadline and " nice 19" not in text:
            text = Path(f"/proc/{procs[0].pid}/autogroup").read_text()
            time.sleep(0.05)
        assert text.rstrip().endswith(" nice 19"), text
        assert os.getpriority(os.PRIO_PROCESS, procs[0].pid) == 19
    finally:
        stop_busy(procs)


@pytest.mark.slow
def test_the_busy_machine_benchmark_prints_its_figures_in_quick_mode(warm_cache):
    import re

    out = subprocess.run([sys.executable, "-m", "dapo_exp.benchmarks.busy_machine", "--quick", "--cache-dir",
                          warm_cache], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    text = out.stdout
    load = r"load average: \d+\.\d\d, \d+\.\d\d, \d+\.\d\d"
    for pattern in (rf"quiet: rollout step \d+\.\d\d s \(median of 2 steps; torch threads: \d+ .*{load} after",
                    rf"busy: rollout step \d+\.\d\d s \(median of 2 steps; torch threads: \d+ .*{load} after",
                    r"1 busy-loop processes started \(own session; kernel autogroup scheduling: \w+; nice 19: --quick, not a "
                    r"busy machine\); 1-minute load \d+\.\d\d",
                    rf"busy/quiet rollout step: \d+\.\d\d \(acceptance: at most 2\); {load}",
                    rf"cold run under load: \d+ s wall, the shipped warm start, or one built \(torch threads: .*{load} after"):
        assert re.search(pattern, text), (pattern, text)


@pytest.mark.slow
def test_the_toy_run_benchmark_prints_its_table_at_minimal_size(tmp_path):
    """toy_run from an empty cache: the default run starts from the shipped warm start, builds none, and the
    benchmark says so instead of failing on a missing warm-start record."""
    from helpers import SMALL

    small = [o for o in SMALL if not o.startswith(("logger=", "checkpoint."))] + ["train.steps=1"]
    out = subprocess.run([sys.executable, "-m", "dapo_exp.benchmarks.toy_run", "--seeds", "0", *small], cwd=ROOT,
                         capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert "| warm start alone | none built: the package's shipped warm start |" in out.stdout
    assert "| `python run.py`, warm cache, per seed |" in out.stdout and "| rollout steps | 1 |" in out.stdout
