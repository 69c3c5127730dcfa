"""Fault injection: what happens when checkpoints are crafted or corrupted, the disk is full, W&B or
the hub is unreachable, the command line is wrong, or the machine has only a system python3.

Each test reproduces one failure of issue 15 and shows the guarantee that replaces it
(docs/explanation/reliability.md).
"""

import errno
import os
import pickle
import random
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from dapo_exp import checkpoint, rundir
from dapo_exp.checkpoint import CheckpointError, CheckpointWriteError
from dapo_exp.rollout.groups import Group

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- #
# Helpers                                                                       #
# --------------------------------------------------------------------------- #
def tiny_training_objects(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 2))
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    sched.step()
    return model, opt, sched


def a_group(i: int = 0) -> Group:
    return Group(prompt_index=i, prompt_ids=[1, 2, 3], response_ids=[[4, 5], [6]], truncated=[False, True],
                 correct=[True, False], reward=[1.0, -1.5], shaping={"overlong": [0.0, -0.5]}, preds=["7", None],
                 sampled_logprobs=[[-0.1, -0.2], [-0.3]], meta={"texts": ["7", "x"]})


def trainer_state(step: int) -> dict:
    return {"sampler_position": 4 * step, "cum_rollouts": 16 * step, "carry": [a_group(step)],
            "evals": {0: {"eval/acc_avg": 0.25}, step: {"eval/acc_avg": 0.5}}, "wall_time_s": 1.5,
            "wandb_id": f"run-{step}"}


def save_steps(root: Path, *steps: int, keep: int = 5) -> None:
    model, opt, sched = tiny_training_objects()
    for s in steps:
        checkpoint.save(root, s, model, opt, sched, trainer_state(s), keep=keep)


