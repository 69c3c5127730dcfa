"""The suite's pytest hooks (loaded by conftest.py's ``pytest_plugins``): each test process's settings, the
``--all-bands`` option, the order modules run in, and the per-test CPU log (``DAPO_TEST_CPU_LOG``)."""

from __future__ import annotations

import os
import time

import pytest

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


def pytest_configure(config):
    """Every test process (each xdist worker too): the config resolvers registered, W&B offline and quiet, one
    torch thread, and the garbage collector's threshold of a run's process. Each xdist worker trains in-process
    (`python run.py` children choose their own threads, one for the toy);
    torch's default, one thread per core, makes four workers on two cores spin in OpenMP's barriers: a 2-step
    training of the toy cost 7-15 CPU-s instead of 1.4 (and 14-36 s of wall instead of 5) at load 7 on the 2-core
    machine (2026-11-27)."""
    import torch

    from dapo_exp.hydra_setup import register_resolvers, set_gc

    register_resolvers()
    torch.set_num_threads(1)
    set_gc()  # as run.py's processes: tests/test_family.py 58 -> 47 CPU-s, its collector's 7.5 -> 3.0 (hydra_setup)
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")


def pytest_addoption(parser):
    parser.addoption("--all-bands", action="store_true",
                     help="sample every chat_arith level's base pass@1 on SmolLM2 (CI samples add2's only; "
                          "tests/test_chat_tasks.py holds the others' inputs to what their bands were measured on)")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))  # stable: the order within each part is kept


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and of the children it waited for."""
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


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
    wall, used, started = time.monotonic(), _cpu_seconds(), time.time()
    yield
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    line = f"{item.nodeid}\t{time.monotonic() - wall:.2f}\t{_cpu_seconds() - used:.2f}\t{worker}\t{started:.0f}\n"
    with open(log, "a") as f:  # one short write per line: the xdist workers' lines do not interleave
        f.write(line)
