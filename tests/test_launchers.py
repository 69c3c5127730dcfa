"""Hydra launchers (conf/hydra/launcher/): SLURM settings reach sbatch; the local GPU pool serialises.

- ``hydra/launcher=slurm`` composes onto the plugin's ``submitit_slurm`` schema, and the
  sbatch script submitit would write carries partition, account, GPUs, time, memory,
  the USR2 warning signal and ``--requeue`` (built here without a cluster).
- ``hydra/launcher=local_gpus`` runs each job in a slot held with flock: never more
  jobs at once than slots, never two on one slot.
- The kill-and-resume test (slow) needs the training loop: it skips until
  ``dapo_exp.train.train`` writes checkpoints.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir

from dapo_exp.hydra_setup import dry_run_sweep, register_resolvers

REPO = Path(__file__).resolve().parents[1]
CONF = str(REPO / "conf")

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install hydra-submitit-launcher (.[slurm])")


def launcher_cfg(overrides, config_dir=CONF):
    register_resolvers()
    with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
        return compose("config", overrides=overrides, return_hydra_config=True)


def sbatch_text(launcher_node, folder, monkeypatch) -> str:
    """The sbatch script submitit would submit, from the executor our launcher builds (its settings:
    ``executor_settings``, checked against the plugin's own launch below), submitit's files in ``folder``."""
    import submitit
    from hydra.utils import instantiate
    from submitit.slurm.slurm import SlurmExecutor

    from hydra_plugins.dapo_exp_launcher.slurm_launcher import executor_settings

    monkeypatch.setattr(SlurmExecutor, "affinity", classmethod(lambda cls: 2))  # pretend srun exists
    init, update = executor_settings(instantiate(launcher_node).params)
    executor = submitit.AutoExecutor(cluster="slurm", **{**init, "folder": folder})
    executor.update_parameters(**update)
    return executor._executor._make_submission_file_text("python -u -m submitit.core._submit", "uid")


# --------------------------------------------------------------------------- #
# SLURM                                                                         #
# --------------------------------------------------------------------------- #
def test_slurm_launcher_composes_with_our_settings():
    cfg = launcher_cfg(["hydra/launcher=slurm", "fixes=grpo"])
    la = cfg.hydra.launcher
    assert la._target_ == "hydra_plugins.dapo_exp_launcher.slurm_launcher.SlurmLauncher"
    assert la.gpus_per_node == 1 and la.cpus_per_task == 8 and la.mem_gb == 64
    assert la.timeout_min == 1440 and la.signal_delay_s == 300
    assert la.max_num_timeout > 0, "requeue after a timeout needs max_num_timeout > 0"
    assert la.additional_parameters.requeue is True
    assert "partition" in la and "account" in la
    assert cfg.hydra.runtime.choices["hydra/launcher"] == "slurm"


def test_slurm_sbatch_script_carries_the_settings(tmp_path, monkeypatch):
    cfg = launcher_cfg(
        [
            "hydra/launcher=slurm",
            "hydra.launcher.partition=gpu",
            "hydra.launcher.account=dapo",
            "hydra.launcher.timeout_min=720",
            "hydra.launcher.setup=[module load cuda]",
        ]
    )
    text = sbatch_text(cfg.hydra.launcher, tmp_path, monkeypatch)
    for line in [
        "#SBATCH --partition=gpu",
        "#SBATCH --account=dapo",
        "#SBATCH --gpus-per-node=1",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --mem=64GB",
        "#SBATCH --time=720",
        "#SBATCH --signal=USR2@300",
        "#SBATCH --requeue",
        "module load cuda",
    ]:
        assert line in text, f"{line!r} missing from:\n{text}"


def test_slurm_checkpoint_resubmits_the_same_job():
    """On USR2 submitit calls the callable's checkpoint(): the launcher resubmits itself, same arguments."""
    from hydra.utils import instantiate

    launcher = instantiate(launcher_cfg(["hydra/launcher=slurm"]).hydra.launcher)
    delayed = launcher.checkpoint(["seed=1"], "hydra.sweep.dir", 3, "job_id_for_3", {})
    assert delayed.function is launcher and delayed.args == (["seed=1"], "hydra.sweep.dir", 3, "job_id_for_3", {})


class _FakeJob:
    def __init__(self, value: Any = None, lost: bool = False) -> None:
        self.value, self.lost, self.job_id, self.state = value, lost, "7_1", "CANCELLED"

    def results(self) -> list[Any]:
        from submitit.core.utils import UncompletedJobError

        if self.lost:
            raise UncompletedJobError("Job 7_1 (task: 0) with path /x\nhas not produced any output (state: CANCELLED)")
        return [self.value]


class _FakeExecutor:
    """Stands in for ``submitit.AutoExecutor``: records how it was built, its parameters and the calls it was
    given; each job's result is its index (``lost``: the indices whose job ends without a result)."""

    made: list[_FakeExecutor] = []
    lost: set[int] = set()

    def __init__(self, cluster: str, **init: Any) -> None:
        self.cluster, self.init, self.update, self.calls = cluster, init, None, None
        _FakeExecutor.made.append(self)

    def update_parameters(self, **update: Any) -> None:
        self.update = update

    def map_array(self, fn: Any, *iterables: Any) -> list[_FakeJob]:
        self.fn, self.calls = fn, list(zip(*iterables))
        return [_FakeJob(call[2], lost=call[2] in self.lost) for call in self.calls]


def _launchers(tmp_path, overrides):
    """Ours and the plugin's ``SlurmLauncher`` for the same ``hydra.launcher`` settings, set up for one sweep."""
    from hydra.utils import instantiate

    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as PluginLauncher

    cfg = launcher_cfg([f"hydra.sweep.dir={tmp_path / 'sweep'}", *overrides])
    ours = instantiate(cfg.hydra.launcher)
    theirs = PluginLauncher(**ours.params)
    for launcher in (ours, theirs):
        launcher.setup(hydra_context=None, task_function=lambda c: None, config=cfg)
    return ours, theirs


@pytest.mark.parametrize("overrides", [
    ["hydra/launcher=slurm"],
    ["hydra/launcher=slurm_local", "hydra.launcher.array_parallelism=3"],
    ["hydra/launcher=slurm", "hydra.launcher.partition=gpu", "hydra.launcher.account=dapo",
     "hydra.launcher.max_num_timeout=7", "hydra.launcher.setup=[module load cuda]",
     "+hydra.launcher.additional_parameters.mail-type=END"],
])
def test_the_launcher_submits_what_the_plugin_would(tmp_path, monkeypatch, overrides):
    """Our launch builds submitit's executor and submits the array job itself: the executor's settings, its
    parameters and the jobs' arguments are the plugin's launch's for the same settings, and each job's result
    comes back in order."""
    import submitit

    monkeypatch.setattr(submitit, "AutoExecutor", _FakeExecutor)
    monkeypatch.setattr(_FakeExecutor, "made", [])
    ours, theirs = _launchers(tmp_path, overrides)
    jobs = [["fixes=grpo", "seed=0"], ["fixes=clip", "seed=0"], ["fixes=clip", "seed=1"]]
    assert list(ours.launch(jobs, initial_job_idx=4)) == [4, 5, 6]
    assert list(theirs.launch(jobs, initial_job_idx=4)) == [4, 5, 6]
    mine, plugin = _FakeExecutor.made
    assert (mine.cluster, mine.init, mine.update) == (plugin.cluster, plugin.init, plugin.update)
    assert mine.update and "slurm_max_num_timeout" in mine.init and "folder" in mine.init
    assert mine.fn is ours and plugin.fn is theirs
    # the jobs' arguments; the last, Hydra's singletons' state, a fresh copy per job in both
    assert [c[:4] for c in mine.calls] == [c[:4] for c in plugin.calls] == [
        (job, "hydra.sweep.dir", i, f"job_id_for_{i}") for i, job in enumerate(jobs, start=4)]
    assert [sorted(c[4]) for c in mine.calls] == [sorted(c[4]) for c in plugin.calls]
    assert (tmp_path / "sweep").is_dir()


def test_a_lost_job_is_named_and_the_others_results_come_back(tmp_path, monkeypatch):
    """A job that ends without a result (cancelled) is an empty completed return, noted as lost with its
    SLURM job and state; the next job's result still comes back (the plugin's launch raised at the first)."""
    import submitit

    from dapo_exp import rundir

    noted: list[tuple[str, str]] = []
    monkeypatch.setattr(submitit, "AutoExecutor", _FakeExecutor)
    monkeypatch.setattr(_FakeExecutor, "lost", {0})
    monkeypatch.setattr(rundir, "note_lost_job", lambda where, why: noted.append((where, why)))
    monkeypatch.setattr(_FakeExecutor, "made", [])
    ours, _ = _launchers(tmp_path, ["hydra/launcher=slurm"])
    lost, kept = ours.launch([["fixes=grpo"], ["fixes=clip"]], initial_job_idx=0)
    assert lost.return_value is None and lost.overrides == ["fixes=grpo"] and kept == 1
    assert len(noted) == 1 and "SLURM job 7_1 ended CANCELLED without a result" in noted[0][1]


def test_a_job_refused_in_its_slurm_process_is_noted_in_the_command(tmp_path, monkeypatch):
    """run.py's job function, refused in a SLURM job (another config in its directory), returns
    rundir.RefusedJob: the launcher notes it in the command under way, for run.py's closing line."""
    import submitit
    from hydra.core.utils import JobReturn, JobStatus

    from dapo_exp import rundir

    class _Refusing(_FakeExecutor):
        def map_array(self, fn: Any, *iterables: Any) -> list[_FakeJob]:
            super().map_array(fn, *iterables)
            returns = [JobReturn(overrides=call[0], status=JobStatus.COMPLETED,
                                 _return_value=rundir.RefusedJob(f"/runs/{i}") if i == 1 else 0.5)
                       for i, call in enumerate(self.calls)]
            return [_FakeJob(r) for r in returns]

    monkeypatch.setattr(submitit, "AutoExecutor", _Refusing)
    monkeypatch.setattr(_FakeExecutor, "made", [])
    ours, _ = _launchers(tmp_path, ["hydra/launcher=slurm"])
    with rundir.command_state() as state:
        returns = ours.launch([["fixes=grpo"], ["fixes=clip"]], initial_job_idx=0)
    assert [r.return_value for r in returns] == [0.5, rundir.RefusedJob("/runs/1")]
    assert state.refused == ["/runs/1"] and state.lost == []


def test_dry_run_prints_the_launcher_of_every_job():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert dry_run_sweep(["-m", "--cfg", "hydra", "hydra/launcher=slurm", "seed=0,1"], CONF)
    text = out.getvalue()
    assert "[dry run] 2 jobs" in text and text.count("SlurmLauncher") == 2 and "signal_delay_s: 300" in text


def test_site_file_in_conf_local_selects_and_configures_slurm(tmp_path):
    """The README recipe: a git-ignored conf/local/<site>.yaml picks the launcher and the site values."""
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    (conf / "local").mkdir(exist_ok=True)
    (conf / "local" / "site.yaml").write_text(
        "# @package _global_\n"
        "defaults:\n  - override /hydra/launcher: slurm\n"
        "hydra:\n  launcher:\n    partition: a100\n    account: rl\n"
    )
    la = launcher_cfg(["local=site"], config_dir=str(conf)).hydra.launcher
    assert la._target_.endswith("SlurmLauncher") and la.partition == "a100" and la.account == "rl"
    assert la.signal_delay_s == 300


# --------------------------------------------------------------------------- #
# Local: one job per slot (GPU)                                                 #
# --------------------------------------------------------------------------- #
def test_local_gpus_launcher_composes():
    la = launcher_cfg(["hydra/launcher=local_gpus"]).hydra.launcher
    assert la._target_.endswith("submitit_launcher.LocalLauncher")
    assert len(la.setup) == 1 and "flock -n 9" in la.setup[0] and "CUDA_VISIBLE_DEVICES" in la.setup[0]


@pytest.mark.skipif(shutil.which("flock") is None, reason="needs flock(1) (util-linux)")
def test_local_slots_never_run_two_jobs_on_one_slot(tmp_path):
    setup = launcher_cfg(["hydra/launcher=local_gpus"]).hydra.launcher.setup[0]
    log = tmp_path / "log"
    job = f'echo "start $s $(date +%s.%N)" >> {log}; sleep 1.5; echo "end $s $(date +%s.%N)" >> {log}'
    env = dict(os.environ, DAPO_SLOTS="p q", DAPO_SLOT_DIR=str(tmp_path / "locks"))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    # submitit runs `sh -c "<setup> && <job>"`
    procs = [subprocess.Popen(["sh", "-c", f"{setup} && {job}"], env=env, stdout=subprocess.DEVNULL) for _ in range(3)]
    t0 = time.time()
    assert all(p.wait(timeout=60) == 0 for p in procs)
    events = sorted((float(t), kind, slot) for kind, slot, t in (line.split() for line in log.read_text().splitlines()))
    assert len(events) == 6 and time.time() - t0 >= 3.0, "the third job must have waited for a slot"
    running: set[str] = set()
    for _, kind, slot in events:
        if kind == "start":
            assert slot not in running, f"two jobs on slot {slot}"
            running.add(slot)
            assert len(running) <= 2
        else:
            running.discard(slot)
    assert {slot for _, _, slot in events} <= {"p", "q"}


# --------------------------------------------------------------------------- #
# Kill a local job mid-run, run the same command again: it resumes              #
# --------------------------------------------------------------------------- #
def _final_metrics(sweep: Path) -> dict[str, list[dict]]:
    """Per job: its metrics.jsonl without the wall-clock keys (which differ run to run)."""
    out = {}
    for m in sorted(sweep.glob("*/metrics.jsonl")):
        rows = [json.loads(x) for x in m.read_text().splitlines()]
        out[m.parent.name] = [{k: v for k, v in r.items() if not k.startswith(("timing_s/", "perf/"))} for r in rows]
    return out


# the sweep's two jobs (fixes=grpo,clip) and the overrides they share: 4 steps, a checkpoint after each (the kill
# lands at the first one, step 1 of 4, leaving 3 to resume), an evaluation at steps 2 and 4 (one in the resumed
# part), the final evaluation on 2 samples per problem (its 8 x 8 default was most of a job's compute)
KILLED_JOBS = ("grpo", "clip")
KILLED_SHARED = ["seed=0", "train.steps=4", "checkpoint.every=1", "train.prompts_per_step=4", "rollout.n=4",
                 "train.mini_batch_size=16", "train.micro_batch_size=16", "eval.every=2", "eval.k=1",
                 "eval.final_samples=2", "task.arith_n_eval=8"]


@pytest.mark.slow
def test_killed_local_job_resumes_from_its_checkpoint(tmp_path):
    """submitit_local (local_gpus launcher, two CPU slots): a two-job sweep SIGKILLed mid-run and launched
    again finishes from its checkpoints with the metrics of each job trained uninterrupted.

    The uninterrupted reference is each job trained here, in this process (train() on the job's config,
    as tests/test_train.py's kill-and-resume tests do), not a third sweep: a launch of its own cost a launcher
    and two job processes (their imports, ~7 CPU-s each) for metrics that are the same by construction."""
    psutil = pytest.importorskip("psutil")
    from dapo_exp import checkpoint
    from dapo_exp.train import train

    def cmd(sweep: Path) -> list[str]:
        return [
            sys.executable, str(REPO / "run.py"), "-m", "hydra/launcher=local_gpus", "logger=none",
            f"fixes={','.join(KILLED_JOBS)}", *KILLED_SHARED, f"hydra.sweep.dir={sweep}",
            "~hydra.callbacks.analysis",  # no table nor figures at the end (``hydra.callbacks={}`` left them on)
        ]

    env = dict(os.environ, DAPO_SLOT_DIR=str(tmp_path / "locks"), DAPO_SLOTS="a b", OMP_NUM_THREADS="1")
    sweep = tmp_path / "killed"
    first = subprocess.Popen(cmd(sweep), cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, ckpts = time.time() + 300, []
    while time.time() < deadline and not ckpts and first.poll() is None:
        ckpts = [c for d in sweep.glob("*/checkpoints") if (c := checkpoint.latest(d)) is not None]
        time.sleep(0.05)
    # a hard crash: SIGKILL the launcher and every process it started (submitit's controller, the jobs)
    tree = psutil.Process(first.pid).children(recursive=True)
    first.kill()
    for proc in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    first.wait()
    assert ckpts, "no checkpoint appeared before the deadline (or the first run ended first)"
    finished = [p for p in sweep.glob("*/summary.json") if json.loads(p.read_text()).get("status") == "finished"]
    assert len(finished) < 2, "killed too late: both jobs had finished"
    killed_at = {c.parent.parent.name: int(c.name.split("_")[1]) for c in ckpts}
    assert all(step < 4 for step in killed_at.values())

    done = subprocess.run(cmd(sweep), cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    logs = "\n".join(p.read_text(errors="replace") for ext in ("*.log", "*.out") for p in sweep.rglob(ext))
    assert "resum" in logs.lower(), "the second launch should report resuming from the checkpoint"

    got = _final_metrics(sweep)
    assert len(got) == 2 and all(rows[-1]["step"] == 4 for rows in got.values())
    for fix in KILLED_JOBS:
        (job,) = [name for name in got if f"fixes={fix}," in f"{name},"]
        register_resolvers()
        with initialize_config_dir(config_dir=CONF, version_base="1.3"):
            cfg = compose("config", overrides=["logger=none", f"fixes={fix}", *KILLED_SHARED,
                                               f"out_dir={tmp_path / 'whole' / fix}"])
        train(cfg)
        assert got[job] == _final_metrics(tmp_path / "whole")[fix], f"{job}: resumed metrics differ"


def test_cfg_job_dry_run_of_a_slurm_sweep_shows_the_slurm_settings():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "run.py", "-m", "hydra/launcher=slurm", "hydra.launcher.partition=gpu",
         "hydra.launcher.account=myproj", "fixes=grpo,full", "seed=0", "--cfg", "job"],
        cwd=root, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "[dry run] 2 jobs" in out.stdout
    for line in ("partition: gpu", "account: myproj", "gpus_per_node: 1", "timeout_min: 1440", "SlurmLauncher"):
        assert line in out.stdout, line


def test_job_directory_names_carry_no_hydra_escapes():
    """A sweep's job directory is named from Hydra's escaped overrides (``00\\:30\\:00``); sbatch strips the
    backslashes from the #SBATCH --chdir / --output lines that name it, and the job then fails to start."""
    from dapo_exp.hydra_setup import run_dirname

    assert run_dirname(r"backend.slurm.time=00\:30\:00,fixes=grpo,hydra/launcher=slurm") == \
        "backend.slurm.time=00:30:00,fixes=grpo,hydra~launcher=slurm"
    assert run_dirname("") == "default"