def closed_loopback_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Evil:
    """Unpickling this runs a shell command that creates the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


# --------------------------------------------------------------------------- #
# 1. A crafted trainer_state.pt never runs code                                 #
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("container", ["torch.save", "raw pickle"])
def test_crafted_pickle_in_a_checkpoint_never_runs(tmp_path, container, caplog):
    root = tmp_path / "checkpoints"
    save_steps(root, 1, 2)
    evil_file = root / "step_0000002" / checkpoint.STATE
    marker = tmp_path / "pwned"
    payload = {"format": checkpoint.FORMAT, "step": 2, "optimizer": {}, "scheduler": {}, "rng": {},
               "state": {"x": Evil(marker)}}
    if container == "torch.save":
        torch.save(payload, evil_file)
    else:
        evil_file.write_bytes(pickle.dumps(payload, protocol=2))
    (root / "step_0000002" / checkpoint.MANIFEST).unlink()  # an attacker would rewrite it; checksums are no defence

    model, opt, sched = tiny_training_objects(seed=1)
    with pytest.raises(CheckpointError, match=str(evil_file)):
        checkpoint.load(root / "step_0000002", model, opt, sched)
    # resuming falls back to the older checkpoint and says which file it skipped
    assert checkpoint.latest(root) == root / "step_0000001"
    assert any(str(evil_file) in r.getMessage() for r in caplog.records)
    assert not marker.exists()

    # control: the payload is live; an unrestricted unpickler does run it
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(Evil(control)))
    assert control.exists()


# --------------------------------------------------------------------------- #
# 2. Verified on load, with fallback to the newest good checkpoint              #
# --------------------------------------------------------------------------- #
def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _randomise(p: Path) -> None:
    p.write_bytes(os.urandom(p.stat().st_size))


def _flip_data_bytes(p: Path) -> None:
    """Random bytes in the tensor data of a safetensors file, header intact (only the checksum sees it)."""
    raw = bytearray(p.read_bytes())
    header = 8 + int.from_bytes(raw[:8], "little")
    raw[header:] = os.urandom(len(raw) - header)
    p.write_bytes(bytes(raw))


def _flip_one_bit(p: Path) -> None:
    """One bit of the tensor data changed, the safetensors header intact; the value stays finite
    (a low mantissa bit), so only a checksum can see it."""
    raw = bytearray(p.read_bytes())
    header = 8 + int.from_bytes(raw[:8], "little")
    raw[header + 4] ^= 0x01  # the low byte of the second float32
    p.write_bytes(bytes(raw))


CORRUPTIONS = {
    "weights truncated": (checkpoint.WEIGHTS, _truncate, True),
    "weights random bytes": (checkpoint.WEIGHTS, _randomise, True),
    "weights data bytes changed": (checkpoint.WEIGHTS, _flip_data_bytes, True),
    "state random bytes": (checkpoint.STATE, _randomise, True),
    "state truncated": (checkpoint.STATE, _truncate, True),
    "weights truncated, no manifest": (checkpoint.WEIGHTS, _truncate, False),
    "state random bytes, no manifest": (checkpoint.STATE, _randomise, False),
    # a missing manifest is damage in itself (the writer always writes one): never "not verified, trusted"
    "weights one bit flipped, no manifest": (checkpoint.WEIGHTS, _flip_one_bit, False),
    "weights data bytes changed, no manifest": (checkpoint.WEIGHTS, _flip_data_bytes, False),
}


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, case, caplog):
    name, corrupt, with_manifest = CORRUPTIONS[case]
    root = tmp_path / "checkpoints"
    save_steps(root, 1, 2)
    newest = root / "step_0000002"
    if not with_manifest:
        (newest / checkpoint.MANIFEST).unlink()
    corrupt(newest / name)

    assert checkpoint.latest(root) == root / "step_0000001"
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(skipped) == 1 and str(newest / name) in skipped[0]
    model, opt, sched = tiny_training_objects(seed=1)
    step, state = checkpoint.load(root / "step_0000001", model, opt, sched)
    assert step == 1 and state == trainer_state(1)


def test_no_usable_checkpoint_is_an_error_naming_each_one_not_a_silent_restart(tmp_path):
    root = tmp_path / "checkpoints"
    save_steps(root, 1, 2)
    for s in (1, 2):
        _randomise(root / f"step_000000{s}" / checkpoint.STATE)
    with pytest.raises(CheckpointError) as err:
        checkpoint.latest(root)
    msg = str(err.value)
    assert "step_0000001" in msg and "step_0000002" in msg and f"move or delete {root}" in msg
    assert checkpoint.latest(tmp_path / "nothing here") is None


def test_state_round_trips_exactly_with_rng_and_carried_groups(tmp_path):
    model, opt, sched = tiny_training_objects()
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    np.random.randn()  # numpy now holds a cached gaussian: part of its state
    state = trainer_state(3)
    checkpoint.save(tmp_path, 3, model, opt, sched, state)
    expected = (random.random(), float(np.random.randn()), torch.rand(2).tolist())

    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    model2, opt2, sched2 = tiny_training_objects(seed=5)
    step, restored = checkpoint.load(checkpoint.latest(tmp_path), model2, opt2, sched2)
    assert (random.random(), float(np.random.randn()), torch.rand(2).tolist()) == expected
    assert step == 3 and restored == state and isinstance(restored["carry"][0], Group)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), model2.state_dict().values()))
    assert sched2.state_dict() == sched.state_dict()
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])


def test_a_state_value_that_cannot_be_restored_safely_fails_at_save_not_at_resume(tmp_path):
    model, opt, sched = tiny_training_objects()
    with pytest.raises(TypeError, match=r"checkpoint\['state'\]\['odd'\] is a object"):
        checkpoint.save(tmp_path, 1, model, opt, sched, {"odd": object()})
    assert list(tmp_path.iterdir()) == []  # nothing written, no temporary directory


def test_save_fsyncs_files_and_directory_before_the_rename_and_the_parent_after(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(src), str(dst)))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    save_steps(tmp_path, 1)
    (i_replace,) = [i for i, e in enumerate(events) if e[0] == "replace"]
    tmp_dir = events[i_replace][1]
    before = {e[1] for e in events[:i_replace]}
    after = {e[1] for e in events[i_replace + 1:]}
    files = {f"{tmp_dir}/{n}" for n in (checkpoint.WEIGHTS, checkpoint.STATE, checkpoint.MANIFEST)}
    assert files | {tmp_dir} <= before
    assert str(tmp_path) in after
    assert events[i_replace][2] == str(tmp_path / "step_0000001")


def test_after_a_fallback_the_abandoned_newer_checkpoint_is_removed_at_the_next_save(tmp_path):
    root = tmp_path / "checkpoints"
    save_steps(root, 1, 3)
    _truncate(root / "step_0000003" / checkpoint.WEIGHTS)
    assert checkpoint.latest(root) == root / "step_0000001"
    save_steps(root, 2, keep=2)  # the resumed run saves step 2: step 3 belongs to the abandoned timeline
    assert sorted(p.name for p in root.iterdir()) == ["step_0000001", "step_0000002"]


@pytest.mark.slow
def test_resume_past_a_corrupt_newest_checkpoint_gives_the_uninterrupted_metrics(tmp_path, small_cfg, monkeypatch,
                                                                                caplog):
    from helpers import whole_and_killed
    from test_train import metrics

    from dapo_exp.train import train

    overrides = ("train.steps=3", "checkpoint.every=1", "checkpoint.keep=2")
    whole_and_killed(small_cfg, monkeypatch, tmp_path, overrides, 3)
    ckpts = tmp_path / "cut" / rundir.CHECKPOINTS
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_0000001", "step_0000002"]
    _truncate(ckpts / "step_0000002" / checkpoint.WEIGHTS)  # what a power loss without fsync could leave

    s = train(small_cfg(tmp_path / "cut", *overrides))
    assert s["status"] == "finished"
    assert any(str(ckpts / "step_0000002" / checkpoint.WEIGHTS) in r.getMessage() for r in caplog.records)
    assert metrics(tmp_path / "cut") == metrics(tmp_path / "whole")


# --------------------------------------------------------------------------- #
# 5. Disk full while saving a checkpoint                                        #
# --------------------------------------------------------------------------- #
def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _half_written_then_no_space(obj, f, *args, **kwargs):
    Path(f).write_bytes(b"PK\x03\x04 half of a zip")
    raise RuntimeError("[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing file")


@pytest.mark.parametrize("where, fails", [
    ("save_model", _no_space),
    ("torch.save", _half_written_then_no_space),
])
def test_disk_full_leaves_no_temp_dir_and_names_the_checkpoint(tmp_path, monkeypatch, where, fails):
    root = tmp_path / "checkpoints"
    save_steps(root, 1)
    if where == "save_model":
        monkeypatch.setattr(checkpoint, "save_model", fails)
    else:
        monkeypatch.setattr(checkpoint.torch, "save", fails)
    model, opt, sched = tiny_training_objects()
    with pytest.raises(CheckpointWriteError) as err:
        checkpoint.save(root, 2, model, opt, sched, trainer_state(2))
    assert isinstance(err.value, OSError)
    assert err.value.errno == (errno.ENOSPC if where == "save_model" else errno.EIO)
    assert str(root / "step_0000002") in str(err.value) and "Free disk space" in str(err.value)
    assert sorted(p.name for p in root.iterdir()) == ["step_0000001"]  # no .tmp-*, no step_2
    monkeypatch.undo()
    assert checkpoint.latest(root) == root / "step_0000001"


# --------------------------------------------------------------------------- #
# 7. W&B online without a network                                               #
# --------------------------------------------------------------------------- #
def test_wandb_online_without_network_falls_back_to_offline_quickly(tmp_path, monkeypatch, caplog):
    """The wait is bounded by the time-out the online attempt hands W&B (``WANDB_INIT_TIMEOUT``, else
    ``tracking.INIT_TIMEOUT_S``; W&B's own default waits about 100 s), checked as given, not timed: a clock
    here would fail on a loaded machine."""
    import wandb

    from dapo_exp.tracking import INIT_TIMEOUT_S, WandbTracker, start_tracker

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{closed_loopback_port()}")  # loopback only
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)  # a dummy key; nothing leaves the machine
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "3")
    attempts, real_init = [], wandb.init

    def init(**kwargs):
        attempts.append((kwargs["mode"], kwargs["settings"].init_timeout))
        return real_init(**kwargs)

    monkeypatch.setattr(wandb, "init", init)
    tracker = start_tracker("wandb", out_dir=str(tmp_path), config={"a": 1}, project="p", group="g", name="n",
                            tags=[], mode="online", run_id="offline-fallback-test")
    try:
        assert isinstance(tracker, WandbTracker)
        assert tracker.run.settings.mode == "offline"
        tracker.log({"actor/pg_loss": 1.0}, step=1)
    finally:
        tracker.finish()
    assert attempts == [("online", 3.0), ("offline", 3.0)]  # one online attempt, bounded by the time-out
    assert INIT_TIMEOUT_S <= 30  # the default bound, without WANDB_INIT_TIMEOUT
    assert any("logging offline instead" in r.getMessage() for r in caplog.records)
    assert list((tmp_path / "wandb").glob("offline-run-*"))


# --------------------------------------------------------------------------- #
# 11. Errors: one clear line, no traceback, no empty run directory              #
# --------------------------------------------------------------------------- #
def run_cli(tmp_path, *overrides, env=None, timeout=120):
    run_dir = tmp_path / "outputs" / "job"
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "run.py", *overrides, "logger=none", f"hydra.run.dir={run_dir}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    return out, run_dir, time.monotonic() - t0


CLI_ERRORS = {
    "misspelt key": (["optim.lrr=1"], "optim.lrr is not a config key", "did you mean optim.lr?"),
    "misspelt key added with +": (["+optim.lrr=1"], "optim.lrr is not a config key", "did you mean optim.lr?"),
    "misspelt group": (["fixe=full"], "fixe is not a config key or group", "did you mean fixes?"),
    "unknown option": (["fixes=ful"], "fixes=ful: no such option", "did you mean full?"),
    "wrong type": (["train.steps=abc"], "train.steps=abc: Value 'abc'", "Integer"),
    "bad value (validate)": (["train.steps=-1"], "train.steps: must be >= 0", ""),
    "model.path without a model": (["model.path=/tmp"], "model.path='/tmp' holds no model", "config.json"),
}


@pytest.mark.parametrize("case", list(CLI_ERRORS))
def test_config_errors_are_one_line_without_traceback_and_leave_no_directory(tmp_path, case):
    overrides, what, hint = CLI_ERRORS[case]
    out, run_dir, _ = run_cli(tmp_path, *overrides)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2, out.stderr
    assert lines == [lines[0]] and lines[0].startswith(f"error: {what}") and hint in lines[0], out.stderr
    assert "Traceback" not in out.stderr + out.stdout and "+optim" not in lines[0].split("(")[0]
    assert "sentencepiece" not in out.stderr
    assert not run_dir.exists()


def test_hydra_struct_schema_accepts_a_plus_key_so_run_py_refuses_it():
    """Hydra's schema lets `+optim.lrr=1` through (the key would be ignored): check_known_keys refuses it."""
    from hydra import compose, initialize_config_dir

    from dapo_exp.cli_errors import check_known_keys, unknown_keys
    from dapo_exp.config import ConfigError

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["+optim.lrr=1", "+notes.why=free-form"])
        clean = compose("config", overrides=["fixes=grpo"])
    assert cfg.optim.lrr == 1  # Hydra accepted it
    assert unknown_keys(cfg) == ["optim.lrr"] and unknown_keys(clean) == []  # notes.* is free-form
    with pytest.raises(ConfigError, match="did you mean optim.lr"):
        check_known_keys(cfg)


