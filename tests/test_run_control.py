"""Fault injection on the run directory and the loop: one writer per run, SIGTERM as a clean stop,
progress lines in non-interactive logs, bad JSONL lines, early interruption, a full disk."""

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dapo_exp import rundir
from dapo_exp.rundir import RunLock, RunLockedError
from dapo_exp.train import RunStopped, train

ROOT = Path(__file__).resolve().parents[1]
VOLATILE = ("timing_s/", "perf/")


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

    from conftest import SMALL

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
def test_a_second_writer_is_refused_naming_the_holder(tmp_path, small_cfg):
    with RunLock(tmp_path):
        with pytest.raises(RunLockedError, match=rf"in use by pid {os.getpid()} on "):
            train(small_cfg(tmp_path))
    assert not (tmp_path / rundir.SUMMARY).exists() and not (tmp_path / rundir.CONFIG).exists()


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path, capsys):
    (tmp_path / rundir.LOCK).write_text(json.dumps({"pid": 999999, "host": "elsewhere", "started": "then"}))
    with RunLock(tmp_path):
        assert json.loads((tmp_path / rundir.LOCK).read_text())["pid"] == os.getpid()
    assert "its last writer (pid 999999 on elsewhere) is gone" in capsys.readouterr().out


@pytest.mark.slow
def test_two_identical_commands_one_writes_the_other_is_refused(tmp_path, warm_cache):
    """The resubmitted-job case, with two real processes: the second exits naming the holder's pid
    and writes nothing; the first's files have each row once (it is then stopped with SIGTERM)."""
    first, run_dir, cmd = _long_run(tmp_path, warm_cache, rows=2)
    second = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert second.returncode != 0 and f"in use by pid {first.pid}" in second.stdout + second.stderr
    first.send_signal(signal.SIGTERM)
    out_first = first.communicate(timeout=300)[0]
    assert first.returncode == 128 + signal.SIGTERM, out_first[-2000:]
    rows = rundir.read_jsonl(run_dir / rundir.METRICS)
    keys = [(r["step"], "reward/mean" in r) for r in rows]
    assert len(keys) == len(set(keys))
    samples = rundir.read_jsonl(run_dir / rundir.EVAL_SAMPLES)
    ids = [(r["step"], r["problem_id"], r["sample"]) for r in samples]
    assert ids and len(ids) == len(set(ids))


# --------------------------------------------------------------------------- #
# SIGTERM / SIGINT                                                              #
# --------------------------------------------------------------------------- #
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_cleanly_and_the_rerun_resumes_to_the_same_metrics(sig, tmp_path, small_cfg, monkeypatch):
    overrides = ("train.steps=4", "checkpoint.every=10")  # no periodic checkpoint before the end
    train(small_cfg(tmp_path / "whole", *overrides))
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
    assert s["status"] == "finished" and s["steps_done"] == 4
    assert _metrics(tmp_path / "cut") == _metrics(tmp_path / "whole")


@pytest.mark.slow
def test_sigterm_to_the_process_exits_143_with_a_stopped_summary(tmp_path, warm_cache):
    proc, run_dir, _ = _long_run(tmp_path, warm_cache, rows=3)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 128 + signal.SIGTERM, out[-2000:]
    summary = rundir.read_summary(run_dir)
    assert summary["status"] == "stopped" and 1 <= summary["steps_done"] < 500
    assert (run_dir / rundir.CHECKPOINTS / f"step_{summary['steps_done']:07d}").is_dir()
    assert "SIGTERM: stopping after this step" in out


# --------------------------------------------------------------------------- #
# what a log file shows                                                         #
# --------------------------------------------------------------------------- #
@pytest.mark.slow
def test_run_py_to_a_file_prints_progress_lines(tmp_path, warm_cache):
    from conftest import SMALL

    log = tmp_path / "out.log"
    with open(log, "w") as f:
        rc = subprocess.run([sys.executable, "run.py", *SMALL, "train.steps=3", f"model.cache_dir={warm_cache}",
                             f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                            timeout=600).returncode
    text = log.read_text()
    assert rc == 0, text[-2000:]
    # the first and the last step always print (others at most every logger.progress_every_s)
    for step in (1, 3):
        assert f"step {step}/3 | reward " in text and " s/step, eta " in text
    assert "finished 3 steps" in text


# --------------------------------------------------------------------------- #
# damaged files, early interruption, a full disk                                #
# --------------------------------------------------------------------------- #
@pytest.mark.slow
def test_resume_skips_json_lines_that_are_not_objects(tmp_path, small_cfg):
    train(small_cfg(tmp_path, "train.steps=1"))
    (tmp_path / rundir.SUMMARY).unlink()  # as if killed after its checkpoint
    with open(tmp_path / rundir.METRICS, "a") as f:
        f.write('42\n[1, 2]\n"text"\nnull\n{"step": 1, "torn": ')
    s = train(small_cfg(tmp_path, "train.steps=2"))
    assert s["status"] == "finished" and s["steps_done"] == 2
    rows = rundir.read_jsonl(tmp_path / rundir.METRICS)
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


def _finished_then_resumable(tmp_path, small_cfg, steps=2):
    train(small_cfg(tmp_path, f"train.steps={steps}"))
    (tmp_path / rundir.SUMMARY).unlink()  # as if the machine died after its last checkpoint


@pytest.mark.slow
def test_rows_lost_before_a_checkpoint_are_reported_and_the_summary_records_the_gap(tmp_path, small_cfg, capsys):
    _finished_then_resumable(tmp_path, small_cfg)
    lines = (tmp_path / rundir.METRICS).read_text().splitlines(keepends=True)
    assert [json.loads(x)["step"] for x in lines] == [0, 1, 2, 2]  # base eval, steps 1 and 2, step 2's eval
    (tmp_path / rundir.METRICS).write_text("".join(lines[:2]))  # a power loss: step 2's rows never reached the disk
    capsys.readouterr()
    s = train(small_cfg(tmp_path, "train.steps=3"))
    out = capsys.readouterr().out
    assert f"warning: {tmp_path / rundir.METRICS} has no row for 1 of the 2 steps up to the checkpoint (step 2)" in out
    assert s["status"] == "finished" and s["history_gap"] == [2]
    assert rundir.read_summary(tmp_path)["history_gap"] == [2]
    assert "history gap: no metric row for step 2" in out
    assert [r["step"] for r in _rows(tmp_path) if "reward/mean" in r] == [1, 3]


BAD_ROWS = {
    "a row with a string step": ('{"step": "3", "reward/mean": 1.0}\n', 'its step is \'3\' (str), not an int'),
    "a torn row": ('{"step": 1, "reward/mean": 0.', "not valid JSON (torn by a kill?)"),
    "a row without a step": ('{"reward/mean": 1.0}\n', "its step is None (NoneType), not an int"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_an_unusable_metric_row_is_skipped_with_a_warning_never_fatal(tmp_path, small_cfg, capsys, case):
    text, why = BAD_ROWS[case]
    _finished_then_resumable(tmp_path, small_cfg, steps=1)
    with open(tmp_path / rundir.METRICS, "a") as f:
        f.write(text)
    capsys.readouterr()
    s = train(small_cfg(tmp_path, "train.steps=2"))
    out = capsys.readouterr().out
    assert f"[dapo-exp] warning: {tmp_path / rundir.METRICS} line 4: {why}" in out and "skipped" in out
    assert s["status"] == "finished" and s["steps_done"] == 2 and s["history_gap"] == []
    assert all(type(r["step"]) is int for r in _rows(tmp_path))
    assert [r["step"] for r in _rows(tmp_path) if "reward/mean" in r] == [1, 2]
