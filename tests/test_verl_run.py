"""verl's trainer, executed: a ``backend=verl train.device=cpu`` sweep through ``run.py`` on this CPU.

One sweep of the default toy on verl 0.9.1 (the paper's last row ``paper_6_dapo``, every DAPO fix on; two
steps, small sizes), as a user types it, killed with SIGKILL after its step-1 checkpoint and run again: the
job resumes from verl's checkpoint and the sweep prints its analysis table; run once more (in this process,
the same ``train()`` the sweep's job calls), the finished run is skipped without launching verl. Then each
DAPO fix is shown in effect from verl's own output (its metrics, the config it ran with, its command, its
workers' log): a test per fix, each an absolute check that fails when that fix's translation is removed
(verl's own defaults, in ``verl/trainer/config``, are GRPO's: a 0.2/0.2 range, no group filter, no
overlong buffer, verl's single-turn agent loop; its default ``token-mean`` is why the token-level test
reads the command). Two verl launches: the killed attempt and the resume.

The rows without a fix, as verl runs them, are the SLURM job's (``fixes=cispo``,
tests/test_slurm_sweeps.py: verl's own CISPO loss, a sample-level mean, no group filter, no overlong
shaping) and, on the translation, Table 1's ladder composed against verl's config (tests/test_verl_backend.py).

Needs ``.venv-verl`` with vLLM's CPU build (``bash .ci/install-verl``; ``.ci/test`` installs it): skipped,
saying so, without it. About 6-7 minutes on a 2-core machine (its two verl launches).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import NO_FIGURES, ray_to_itself
from omegaconf import OmegaConf

from dapo_exp import rundir

ROOT = Path(__file__).resolve().parents[1]
VERL_PYTHON = ROOT / ".venv-verl" / "bin" / "python"
DAPO = "paper_6_dapo"  # every fix on: the one job of the sweep (the rows without them: see the docstring)
# the toy at a size for CI: 8 prompts x 4 per step, a 32-token cap (long answers are truncated and the last 8
# tokens before the cap are punished), a checkpoint every step, a 16-problem held-out set, 2 samples each
SWEEP = ["backend=verl", "train.device=cpu", f"fixes={DAPO}", "train.steps=2", "checkpoint.every=1",
         "train.prompts_per_step=8", "rollout.n=4", "train.mini_batch_size=16", "train.micro_batch_size=16",
         "rollout.max_response_len=32", "algo.overlong_cache_len=8", "task.arith_n_eval=16", "eval.k=2",
         "logger=none", "sweep=verl_cpu", "seed=0", NO_FIGURES]  # the table is asserted, not the figures

pytestmark = pytest.mark.slow


def _verl_with_vllm() -> str | None:
    """Why verl's CPU mode cannot run here, or None (after the install .ci/test runs beside the tests, if any)."""
    from helpers import wait_for_verl_install

    wait_for_verl_install()
    if not VERL_PYTHON.exists():
        return f"{VERL_PYTHON} is missing: bash .ci/install-verl installs verl's environment"
    probe = subprocess.run([str(VERL_PYTHON), "-c", "import verl, vllm, transfer_queue"], capture_output=True)
    if probe.returncode != 0:
        return f"verl's environment lacks vLLM or TransferQueue ({probe.stderr.decode()[-200:]}): bash .ci/install-verl"
    return None


def _run_dir(cwd: Path, preset: str) -> Path:
    found = [p for p in (cwd / "multirun" / "verl_cpu").iterdir() if p.is_dir() and f"fixes={preset}" in p.name]
    assert len(found) == 1, found
    return found[0]