@pytest.mark.parametrize("how", ["hub unreachable", "HF_HUB_OFFLINE=1"])
def test_dapo_math_offline_fails_fast_naming_the_local_file_override(tmp_path, how):
    env = ({"HF_ENDPOINT": f"http://127.0.0.1:{closed_loopback_port()}", "HF_HUB_OFFLINE": "0"}
           if how == "hub unreachable" else {"HF_HUB_OFFLINE": "1"})
    out, _, _ = run_cli(tmp_path, "task=dapo_math", env=env)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert "task.train_source=/path/to/" in lines[0] and "task.eval_source=/path/to/" in lines[0]


def test_an_unreachable_hub_data_set_is_asked_once_with_a_short_time_out(monkeypatch):
    """Why the refusal above is fast (datasets' own retries took ~38 s): one request to the hub, bounded by
    HUB_TIMEOUT_S, then the refusal; checked as made, not timed."""
    from huggingface_hub import HfApi

    from dapo_exp.tasks.math_data import HUB_TIMEOUT_S, TaskSourceError, check_hub_reachable, resolve_source

    calls = []

    def unreachable(self, repo_id, **kwargs):
        calls.append(kwargs.get("timeout"))
        raise ConnectionError("connection refused")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(HfApi, "dataset_info", unreachable)
    with pytest.raises(TaskSourceError, match="cannot reach the Hugging Face hub"):
        check_hub_reachable(resolve_source("dapo_math_17k"), "task.train_source")
    assert calls == [HUB_TIMEOUT_S] and HUB_TIMEOUT_S <= 10


