"""The local one-node SLURM cluster of ``.ci/slurm`` itself (started here with ``bash .ci/slurm up`` and
left up for the other modules): a job runs and accounting records it, the fake GPUs (GRES ``gpu:8``,
symlinks to /dev/null) let ``sbatch --test-only`` check a placement, and a requeued job runs again soon
(``cred_expire=10``, ``sched_interval=2``). The module skips, naming what is missing, where the cluster
cannot start (SLURM's packages not installed: ``bash .ci/slurm install`` as root; not root)."""

from __future__ import annotations

import re
import subprocess
import time

import pytest

pytestmark = pytest.mark.slow

@pytest.fixture(scope="module")
def cluster(slurm_cluster):
    """``bash .ci/slurm up`` (conftest's ``slurm_cluster``: skips, naming what is missing, or fails, saying
    why), SLURM_CONF set in os.environ for this module."""
    with pytest.MonkeyPatch.context() as mp:
        for key, value in slurm_cluster.items():
            mp.setenv(key, value)
        yield slurm_cluster


def _run(*cmd: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {done.returncode}: {done.stdout}{done.stderr}")
    return done


def _sbatch(*args: str) -> str:
    out = _run("sbatch", "--parsable", *args).stdout.strip()
    assert re.fullmatch(r"\d+(;\S+)?", out), out
    return out.split(";")[0]


def _job(jid: str) -> dict[str, str]:
    """``scontrol show job`` as a dict (JobState, Restarts, ExitCode, ...)."""
    out = _run("scontrol", "-o", "show", "job", jid).stdout
    return dict(field.split("=", 1) for field in out.split() if "=" in field)


def _wait(what: str, check, timeout: float, every: float = 0.3):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def _sacct(jid: str) -> tuple[str, str]:
    """(State, ExitCode) of the job's allocation as slurmdbd recorded it; ("", "") while not recorded."""
    out = _run("sacct", "-j", jid, "-X", "-n", "-P", "-o", "State,ExitCode").stdout.strip()
    return tuple(out.splitlines()[0].split("|")) if out else ("", "")


FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED")


def test_a_job_runs_and_accounting_records_its_state_and_exit_code(cluster, tmp_path):
    ok, bad = tmp_path / "ok.out", tmp_path / "bad.out"
    good = _sbatch("-o", str(ok), "--wrap", "echo hello from $SLURM_JOB_ID")
    failing = _sbatch("-o", str(bad), "--wrap", "echo about to fail; exit 3")
    for jid in (good, failing):
        _wait(f"job {jid} to end", lambda jid=jid: _job(jid)["JobState"] in FINAL, 30)
    assert ok.read_text() == f"hello from {good}\n"
    assert bad.read_text() == "about to fail\n"
    assert _job(good)["JobState"] == "COMPLETED" and _job(failing)["JobState"] == "FAILED"
    # accounting (slurmdbd) is written asynchronously: wait until it has the final states
    assert _wait("sacct to record the job", lambda: _sacct(good)[0] in FINAL and _sacct(good), 20) == (
        "COMPLETED", "0:0")
    assert _wait("sacct to record the job", lambda: _sacct(failing)[0] in FINAL and _sacct(failing), 20) == (
        "FAILED", "3:0")


def test_fake_gpus_let_sbatch_test_only_check_a_placement(cluster):
    fits = _run("sbatch", "--test-only", "--gpus-per-node=2", "--wrap", "true", check=False)
    assert fits.returncode == 0 and "to start at" in fits.stderr, fits.stderr
    node = _run("scontrol", "-o", "show", "node").stdout
    assert re.search(r"\bGres=gpu:8\b", node), node
    too_many = _run("sbatch", "--test-only", "--gpus-per-node=64", "--wrap", "true", check=False)
    assert too_many.returncode != 0, too_many.stderr
    assert "Requested node configuration is not available" in too_many.stderr, too_many.stderr


def test_a_requeued_job_runs_again_soon_and_scancel_is_recorded(cluster, tmp_path):
    out = tmp_path / "requeue.out"
    jid = _sbatch("-o", str(out), "--open-mode=append",
                  "--wrap", 'echo "run ${SLURM_RESTART_COUNT:-0}"; sleep 120')
    _wait("the first run to start", lambda: out.exists() and "run 0" in out.read_text(), 30)
    _run("scontrol", "requeue", jid)  # no --requeue on sbatch: JobRequeue=1 makes batch jobs requeueable
    started = time.monotonic()
    _wait("the requeued job to run again", lambda: "run 1" in out.read_text(), 45)
    again = time.monotonic() - started
    info = _job(jid)
    assert info["JobState"] == "RUNNING" and int(info["Restarts"]) == 1, info
    assert re.findall(r"^run \d+$", out.read_text(), re.M) == ["run 0", "run 1"], out.read_text()
    assert again < 40, f"the requeued job waited {again:.0f} s to run again"
    _run("scancel", jid)
    _wait(f"job {jid} to be cancelled", lambda: _job(jid)["JobState"] == "CANCELLED", 20)
    state = _wait("sacct to record the cancel", lambda: _sacct(jid)[0].startswith("CANCELLED") and _sacct(jid), 20)
    assert state[0].startswith("CANCELLED"), state
