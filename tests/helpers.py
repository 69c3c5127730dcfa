"""What the tests share besides fixtures: the shrunken toy's overrides, composing it, waiting for verl's
environment, holding the machine's Ray lock, the shipped warm start, a simulated kill, and a signal that lands in a
finalizer."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import signal
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONF = str(ROOT / "conf")

# A shrunken toy: 4 prompts x 4 responses per step, 8 eval problems x 2 samples (the final evaluation x
# eval.final_samples = 8: every evaluation is capped at the 8 held-out problems).
# The model is the default warm-started tiny policy (built once, cached in
# model.cache_dir like for `python run.py`).
SMALL = [
    "logger=none",
    "train.steps=2",
    "train.prompts_per_step=4",
    "rollout.n=4",
    "train.mini_batch_size=8",
    "train.micro_batch_size=4",
    "task.arith_n_eval=8",
    "eval.k=2",
    "eval.every=0",
    "checkpoint.every=1",
]
# a sweep's end analysis without its figures (a Hydra override, none of the jobs'): about 11 CPU-s of a small sweep's
# analysis here, for the tests that read its table and not its figures (tests/test_analysis_figures.py draws them)
NO_FIGURES = "+hydra.callbacks.analysis.figures=false"

# held by .venv-verl's installer while it runs beside the tests (.ci/test-env --verl-background)
VERL_INSTALL_LOCK = ROOT / ".ci" / ".install-verl.lock"


def lock_held(lock: Path) -> bool:
    """Whether another open file holds ``lock`` (flock), as a background install of ``.ci/test-env`` does."""
    with open(lock) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
    return False


def wait_for_verl_install(timeout: float = 1800.0, lock: Path | None = None) -> None:
    """Wait while ``.ci/test`` installs ``.venv-verl`` beside the tests: the installer holds the lock
    ``.ci/.install-verl.lock`` (flock) until it ends, so that a test needing verl's environment neither skips nor
    starts on half of it. No lock file: no install was started here."""
    lock = lock or VERL_INSTALL_LOCK
    if not lock.exists():
        return
    deadline = time.monotonic() + timeout
    while lock_held(lock):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{lock}: .venv-verl's install did not end within {timeout:.0f} s")
        time.sleep(2.0)


@contextlib.contextmanager
def ray_to_itself(timeout: float = 1800.0):
    """Hold this machine's lock for a test that starts a Ray cluster (verl's trainer), so that no two run at
    once from the test workers: two Ray clusters on one host contend for the same default ports (the
    dashboard's 8265, its agent's) and, on 2 cores, starve each other's start-up (a ``ray start`` beside
    another verl job timed out after 30 s in CI). A lock file in the temporary directory, any checkout (filelock,
    as the warm-start cache uses it: filelock.Timeout after ``timeout`` seconds)."""
    import tempfile

    from filelock import FileLock

    with FileLock(str(Path(tempfile.gettempdir()) / "dapo-exp-ray-tests.lock"), timeout=timeout):
        yield


def shipped_default_model() -> Path:
    """The default toy's warm start as the package ships it (a model directory ``model.path`` can name)."""
    from dapo_exp.hydra_setup import compose_config
    from dapo_exp.tasks.arith_warmstart import _warmstart_key, shipped_checkpoint

    cfg = compose_config([])
    shipped = shipped_checkpoint(_warmstart_key(cfg.model, cfg.task, cfg.rollout.max_response_len))
    assert shipped is not None, "the default toy's warm start is not shipped (dapo_exp/assets/warmstart/)"
    return shipped


def small_for(overrides) -> list[str]:
    """SMALL, less its arithmetic eval count where ``overrides`` choose a task that reads none (a data task:
    the run refuses a key that nothing in it reads, dapo_exp.config.check_keys_read)."""
    from dapo_exp.config import TASK_KEY_READERS

    task = next((o.split("=", 1)[1] for o in overrides if str(o).startswith("task=")), "arith")
    reads = task in TASK_KEY_READERS["arith_n_eval"][0]
    return [o for o in SMALL if reads or not o.startswith("task.arith_n_eval=")]


def compose_small(out_dir, *overrides, warm_cache):
    """The shrunken config (SMALL, the warm-start cache, ``out_dir``) of conftest's ``small_cfg`` fixture, callable
    where a function-scoped fixture is not (a module fixture)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose("config", overrides=[*small_for(overrides), f"model.cache_dir={warm_cache}", f"out_dir={out_dir}",
                                            *overrides])


def kill_during_step(monkeypatch, step):
    """Make train() die like a killed process (KeyboardInterrupt) as it starts rollout step ``step``."""
    import dapo_exp.train as T

    real, calls = T.collect_groups, {"n": 0}

    def dies(*a, **k):
        calls["n"] += 1
        if calls["n"] == step:
            raise KeyboardInterrupt(f"simulated kill during step {step}")
        return real(*a, **k)

    monkeypatch.setattr(T, "collect_groups", dies)


def whole_and_killed(small_cfg, monkeypatch, tmp_path, overrides, step):
    """An uninterrupted run in ``tmp_path/whole`` and the same run killed as it starts ``step`` in
    ``tmp_path/cut`` (its checkpoints left as a kill leaves them)."""
    import pytest

    from dapo_exp.train import train

    train(small_cfg(tmp_path / "whole", *overrides))
    kill_during_step(monkeypatch, step)
    with pytest.raises(KeyboardInterrupt):
        train(small_cfg(tmp_path / "cut", *overrides))
    monkeypatch.undo()



@functools.cache
def slurm_manager():
    """``.ci/slurm_cluster.py``, what ``bash .ci/slurm`` runs (loaded from its path: ``.ci`` is no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("slurm_cluster", ROOT / ".ci" / "slurm_cluster.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class SignalledInFinalizer:
    """Sends ``sig`` to this process from its ``__del__``, whose bytecodes the handler then runs between: a signal
    that lands while Python runs a finalizer, where an exception cannot be raised (``rundir.FinalizerSignals``)."""

    def __init__(self, sig: signal.Signals):
        self.sig = sig

    def __del__(self):
        os.kill(os.getpid(), self.sig)
        for _ in range(1000):  # the handler runs between these bytecodes, inside __del__
            pass
