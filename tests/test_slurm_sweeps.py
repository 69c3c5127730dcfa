"""The project's SLURM paths against a real scheduler: the one-node cluster of ``.ci/slurm`` (SLURM
with accounting, started here as root; the module skips, saying why, where it cannot start).

- ``hydra/launcher=slurm_local`` submits a sweep as one array job; ``scancel`` of one job ends the
  sweep with exit 1 naming that run while the other finishes and the table is printed; the same
  command again resumes the cancelled run from its checkpoint and ends with exit 0;
- a requeue (``scontrol requeue``: SIGTERM) and SLURM's time-limit warning (SIGUSR2, which submitit
  answers with a requeue) mid-run each resume to metrics equal, value by value, to an uninterrupted
  run's, and after the warning no step is trained twice (the stop checkpoints the step it ends);
- the verl job script the dry run renders is accepted by ``sbatch --test-only`` (fake GPUs), even
  with a ``:`` in an override (the run folder carries no ``\\:``);
- a verl job (``train.device=cpu``, ``fixes=cispo``) runs to its end under SLURM, its Ray head started by the
  script, and its run reaches the analysis table; from its outputs, the family's surrogate runs as verl's own
  loss (``loss_mode=cispo``, our clip range) and the row without DAPO's fixes shows none of them as verl ran
  it (the contrast of tests/test_verl_run.py's DAPO row, whose every fix is on).

What only a real cluster shows (several nodes, real GPUs, a shared file system, Ray across nodes)
is not tested here: docs/how-to/slurm-sweep.md and verl-cluster.md.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import NO_FIGURES, SMALL, ray_to_itself

from dapo_exp import rundir

ROOT = Path(__file__).resolve().parents[1]
VOLATILE = ("timing_s/", "perf/", "time/")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def slurm(slurm_cluster):
    """The environment of a process that uses the local cluster (SLURM_CONF set)."""
    return {**os.environ, **slurm_cluster, "PYTHONPATH": str(ROOT)}


def _sweep_cmd(sweep: Path, warm_cache: str, *overrides: str) -> list[str]:
    small = [o for o in SMALL if not o.startswith(("train.steps=", "checkpoint.every="))]
    return [sys.executable, str(ROOT / "run.py"), "-m", "hydra/launcher=slurm_local", *small,
            f"model.cache_dir={warm_cache}", f"hydra.sweep.dir={sweep}", "seed=0", NO_FIGURES, *overrides]


def _run_dir(sweep: Path, part: str) -> Path:
    (found,) = [p for p in sweep.iterdir() if p.is_dir() and part in p.name]
    return found


def _steps_logged(run: Path) -> int:
    try:
        return max((r["step"] for r in rundir.read_jsonl(run / rundir.METRICS)), default=-1)
    except (OSError, ValueError):
        return -1


def _wait_for_step(sweep: Path, part: str, step: int, deadline: float, sweep_proc: subprocess.Popen) -> Path:
    while time.monotonic() < deadline:
        if sweep_proc.poll() is not None:
            raise AssertionError(f"the sweep command ended (exit {sweep_proc.returncode}) before {part} logged step "
                                 f"{step}: {sweep_proc.communicate()[0][-3000:]}")
        runs = [p for p in sweep.glob("*") if p.is_dir() and part in p.name]
        if runs and _steps_logged(runs[0]) >= step:
            return runs[0]
        time.sleep(0.3)
    raise AssertionError(f"{part}: no step {step} logged in time under {sweep}")


def _metrics(run: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rundir.read_jsonl(run / rundir.METRICS)]


def _table_rows(sweep: Path) -> dict[str, int]:
    """The analysis table's rows: configuration -> n (the runs it counts)."""
    import pandas as pd

    table = pd.read_csv(sweep / "analysis" / "table.csv")
    return {str(c): int(n) for c, n in zip(table["config"], table["n"])}


def _job_logs(sweep: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted((sweep / ".submitit").rglob("*_log.out")))


def _task_of(run: Path) -> str:
    """``<array job>_<task>``: the SLURM job of the run directory ``run`` (Hydra's ``hydra.job.id``, which the
    submitit launcher sets in the job and the run records in ``.hydra/hydra.yaml``)."""
    from omegaconf import OmegaConf

    job_id = str(OmegaConf.load(run / ".hydra" / "hydra.yaml").hydra.job.id)
    assert re.fullmatch(r"\d+_\d+", job_id), job_id
    return job_id