def test_model_dir_check_names_what_a_model_dir_must_hold(tmp_path):
    from dapo_exp.config import ConfigError
    from dapo_exp.models import check_model_source

    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="no weights, tokenizer files") as err:
        check_model_source(str(tmp_path))
    assert isinstance(err.value, FileNotFoundError) and "model.path=" in str(err.value)
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "tokenizer.json").write_text("{}")
    check_model_source(str(tmp_path))  # complete: accepted
    check_model_source("Qwen/Qwen2.5-0.5B-Instruct")  # a hub id: checked when loading


# --------------------------------------------------------------------------- #
# 12. The two commands on a stock machine                                       #
# --------------------------------------------------------------------------- #
SYSTEM_PYTHON = Path("/usr/bin/python3")


def stock_path(tmp_path: Path, python3: Path | None) -> str:
    """A PATH holding the few tools the scripts use, ``python3`` if given, and no ``python``."""
    bindir = tmp_path / ("stock-bin" if python3 else "tools-bin")
    bindir.mkdir()
    if python3:
        (bindir / "python3").symlink_to(python3)
    for tool in ("bash", "dirname", "rm", "env"):
        (bindir / tool).symlink_to(shutil.which(tool))
    return str(bindir)


def scratch_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    (repo / "bin").mkdir()
    shutil.copy(ROOT / ".ci" / "venv", repo / ".ci" / "venv")
    shutil.copy(ROOT / "bin" / "python", repo / "bin" / "python")
    return repo