def _kill_verl_of(run: Path) -> None:
    """SIGKILL to the verl job of ``run`` (its process group: the trainer, its Ray)."""
    out = subprocess.run(["pgrep", "-f", f"verl.trainer.main_ppo.*{run}/checkpoints"], capture_output=True, text=True)
    for pid in out.stdout.split():
        try:
            os.killpg(os.getpgid(int(pid)), signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    if why := _verl_with_vllm():
        pytest.skip(why)
    with ray_to_itself():  # no other test's Ray cluster beside this one (helpers)
        return _killed_and_rerun(tmp_path_factory.mktemp("verl_sweep"))


def _killed_and_rerun(cwd: Path) -> dict:
    """The sweep, killed (SIGKILL) once its job has checkpointed step 1, and the same command again."""
    cmd = [sys.executable, str(ROOT / "run.py"), "-m", *SWEEP]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = open(cwd / "first_attempt.log", "w")  # a file: an undrained pipe would block the sweep when full
    first = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 900
    ckpt = None
    while time.monotonic() < deadline and first.poll() is None:
        runs = list((cwd / "multirun" / "verl_cpu").glob(f"*fixes={DAPO}*/checkpoints/global_step_1"))
        # verl saves step 1's checkpoint before it logs step 1's metrics: wait for both (a kill between the
        # two leaves a checkpoint whose metrics line was never written)
        if runs and (runs[0].parent / "latest_checkpointed_iteration.txt").exists() and any(
                r.get("step") == 1 and "training/global_step" in r.get("data", {})
                for r in rundir.read_jsonl(runs[0].parent.parent / "verl_metrics.jsonl")):
            ckpt = runs[0]
            break
        time.sleep(1)
    assert ckpt is not None, (first.poll(), (cwd / "first_attempt.log").read_text()[-3000:])
    killed = ckpt.parent.parent
    _kill_verl_of(killed)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(timeout=60)
    log.close()
    attempt1 = rundir.read_jsonl(killed / "verl_metrics.jsonl")
    second = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    return {"cwd": cwd, "killed": killed, "attempt1": attempt1, "second": second, "run": _run_dir(cwd, DAPO)}


def _rows(run: Path) -> list[dict]:
    return rundir.read_jsonl(run / rundir.METRICS)


def _train_rows(run: Path) -> list[dict]:
    return [r for r in _rows(run) if "eval/acc_avg" not in r and not any(k.startswith("val-") for k in r)]


def _eval_rows(run: Path) -> list[dict]:
    return [r for r in _rows(run) if any(k.startswith("val-") for k in r)]


def _verl_config(run: Path, name: str = "config.yaml"):
    """The config verl ran with, as its Hydra app wrote it (``<run>/outputs/<date>/<time>/.hydra/config.yaml``;
    ``overrides.yaml``: the command line's overrides it was given)."""
    found = sorted(run.glob(f"outputs/*/*/.hydra/{name}"))
    assert found, f"no verl {name} under {run}/outputs"
    return OmegaConf.load(found[-1])


# --------------------------------------------------------------------------- #
# the sweep: the job finishes after a kill, resumed, the table printed          #
# --------------------------------------------------------------------------- #
def test_the_verl_sweep_finishes_after_a_kill_and_prints_its_table(sweep):
    second, run = sweep["second"], sweep["run"]
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-4000:]
    summary = rundir.read_summary(run)
    assert summary["label"] in second.stdout and "[analysis]" in second.stdout, second.stdout[-3000:]
    assert summary["status"] == "finished" and summary["backend"] == "verl", summary
    assert [r["step"] for r in _train_rows(run)] == [1, 2]
    assert summary["steps_done"] == 2 and summary["final"]["step"] == 2 and "eval/acc_avg" in summary["final"]
    assert (run / "checkpoints" / "global_step_2" / "actor").is_dir()


def test_the_killed_job_resumed_from_verls_checkpoint_with_nothing_lost(sweep):
    run = sweep["killed"]
    assert run == sweep["run"]
    trained_first = [r["step"] for r in sweep["attempt1"] if "training/global_step" in r.get("data", {})]
    assert 1 in trained_first  # the first attempt trained step 1 (and checkpointed it) before the kill
    kept = sorted(run.glob("verl_metrics.*.jsonl"))
    assert kept, "the first attempt's verl metrics were not kept"
    resumed = [r["step"] for r in rundir.read_jsonl(run / "verl_metrics.jsonl") if "training/global_step" in r["data"]]
    assert resumed == [2], resumed  # step 2 only: resumed from global_step_1, nothing trained twice
    steps = [r["step"] for r in _train_rows(run)]
    assert steps == [1, 2]  # step 1's metrics (first attempt) and step 2's (second) both in metrics.jsonl