# --------------------------------------------------------------------------- #
# a sweep, a cancelled job, the same command again                              #
# --------------------------------------------------------------------------- #
def test_a_cancelled_job_is_named_the_others_finish_and_the_rerun_resumes_it(slurm, tmp_path, warm_cache):
    sweep = tmp_path / "sweep"
    # 40 steps, the cancel after step 6: it must land mid-run, and a toy step alone on the node takes 0.3 s (12
    # steps, tried 2026-11-29, finished both jobs before the cancel arrived)
    cmd = _sweep_cmd(sweep, warm_cache, "fixes=grpo,clip", "train.steps=40", "checkpoint.every=5")
    deadline = time.monotonic() + 600
    first = subprocess.Popen(cmd, cwd=tmp_path, env=slurm, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    clip = _wait_for_step(sweep, "fixes=clip", 6, deadline, first)
    task = _task_of(clip)
    subprocess.run(["scancel", task], env=slurm, check=True)
    out = first.communicate(timeout=max(1, deadline - time.monotonic()))[0]
    assert first.returncode == 1, out[-4000:]
    assert f"{clip}: SLURM job {task} ended CANCELLED" in out, out[-4000:]
    assert "1 job(s) of the sweep ended without a result" in out and str(clip) in out.split("error:")[-1]
    grpo = _run_dir(sweep, "fixes=grpo")
    assert rundir.read_summary(grpo)["status"] == "finished"
    assert rundir.read_summary(clip)["status"] in ("stopped", "running", "failed")  # not finished
    counted = _table_rows(sweep)  # the table counts what finished: the cancelled run is not in its n
    assert "[analysis]" in out and counted["grpo"] == 1 and counted.get("clip", 0) == 0, counted
    stopped_at = _steps_logged(clip)
    assert 6 <= stopped_at < 40

    again = subprocess.run(cmd, cwd=tmp_path, env=slurm, capture_output=True, text=True,
                           timeout=max(1, deadline - time.monotonic()))
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-3000:]
    assert rundir.read_summary(clip)["status"] == "finished" and rundir.read_summary(clip)["steps_done"] == 40
    assert f"resuming {clip.name} from its checkpoint at step {stopped_at}" in _job_logs(sweep)
    assert "already finished; skipping" in _job_logs(sweep)  # grpo's job
    assert _table_rows(sweep) == {"grpo": 1, "clip": 1}


# --------------------------------------------------------------------------- #
# requeue (SIGTERM) and the time-limit warning (SIGUSR2)                        #
# --------------------------------------------------------------------------- #
def test_requeue_and_time_limit_warning_resume_to_the_uninterrupted_metrics(slurm, tmp_path, warm_cache):
    """Three copies of one run (``+notes.copy`` changes the folder, not the training): one left alone, one
    requeued with ``scontrol requeue``, one sent SLURM's time-limit warning (SIGUSR2). No periodic checkpoint
    (``checkpoint.every=0``: only the end's and a stop's), so a resume mid-run is from the checkpoint the stop
    wrote; 30 steps, the signals after step 4: they must land mid-run (12 steps, tried 2026-11-29, ended before
    the signals at 0.3 s a step)."""
    sweep = tmp_path / "sweep"
    cmd = _sweep_cmd(sweep, warm_cache, "fixes=full", "+notes.copy=ref,term,usr2", "train.steps=30",
                     "checkpoint.every=0", "hydra.launcher.array_parallelism=3")
    deadline = time.monotonic() + 600
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=slurm, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    term = _wait_for_step(sweep, "notes.copy=term", 4, deadline, proc)
    subprocess.run(["scontrol", "requeue", _task_of(term)], env=slurm, check=True)
    usr2 = _wait_for_step(sweep, "notes.copy=usr2", 4, deadline, proc)
    subprocess.run(["scancel", "--signal=USR2", _task_of(usr2)], env=slurm, check=True)
    out = proc.communicate(timeout=max(1, deadline - time.monotonic()))[0]
    assert proc.returncode == 0, out[-4000:]
    ref = _run_dir(sweep, "notes.copy=ref")
    for run in (ref, term, usr2):
        assert rundir.read_summary(run)["status"] == "finished", run
    logs = _job_logs(sweep)
    for run in (term, usr2):
        assert f"resuming {run.name} from its checkpoint" in logs, (run, logs[-3000:])
        assert _metrics(run) == _metrics(ref), run
    stop = re.search(rf"{re.escape(usr2.name)}: stopped after step (\d+); the scheduler requeues", logs)
    assert stop, logs[-3000:]
    step = int(stop.group(1))
    assert 4 <= step < 30  # mid-run, with no periodic checkpoint (checkpoint.every=0): the stop wrote its own
    assert f"resuming {usr2.name} from its checkpoint at step {step}\n" in logs  # nothing discarded, nothing twice