def stock_env(path: str, **extra) -> dict:
    return {"PATH": path, "HOME": os.environ.get("HOME", "/root"), **extra}  # no VIRTUAL_ENV, no CONDA_PREFIX


def externally_managed(python: Path) -> bool:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('stdlib'))"],
                         capture_output=True, text=True)
    return out.returncode == 0 and (Path(out.stdout.strip()) / "EXTERNALLY-MANAGED").exists()


needs_stock_python = pytest.mark.skipif(
    not (SYSTEM_PYTHON.exists() and externally_managed(SYSTEM_PYTHON)),
    reason="needs a system /usr/bin/python3 marked EXTERNALLY-MANAGED (PEP 668), as on Debian 12",
)


@needs_stock_python
def test_install_creates_then_reuses_a_venv_with_only_system_python3_on_path(tmp_path):
    repo = scratch_repo(tmp_path)
    path = stock_path(tmp_path, SYSTEM_PYTHON)
    first = subprocess.run(["bash", ".ci/venv"], cwd=repo, env=stock_env(path), capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == str(repo / ".venv" / "bin" / "python") and "creating" in first.stderr
    py = repo / ".venv" / "bin" / "python"
    check = subprocess.run([str(py), "-c", "import sys; print(sys.prefix != sys.base_prefix)"],
                           capture_output=True, text=True)
    assert check.stdout.strip() == "True"  # a real virtual environment, not the system interpreter
    pip = subprocess.run([str(py), "-m", "pip", "--version"], capture_output=True, text=True)
    assert pip.returncode == 0 and str(repo / ".venv") in pip.stdout

    again = subprocess.run(["bash", ".ci/venv"], cwd=repo, env=stock_env(path), capture_output=True, text=True)
    assert again.stdout.strip() == str(py) and "reusing" in again.stderr
    run = subprocess.run(["bin/python", "-c", "import sys; print(sys.executable)"], cwd=repo,
                         env=stock_env(path), capture_output=True, text=True)
    assert run.stdout.strip() == str(py)


@needs_stock_python
def test_install_without_ensurepip_bootstraps_pip_with_the_system_pip(tmp_path):
    """Debian without python3-venv: `python3 -m venv` fails for want of ensurepip."""
    if subprocess.run([str(SYSTEM_PYTHON), "-m", "pip", "--version"], capture_output=True).returncode:
        pytest.skip("the system python3 has no pip to bootstrap from")
    repo = scratch_repo(tmp_path)
    shim = tmp_path / "python3-without-venv"
    shim.write_text(
        f"#!{shutil.which('bash')}\n"
        'if [ "$1 $2" = "-m venv" ] && [[ " $* " != *" --without-pip "* ]]; then\n'
        '  echo "ensurepip is not available" >&2; exit 1\nfi\n'
        f'exec {SYSTEM_PYTHON} "$@"\n'
    )
    shim.chmod(0o755)
    path = stock_path(tmp_path, shim)
    out = subprocess.run(["bash", ".ci/venv"], cwd=repo, env=stock_env(path), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "retrying without ensurepip" in out.stderr
    pip = subprocess.run([out.stdout.strip(), "-m", "pip", "--version"], capture_output=True, text=True)
    assert pip.returncode == 0 and str(repo / ".venv") in pip.stdout


def test_an_active_environment_is_used_and_nothing_is_created(tmp_path):
    repo = scratch_repo(tmp_path)
    tools = stock_path(tmp_path, None)  # no python at all on PATH
    active = Path(sys.prefix)
    out = subprocess.run(["bash", ".ci/venv"], cwd=repo, env=stock_env(tools, VIRTUAL_ENV=str(active)),
                         capture_output=True, text=True, executable=shutil.which("bash"))
    assert out.returncode == 0 and out.stdout.strip() == str(active / "bin" / "python"), out.stderr
    assert not (repo / ".venv").exists()
    missing = subprocess.run(["bash", ".ci/venv", "--find"], cwd=repo, env=stock_env(tools),
                             capture_output=True, text=True, executable=shutil.which("bash"))
    assert missing.returncode == 1 and not (repo / ".venv").exists()
    no_env = subprocess.run(["bash", "bin/python", "-V"], cwd=repo, env=stock_env(tools),
                            capture_output=True, text=True, executable=shutil.which("bash"))
    assert no_env.returncode == 1 and "bash .ci/install" in no_env.stderr


def test_ci_runs_exactly_the_readme_commands():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## The two commands", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [ln.split("#", 1)[0].strip() for ln in block.strip().splitlines()]
    assert commands == ["bash .ci/install && bin/python run.py", "bash .ci/test"]
    lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()
             if ln.strip() and not ln.lstrip().startswith("#")]
    # each README command once, verbatim: the first with its exit code kept for the end (it runs beside the second)
    first = [ln for ln in lines if ln.startswith("{ rc=")]  # (elsewhere the command is only named, in messages)
    assert first == ['{ rc=0; bash .ci/install && bin/python run.py || rc=$?; echo $rc > "$first_rc"; } '
                     '> "$first_log" 2>&1 &']
    assert [ln for ln in lines if re.search(r"\bbash \.ci/test\b(?!-)", ln)] == ["bash .ci/test || test_rc=$?"]
    # before them only the interpreter the environments are made from (Debian's PGO build where it is there,
    # unless DAPO_PYTHON names one) and the background prefetch of the test-only environments
    choice = ['if [ -z "${DAPO_PYTHON:-}" ] && /usr/bin/python3 -c "import sys, venv, ensurepip; '
              'sys.exit(sys.version_info < (3, 10))" 2>/dev/null', "then", "export DAPO_PYTHON=/usr/bin/python3", "fi"]
    before = [re.sub(r'\s*\|\| fail \$\? "[^"]*"$', "", ln) for ln in lines[:lines.index(first[0])]
              if not ln.startswith(("set ", "cd ", "fail() ", "first_log="))]
    assert before == [*choice, "bash .ci/test-env --prefetch"]


def fake_ci(tmp_path, run_py: str, test: str) -> Path:
    """A repository holding ``.ci/run`` and stand-ins for what it calls: the prefetch and the install do nothing
    (the install exits ``$FAKE_INSTALL_RC``), ``bin/python`` runs the bash ``run_py``, ``.ci/test`` the bash ``test``."""
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "run", repo / ".ci")
    (repo / ".ci" / "test-env").write_text("exit 0\n")
    (repo / ".ci" / "install").write_text('exit "${FAKE_INSTALL_RC:-0}"\n')
    (repo / ".ci" / "test").write_text(test)
    (repo / "bin").mkdir()
    (repo / "bin" / "python").write_text(f"#!/usr/bin/env bash\n{run_py}")
    (repo / "bin" / "python").chmod(0o755)
    return repo


