"""The local one-node SLURM cluster of ``.ci/slurm`` (``.ci/slurm_cluster.py``).

Without root or SLURM: the config files it writes (ports, GPUs, the node's size), the pid check against
/proc (a recycled pid or a zombie is not a live daemon), ``down --purge`` refusing a folder holding what ``up``
did not create, and the command line's errors.

Against the cluster itself (started here with ``bash .ci/slurm up`` and left up for the other modules; these
skip, naming what is missing, where it cannot start: SLURM's packages not installed, ``bash .ci/slurm install``
as root; not root): a job runs and accounting records it, the fake GPUs (GRES ``gpu:8``, symlinks to /dev/null)
let ``sbatch --test-only`` check a placement, and a requeued job runs again soon (``cred_expire=10``,
``sched_interval=2``)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import ROOT, slurm_manager

slurm = slurm_manager()


def test_the_configs_carry_the_ports_the_gpus_and_the_node_given():
    cluster = slurm.Cluster("/scratch/s", port=7000, gpus=2, node="n1")
    conf = cluster.configs(cpus=4, mem_mb=1000)
    lines = conf["slurm.conf"].splitlines()
    for line in ("ClusterName=dapo", "SlurmctldHost=n1(127.0.0.1)", "SlurmctldPort=7000", "SlurmdPort=7001",
                 "AccountingStoragePort=7002", "AccountingStoragePass=/scratch/s/munge/munge.socket.2",
                 "AuthInfo=socket=/scratch/s/munge/munge.socket.2,cred_expire=10",
                 "SchedulerParameters=sched_interval=2,bf_interval=5", "StateSaveLocation=/scratch/s/state",
                 "NodeName=n1 NodeAddr=127.0.0.1 NodeHostname=n1 CPUs=4 RealMemory=1000 Gres=gpu:2 State=UNKNOWN",
                 "PartitionName=debug Nodes=n1 Default=YES MaxTime=INFINITE State=UP"):
        assert line in lines
    assert conf["gres.conf"] == "AutoDetect=off\nNodeName=n1 Name=gpu File=/scratch/s/dev/gpu[0-1]\n"
    dbd = conf["slurmdbd.conf"].splitlines()
    assert "DbdPort=7002" in dbd and "PidFile=/scratch/s/run/slurmdbd.pid" in dbd
    assert all("=" in ln for ln in lines + dbd if not ln.startswith("#")), "a line that is no setting"
    no_gpus = slurm.Cluster("/scratch/s", port=7000, gpus=0, node="n1").configs(cpus=4, mem_mb=1000)
    assert "Gres=" not in no_gpus["slurm.conf"] and no_gpus["gres.conf"] == "AutoDetect=off\n"


def test_write_configs_writes_etc_and_the_fake_gpus(tmp_path, monkeypatch):
    monkeypatch.setenv("DAPO_SLURM_PORT", "7100")
    monkeypatch.setenv("DAPO_SLURM_GPUS", "3")
    cluster = slurm.Cluster(tmp_path)
    cluster.write_configs()
    cluster.write_configs(cpus=2, mem_mb=512)  # rewritten in place, the links replaced
    etc = {p.name: p for p in (tmp_path / "etc").iterdir()}
    assert sorted(etc) == ["gres.conf", "slurm.conf", "slurmdbd.conf"]  # no .tmp left
    assert etc["slurmdbd.conf"].stat().st_mode & 0o777 == 0o600
    assert etc["slurm.conf"].read_text() == cluster.configs(cpus=2, mem_mb=512)["slurm.conf"]
    assert "SlurmctldPort=7100" in etc["slurm.conf"].read_text().splitlines()
    assert sorted(p.name for p in (tmp_path / "dev").iterdir()) == ["gpu0", "gpu1", "gpu2"]
    assert all(os.readlink(p) == "/dev/null" for p in (tmp_path / "dev").iterdir())


def test_a_live_pid_is_the_named_process_running(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    assert slurm.live_pid(run, "sleep") is None  # no pid file
    (run / "sleep.pid").write_text("")
    assert slurm.live_pid(run, "sleep") is None  # an empty one
    child = subprocess.Popen(["sleep", "30"])
    try:
        (run / "sleep.pid").write_text(f"{child.pid}\n")
        (run / "slurmd.pid").write_text(f"{child.pid}\n")
        # (until the child has exec'd sleep, it is a copy of this python)
        assert slurm.wait_for(lambda: slurm.live_pid(run, "sleep") == child.pid, 10, every=0.05)
        assert slurm.live_pid(run, "slurmd") is None  # a recycled pid: another program now
        child.send_signal(signal.SIGKILL)
        assert slurm.wait_for(lambda: not slurm.running(child.pid), 10, every=0.05)
        assert slurm.live_pid(run, "sleep") is None  # dead, not yet reaped: a zombie
    finally:
        child.kill()
        child.wait()
    assert slurm.live_pid(run, "sleep") is None  # gone


def test_mariadbd_may_call_itself_mysqld_in_a_fake_proc(tmp_path):
    proc, run = tmp_path / "proc", tmp_path / "run"
    for pid, comm, state in ((41, "mysqld", "S"), (42, "mariadbd", "R"), (43, "mariadbd", "Z"), (44, "bash", "S")):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "comm").write_text(f"{comm}\n")
        (proc / str(pid) / "stat").write_text(f"{pid} ({comm}) {state} 1 {pid} {pid} 0\n")
    run.mkdir()
    found = {}
    for pid in (41, 42, 43, 44, 45):
        (run / "mariadbd.pid").write_text(str(pid))
        found[pid] = slurm.live_pid(run, "mariadbd", proc)
    assert found == {41: 41, 42: 42, 43: None, 44: None, 45: None}


def test_the_job_processes_of_a_cluster_in_a_fake_proc(tmp_path):
    proc = tmp_path / "proc"
    tree = {10: (1, "slurmstepd", "/x/etc/slurm.conf"), 11: (10, "bash", ""), 12: (11, "sleep", ""),
            13: (1, "slurmstepd", "/other/etc/slurm.conf"), 14: (13, "bash", "/x/etc/slurm.conf")}
    for pid, (ppid, comm, conf) in tree.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "comm").write_text(f"{comm}\n")
        (proc / str(pid) / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0\n")
        (proc / str(pid) / "environ").write_bytes(f"HOME=/root\0SLURM_CONF={conf}\0".encode())
    # its slurmstepd and all under it, not another cluster's slurmstepd nor what runs under that
    assert sorted(slurm.job_processes(Path("/x/etc/slurm.conf"), proc)) == [10, 11, 12]
    assert sorted(slurm.job_processes(Path("/other/etc/slurm.conf"), proc)) == [13, 14]
    assert slurm.job_processes(Path("/y/etc/slurm.conf"), proc) == []


def test_purge_refuses_a_folder_holding_what_up_did_not_create(tmp_path):
    folder = tmp_path / "slurm"
    for sub in slurm.SUBDIRS:
        (folder / sub).mkdir(parents=True)
    assert slurm.foreign_entries(folder) == [] and slurm.foreign_entries(tmp_path / "absent") == []
    (folder / "notes.txt").write_text("mine")
    (folder / ".hidden").mkdir()
    assert slurm.foreign_entries(folder) == [".hidden", "notes.txt"]
    with pytest.raises(slurm.Fail, match=r"not purging .*: it holds \.hidden, notes\.txt, which `up` did not create"):
        slurm.Cluster(folder).down(purge=True)
    assert (folder / "notes.txt").read_text() == "mine" and not (tmp_path / "slurm.lock").exists()


def test_the_command_line_names_what_is_wrong(tmp_path):
    env = {**os.environ, "DAPO_SLURM_DIR": str(tmp_path / "c")}

    def cli(*args):
        done = subprocess.run(["bash", str(ROOT / ".ci" / "slurm"), *args], env=env, capture_output=True, text=True)
        return done.returncode, done.stdout, done.stderr

    assert cli() == (1, "", "slurm: error: usage: bash .ci/slurm install|up|env|status|down [--purge]   "
                            "(got: nothing)\n")
    assert cli("down", "--all")[::2] == (1, "slurm: error: unknown option to down: --all (only --purge)\n")
    conf = tmp_path / "c" / "etc" / "slurm.conf"
    assert cli("env") == (1, "", f"slurm: error: no cluster config at {conf} (run `bash .ci/slurm up` first)\n")
    assert cli("status") == (1, f"slurm: not up: no config at {conf} (run `bash .ci/slurm up`)\n", "")
    conf.parent.mkdir(parents=True)
    conf.write_text("")
    assert cli("env") == (0, f"export SLURM_CONF={conf}\n", "")
    assert cli("status")[:2] == (1, "slurm: not up: not running: munged mariadbd slurmdbd slurmctld slurmd "
                                    f"(no live pid in {tmp_path / 'c'}/run/; `bash .ci/slurm up` starts them)\n")
    env["DAPO_SLURM_DIR"] = "/tmp/" + "x" * 100
    assert "is too long: munge's socket path" in cli("up")[2]


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


# Waits for the scheduler's and slurmdbd's events: deadlines far above what they take on an idle machine (a few
# seconds), so that a loaded CI machine (load 6-16 seen) fails only a cluster that is really stuck; how long they take
# is not a guarantee these tests assert.
LOAD_MARGIN = 4


def _wait(what: str, check, timeout: float, every: float = 0.3):
    timeout *= LOAD_MARGIN
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_fake_gpus_let_sbatch_test_only_check_a_placement(cluster):
    fits = _run("sbatch", "--test-only", "--gpus-per-node=2", "--wrap", "true", check=False)
    assert fits.returncode == 0 and "to start at" in fits.stderr, fits.stderr
    node = _run("scontrol", "-o", "show", "node").stdout
    assert re.search(r"\bGres=gpu:8\b", node), node
    too_many = _run("sbatch", "--test-only", "--gpus-per-node=64", "--wrap", "true", check=False)
    assert too_many.returncode != 0, too_many.stderr
    assert "Requested node configuration is not available" in too_many.stderr, too_many.stderr


@pytest.mark.slow
def test_a_requeued_job_runs_again_soon_and_scancel_is_recorded(cluster, tmp_path):
    out = tmp_path / "requeue.out"
    jid = _sbatch("-o", str(out), "--open-mode=append",
                  "--wrap", 'echo "run ${SLURM_RESTART_COUNT:-0}"; sleep 120')
    _wait("the first run to start", lambda: out.exists() and "run 0" in out.read_text(), 30)
    _run("scontrol", "requeue", jid)  # no --requeue on sbatch: JobRequeue=1 makes batch jobs requeueable
    _wait("the requeued job to run again", lambda: "run 1" in out.read_text(), 45)  # by itself, no resubmission
    info = _job(jid)
    assert info["JobState"] == "RUNNING" and int(info["Restarts"]) == 1, info
    assert re.findall(r"^run \d+$", out.read_text(), re.M) == ["run 0", "run 1"], out.read_text()
    _run("scancel", jid)
    _wait(f"job {jid} to be cancelled", lambda: _job(jid)["JobState"] == "CANCELLED", 20)
    state = _wait("sacct to record the cancel", lambda: _sacct(jid)[0].startswith("CANCELLED") and _sacct(jid), 20)
    assert state[0].startswith("CANCELLED"), state