# --------------------------------------------------------------------------- #
# the verl job script                                                           #
# --------------------------------------------------------------------------- #
def test_the_verl_job_script_is_accepted_by_sbatch(slurm, tmp_path):
    """A verl sweep's scripts as the dry run renders them, sized for this one node (8 fake GPUs), with
    an override that contains ``:`` (Hydra escapes it in the folder name; sbatch would strip the ``\\``)."""
    cmd = [sys.executable, str(ROOT / "run.py"), "-m", "backend=verl", "backend.launch=slurm", "backend.dry_run=true",
           "experiment=toy_fast", "fixes=grpo,full", "seed=0", "backend.nnodes=1", "backend.gpus_per_node=2",
           "backend.slurm.time=00:30:00", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    out = subprocess.run(cmd, cwd=tmp_path, env=slurm, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    scripts = sorted((tmp_path / "sweep").glob("*/verl_job.sbatch"))
    assert len(scripts) == 2 and not any("\\" in str(s) for s in scripts)
    for script in scripts:
        test = subprocess.run(["sbatch", "--test-only", str(script)], env=slurm, capture_output=True, text=True)
        assert test.returncode == 0 and "to start at" in test.stderr, (script, test.stderr)
    too_big = scripts[0].read_text().replace("--gpus-per-node=2", "--gpus-per-node=64")
    (tmp_path / "too_big.sbatch").write_text(too_big)
    refused = subprocess.run(["sbatch", "--test-only", str(tmp_path / "too_big.sbatch")], env=slurm,
                             capture_output=True, text=True)
    assert refused.returncode != 0  # the check has teeth: more GPUs than the node has is refused


def test_a_verl_job_runs_to_its_end_under_slurm_and_reaches_the_table(slurm, tmp_path):
    """``backend=verl backend.launch=slurm train.device=cpu``: the sbatch script starts the Ray head (logical
    CPUs and GPUs, a per-job auth token), verl's trainer joins it and trains two steps, and the run's metrics,
    summary and checkpoints come home and reach the analysis table (issue 35). CISPO's row (GRPO with CISPO's
    surrogate, no DAPO fix): the family's surrogate as verl's own loss, and, from the same outputs, the contrast
    of tests/test_verl_run.py's DAPO row (each fix shown there, none here)."""
    from helpers import wait_for_verl_install

    wait_for_verl_install()  # .ci/test may be installing it beside the tests
    verl_python = ROOT / ".venv-verl" / "bin" / "python"
    if not verl_python.exists():
        pytest.skip(f"{verl_python} is missing (bash .ci/install-verl installs verl's environment)")
    run = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "run.py"), "backend=verl", "backend.launch=slurm", "train.device=cpu",
           "fixes=cispo", "train.steps=2", "checkpoint.every=1", "train.prompts_per_step=8", "rollout.n=4",
           "train.mini_batch_size=16", "train.micro_batch_size=16", "rollout.max_response_len=32",
           "algo.overlong_cache_len=8", "task.arith_n_eval=16", "eval.k=2", "logger=none", "seed=0",
           "backend.nnodes=1", "backend.gpus_per_node=1", "backend.slurm.time=00:20:00", f"hydra.run.dir={run}"]
    env = {**slurm, "PYTHONPATH": str(ROOT)}
    with ray_to_itself():  # no other test's Ray cluster beside this job's (helpers)
        out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0 and "as SLURM job" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
        job = re.search(r"as SLURM job (\d+)", out.stdout).group(1)
        deadline = time.monotonic() + 900
        while subprocess.run(["squeue", "-h", "-j", job], env=slurm, capture_output=True, text=True).stdout.strip():
            assert time.monotonic() < deadline, (run / "verl.log").read_text()[-3000:]
            time.sleep(5)
    logs = "".join(p.read_text() for p in run.glob("slurm-*.out"))
    summary = rundir.read_summary(run)
    assert summary and summary["status"] == "finished", logs[-3000:]
    assert "Ray cluster: 1 GPUs" in logs and "verl exited with 0" in logs
    assert [r["step"] for r in rundir.read_jsonl(run / rundir.METRICS) if "actor/pg_loss" in r] == [1, 2]
    assert (run / "checkpoints" / "global_step_2").is_dir()
    table = subprocess.run([sys.executable, "-m", "dapo_exp.analysis", str(run), "--no-figures"], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert table.returncode == 0 and re.search(r"^cispo\s+1\s", table.stdout, re.M), table.stdout[-2000:]
    _cispo_as_verl_ran_it(run, logs)


def _cispo_as_verl_ran_it(run: Path, logs: str) -> None:
    """CISPO (the family's representative) is verl's loss_mode=cispo with our clip range, its pg_loss logged;
    and none of DAPO's fixes is in effect (tests/test_verl_run.py shows each in its DAPO row)."""
    from omegaconf import OmegaConf

    from dapo_exp.backends.verl import FILTERED_LINE
    from dapo_exp.hydra_setup import compose_config

    found = sorted(run.glob("outputs/*/*/.hydra/config.yaml"))  # the config verl's Hydra app ran with
    assert found, f"no verl config under {run}/outputs"
    verl_cfg = OmegaConf.load(found[-1])
    actor = verl_cfg.actor_rollout_ref.actor
    ours = compose_config(["fixes=cispo"]).algo
    assert actor.policy_loss.loss_mode == "cispo"
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (ours.cispo_eps_low, ours.cispo_eps_high)
    rows = rundir.read_jsonl(run / rundir.METRICS)
    train = [r for r in rows if "actor/pg_loss" in r]
    assert [r["step"] for r in train] == [1, 2]
    # no DAPO fix: GRPO's sample-level mean, no group filter (every rollout trained), no overlong shaping
    assert actor.loss_agg_mode == "seq-mean-token-mean"
    assert not verl_cfg.algorithm.filter_groups.enable
    assert not any("training/filter_groups/evicted_samples" in r for r in train)
    assert all(r["dynamic_sampling/rollouts_per_trained"] == 1 for r in train)
    assert not any("/overlong_reward/" in k for r in rows for k in r)
    assert FILTERED_LINE not in (run / "verl.log").read_text() + logs