@needs_stock_python
def test_dapo_python_names_the_interpreter_the_venv_is_made_from(tmp_path):
    """DAPO_PYTHON creates .venv from the interpreter it names, whatever python3 on PATH is (none here); one that
    does not run is refused in one line naming it, before anything is created."""
    repo = scratch_repo(tmp_path)
    tools = stock_path(tmp_path, None)  # no python3 on PATH
    out = subprocess.run(["bash", ".ci/venv"], cwd=repo, env=stock_env(tools, DAPO_PYTHON=str(SYSTEM_PYTHON)),
                         capture_output=True, text=True, executable=shutil.which("bash"))
    assert out.returncode == 0, out.stderr
    assert f"with {SYSTEM_PYTHON} (" in out.stderr
    base = subprocess.run([out.stdout.strip(), "-c", "import sys; print(sys._base_executable)"],
                          capture_output=True, text=True).stdout.strip()
    assert Path(base).resolve() == SYSTEM_PYTHON.resolve()
    shutil.rmtree(repo / ".venv")
    bad = subprocess.run(["bash", ".ci/venv"], cwd=repo, env=stock_env(tools, DAPO_PYTHON="/no/such/python"),
                         capture_output=True, text=True, executable=shutil.which("bash"))
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1
    assert "DAPO_PYTHON=/no/such/python is not a Python interpreter that runs" in bad.stderr
    assert not (repo / ".venv").exists()


