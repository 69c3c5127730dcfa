"""Shared fixtures: a small, fast config of the toy and a warm-start cache for the session."""

import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from dapo_exp.hydra_setup import register_resolvers

ROOT = Path(__file__).resolve().parents[1]
CONF = str(ROOT / "conf")
register_resolvers()
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


@pytest.fixture(scope="session")
def warm_cache():
    """The default warm-start cache (shared with `python run.py`; keyed by the model config)."""
    return os.environ.get("DAPO_WARMSTART_CACHE", os.path.expanduser("~/.cache/dapo_exp/warmstart"))


@pytest.fixture
def small_cfg(warm_cache):
    """``small_cfg(out_dir, *overrides)`` -> a composed, shrunken config."""

    def make(out_dir, *overrides):
        with initialize_config_dir(config_dir=CONF, version_base="1.3"):
            return compose(
                "config", overrides=[*SMALL, f"model.cache_dir={warm_cache}", f"out_dir={out_dir}", *overrides]
            )

    return make



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


# The longest module (verl's trainer executed on this CPU, ~8 min in one module-scoped sweep) runs first: the
# test command spreads modules over two workers in this order (pytest-xdist, --dist loadscope
# --no-loadscope-reorder), so it runs beside the rest instead of after it.
FIRST = ("test_verl_run.py",)


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.path.name not in FIRST)  # stable: the order within each part is kept