def test_a_finished_verl_run_is_skipped_when_run_again(sweep, monkeypatch, capsys):
    """The sweep's job once more, through the ``train()`` that ``run.py`` calls in each job: verl's launcher
    (dapo_exp/backends/verl_launch.launch, its own check, not the native runner's that tests/test_train.py's
    re-run covers) prints the skip and returns the finished summary without launching verl."""
    from dapo_exp.backends import verl_launch
    from dapo_exp.train import train

    run = sweep["run"]
    before = rundir.read_summary(run)

    def launched(*args, **kwargs):
        raise AssertionError("a finished verl run was launched again")

    monkeypatch.setattr(verl_launch, "_launch_locked", launched)
    again = train(OmegaConf.create(before["config"]))
    assert f"{run.resolve()} already finished; skipping" in capsys.readouterr().out
    assert again == before == rundir.read_summary(run)


# --------------------------------------------------------------------------- #
# each fix, in effect, from verl's own output (absolute: verl's defaults are    #
# GRPO's, so each check fails when that fix's translation is removed)           #
# --------------------------------------------------------------------------- #
def test_clip_higher_runs_with_the_upper_range_and_logs_its_clip_fraction(sweep):
    """The DAPO row's range as verl ran it, on PPO's clipped surrogate (verl's ``vanilla`` loss)."""
    actor = _verl_config(sweep["run"]).actor_rollout_ref.actor
    # verl's default range is 0.2/0.2 (its actor.yaml): without the translation the upper end is 0.2
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (0.2, 0.28)
    assert actor.policy_loss.loss_mode == "vanilla"  # the family's losses are not DAPO's (CISPO: test_slurm_sweeps)
    assert all("actor/pg_clipfrac" in r for r in _train_rows(sweep["run"]))


def test_dynamic_sampling_filters_groups_and_generates_more(sweep):
    dapo = _train_rows(sweep["run"])
    # verl's filter_groups is off by default: without the translation it logs no evicted samples, and every
    # generated rollout is trained (rollouts_per_trained 1, as the SLURM job's CISPO row shows: test_slurm_sweeps)
    assert all("training/filter_groups/evicted_samples" in r for r in dapo)
    assert sum(r["training/filter_groups/evicted_samples"] for r in dapo) > 0  # groups of equal rewards dropped
    assert max(r["dynamic_sampling/rollouts_per_trained"] for r in dapo) > 1  # and refilled by more generation
    assert _verl_config(sweep["run"]).algorithm.filter_groups.max_num_gen_batches == 0  # no cap


def test_overlong_filtering_masks_truncated_responses(sweep):
    from dapo_exp.backends.verl import FILTERED_LINE

    run = sweep["run"]
    truncated = [r["response_length/clip_ratio"] for r in _train_rows(run)]
    assert max(truncated) > 0  # at a 32-token cap the toy's long answers are truncated
    # the line is printed by our agent loop only (dapo_exp/backends/verl_ext), which verl runs only when the
    # translation names it (verl's default is its single-turn loop): without it, no line; that a row without
    # Overlong Filtering prints none is the SLURM job's check (test_slurm_sweeps)
    masked = [line for line in (run / "verl.log").read_text().splitlines() if FILTERED_LINE in line]
    assert masked and all("loss mask 0)" in line for line in masked), masked[:3]


def test_the_overlong_reward_punishes_long_responses(sweep):
    # verl's overlong buffer is off by default: without the translation no overlong_reward is logged at all
    penalty = [v for r in _eval_rows(sweep["run"]) for k, v in r.items()
               if k.startswith("val-aux/") and "/overlong_reward/mean@" in k]
    assert penalty and min(penalty) < 0, penalty  # verl's DAPO reward manager, Eq. 13, at the 24-32 token ramp


def test_the_loss_aggregation_is_token_level_in_the_dapo_row(sweep):
    """Token-level loss (Eq. 12) in the DAPO row; GRPO's sample-level mean is the SLURM job's CISPO row
    (test_slurm_sweeps) and, on the translation, Table 1's ladder (tests/test_verl_backend.py)."""
    run = sweep["run"]
    assert _verl_config(run).actor_rollout_ref.actor.loss_agg_mode == "token-mean"
    # token-mean is also verl's default: the override verl was given is what fails without the translation
    assert "actor_rollout_ref.actor.loss_agg_mode=token-mean" in list(_verl_config(run, "overrides.yaml"))


def test_the_runs_are_listed_by_the_analysis(sweep):
    from dapo_exp.analysis import load_runs

    frame = load_runs(sweep["cwd"] / "multirun" / "verl_cpu").included
    assert list(frame["label"]) == [json.loads((sweep["run"] / "summary.json").read_text())["label"]]