def test_ci_ends_with_a_verdict_line_when_a_command_before_the_tests_fails(tmp_path):
    """.ci/run's first README command failing (the default run, say) ends CI with one FAIL line naming it."""
    repo = fake_ci(tmp_path, 'exit "${FAKE_RUN_RC:-0}"\n', "echo 'test command: PASS (exit 0)'\n")
    failed = subprocess.run(["bash", ".ci/run"], cwd=repo, capture_output=True, text=True,
                            env={**os.environ, "FAKE_RUN_RC": "3"})
    assert failed.returncode == 3
    assert failed.stdout.splitlines()[-1] == ("CI: FAIL (exit 3) | bash .ci/install && bin/python run.py failed (above), "
                                              "so the test command did not run")
    # a failed install stops CI too (set -e alone would go on to the tests: it ignores the left side of &&)
    failed = subprocess.run(["bash", ".ci/run"], cwd=repo, capture_output=True, text=True,
                            env={**os.environ, "FAKE_INSTALL_RC": "4"})
    assert failed.returncode == 4 and "test command:" not in failed.stdout, failed.stdout
    assert failed.stdout.splitlines()[-1].startswith("CI: FAIL (exit 4) | bash .ci/install && bin/python run.py failed")
    passed = subprocess.run(["bash", ".ci/run"], cwd=repo, capture_output=True, text=True)
    assert passed.returncode == 0 and passed.stdout.splitlines()[-1] == "test command: PASS (exit 0)"


# when the default run's last output lands against the test command's verdict: well before it (the watcher has
# printed it), just before it (the watcher, polling every 2 s, has not printed it yet), or after it
ENDS = {"run ends first": "until [ -f run-ended ]; do sleep 0.1; done\nsleep 5\n",
        "run ends just before": "until [ -f run-ended ]; do sleep 0.1; done\n",
        "run ends after": "touch tests-ending\n"}


@pytest.mark.parametrize("ends", ENDS)
@pytest.mark.parametrize("run_rc", [0, 3])
def test_ci_runs_the_test_command_beside_the_default_run_once_it_has_trained_its_first_step(tmp_path, run_rc, ends):
    """The test command starts once the default run has logged its first step, while it goes on (the run here ends
    only after the tests started); the rest of the run's output comes in one block when it ends, a verdict line stays
    last however the two ends fall (the test command's where the block came before it, CI's own, which repeats the
    test command's with its counts, where it came after),
    and a default run that fails after its first step fails CI, naming it."""
    run_py = ("echo 'loading'\necho '[dapo-exp] full s0 step 1/2 | reward 0.1'\n"
              "until [ -f tests-started ]; do sleep 0.1; done\n"
              + ("until [ -f tests-ending ]; do sleep 0.1; done\nsleep 1\n" if ends == "run ends after" else "")
              + f"echo '[dapo-exp] full s0 step 2/2 | reward 0.2'\ntouch run-ended\nexit {run_rc}\n")
    test = ("[ ! -f run-ended ] || exit 9\ntouch tests-started\n" + ENDS[ends]
            + "echo 'test command: PASS (exit 0) | main suite: 3 passed'\n"
            + "echo 'test command: PASS (exit 0) | main suite: 3 passed' > \"$DAPO_VERDICT_FILE\"\n")  # as .ci/test
    repo = fake_ci(tmp_path, run_py, test)
    out = subprocess.run(["bash", ".ci/run"], cwd=repo, capture_output=True, text=True, timeout=120)
    lines = out.stdout.splitlines()
    assert lines[:2] == ["loading", "[dapo-exp] full s0 step 1/2 | reward 0.1"], out.stdout
    block = lines.index(f"--- the default run (bin/python run.py, beside the test command) ended, exit {run_rc}:")
    assert lines[block + 1] == "[dapo-exp] full s0 step 2/2 | reward 0.2"
    assert sum("step 1/2" in ln for ln in lines) == 1  # nothing shown twice
    verdict = lines.index("test command: PASS (exit 0) | main suite: 3 passed")
    if run_rc == 3:
        assert out.returncode == 3, out.stdout
        assert lines[-1] == ("CI: FAIL (exit 3) | bash .ci/install && bin/python run.py failed (above), beside the "
                             "test command (exit 0)"), out.stdout
    elif block < verdict:  # the block came first: the test command's verdict is the last line
        assert ends != "run ends after" and out.returncode == 0 and lines[-1] == lines[verdict], out.stdout
    else:  # the block came after the test command's verdict: CI says so in a last line of its own
        assert ends != "run ends first" and out.returncode == 0, out.stdout
        assert lines[-1] == ("CI: the default run passed (its last output above, after the test command's "
                             "verdict, repeated here): test command: PASS (exit 0) | main suite: 3 passed"), out.stdout
