"""Extending dapo-exp from outside the package: one fix per hook slot, each registered from this
file alone (one Python object + one config group, here written to a temporary search path),
trains two CPU steps and reaches the run label, the summary's switches and the analysis table."""

import json
from types import SimpleNamespace

import pytest
import torch

from dapo_exp import fixes, objective, rundir
from dapo_exp.config import ConfigError
from dapo_exp.fixes.base import Fix, GroupFilter
from dapo_exp.train import train

CALLS: dict[str, list] = {}


def _record(name, value):
    CALLS.setdefault(name, []).append(value)
    return value


def _plain_pg(logp, old_logp, advantages, *, mask):
    """An unclipped policy gradient, -r A per token (no clip flag ever set)."""
    ratio = torch.exp(logp - old_logp)
    adv = advantages if advantages.dim() == 2 else advantages[:, None]
    never = torch.zeros_like(ratio, dtype=torch.bool)
    _record("surrogate", tuple(logp.shape))
    return objective.SurrogateOut(-ratio * adv, ratio, never, never, never)


# name, short, slot, its hook (bound from the ext value), a metric it logs
EXTENSIONS = [
    ("const_bonus", "bonus", "reward",
     lambda v: lambda *, lengths, correct: _record("reward", torch.full_like(lengths, float(v))),
     "reward/const_bonus_mean"),
    ("adv_scale", "advx", "advantage", lambda v: lambda adv, rewards: _record("advantage", adv * float(v)),
     "actor/effective_batch_frac"),
    ("keep_all", "keep", "group_filter",
     lambda v: GroupFilter(keep=lambda correct, reward: _record("group_filter", torch.ones(len(correct), dtype=bool)),
                           max_rounds=int(v)),
     "dynamic_sampling/gen_rounds"),
    ("first_tokens", "ftok", "token_mask",
     lambda v: lambda mask, truncated: _record("token_mask", mask * (torch.arange(mask.shape[1]) < int(v))),
     "actor/masked_token_frac"),
    ("plain_pg", "ppg", "surrogate", lambda v: _plain_pg, "actor/pg_clipfrac_higher"),
    ("sum_norm", "snorm", "normaliser",
     lambda v: lambda mask, group_index: _record("normaliser", torch.full((mask.shape[0],), 1.0 / float(v))),
     "actor/pg_loss"),
    ("keep_first", "kfirst", "update_mask",
     lambda v: lambda entropy, mask: _record("update_mask", mask.bool() & (torch.arange(mask.shape[1]) < int(v))),
     "actor/update_mask_kept_frac"),
    ("const_weight", "cweight", "rollout_weight",
     lambda v: lambda old_logp, engine_logp, mask: _record("rollout_weight", torch.full_like(old_logp, float(v))),
     "actor/rollout_weight_mean"),
]


def _fix(name, short, slot, hook, metric):
    return Fix(name=name, short=short, title=name, paper="(test)", keys=(f"ext.{name}",),
               is_on=lambda a: name in a.ext, slots=(slot,), bind=lambda algo, run: {slot: hook(algo.ext[name])},
               metrics=(metric,))


VALUES = {"const_bonus": 0.5, "adv_scale": 2.0, "keep_all": 3, "first_tokens": 2, "plain_pg": 1, "sum_norm": 100.0,
          "keep_first": 2, "const_weight": 0.5}


@pytest.fixture
def extensions(tmp_path, monkeypatch):
    """Register one fix per slot and write their config groups (``<group>/enabled.yaml``) to a search path.
    The HF engine reports a log-prob of -1 per sampled token, so that the rollout_weight slot is called."""
    import dataclasses

    from dapo_exp.rollout.hf.engine import HFEngine

    generate = HFEngine.generate
    monkeypatch.setattr(HFEngine, "generate", lambda self, prompt_ids, spec: dataclasses.replace(
        g := generate(self, prompt_ids, spec), sampled_logprobs=[[-1.0] * len(r) for r in g.response_ids]))
    conf = tmp_path / "ext_conf"
    for name, *_ in EXTENSIONS:
        (conf / name).mkdir(parents=True)
        (conf / name / "enabled.yaml").write_text(f"# @package algo\next:\n  {name}: {VALUES[name]}\n")
        (conf / name / "disabled.yaml").write_text("# @package algo\n")
    for ext in EXTENSIONS:
        fixes.register_fix(_fix(*ext))
    CALLS.clear()
    yield SimpleNamespace(searchpath=f"hydra.searchpath=[file://{conf}]")
    for name, *_ in EXTENSIONS:
        fixes.unregister_fix(name)


def _rows(run_dir):
    return [json.loads(x) for x in (run_dir / rundir.METRICS).read_text().splitlines()]


@pytest.mark.slow
def test_a_fix_of_each_slot_from_outside_the_package(tmp_path, small_cfg, extensions):
    from dapo_exp import analysis as A

    assert {slot for _, _, slot, *_ in EXTENSIONS} == set(fixes.SLOTS)  # one fix per hook slot
    runs = tmp_path / "runs"
    for name, short, slot, _, metric in EXTENSIONS:
        s = train(small_cfg(runs / name, "fixes=grpo", extensions.searchpath, f"+{name}=enabled"))
        assert s["status"] == "finished" and s["label"] == short, name
        assert s["switches"] == {k: k == name for k in fixes.FIXES}, name
        assert CALLS.get(slot), f"the {slot} hook of {name} was never called"
        trained = [r for r in _rows(runs / name) if "reward/mean" in r]
        assert len(trained) == 2 and all(metric in r for r in trained)
        if slot == "reward":  # the bonus is added to the +1/-1 correctness reward of every response
            assert all(r["reward/const_bonus_mean"] == 0.5 for r in trained)
            assert all(r["reward/mean"] == pytest.approx(2 * r["reward/acc_mean"] - 1 + 0.5, abs=1e-6) for r in trained)
        if slot == "token_mask":  # only the first 2 tokens of each response count
            assert all(r["actor/masked_token_frac"] > 0 for r in trained)
        if slot == "update_mask":  # the first 2 tokens of each response carry the policy gradient
            assert all(0 < r["actor/update_mask_kept_frac"] < 1 for r in trained)
        if slot == "rollout_weight":
            assert all(r["actor/rollout_weight_mean"] == 0.5 for r in trained)
        if slot == "surrogate":
            assert all(r["actor/pg_clipfrac_higher"] == 0 and r["actor/pg_clipfrac_lower"] == 0 for r in trained)
    train(small_cfg(runs / "grpo", "fixes=grpo"))
    data = A.load_runs(runs)
    labels = {short for _, short, *_ in EXTENSIONS} | {"grpo"}
    assert set(data.runs["label"]) == labels
    for name, short, *_ in EXTENSIONS:
        assert name in data.runs.columns and name in A.SWITCHES
        assert dict(zip(data.runs["label"], data.runs[name]))[short]
    assert set(A.comparison_table(data).index) == labels


def test_two_fixes_in_one_exclusive_slot_fail_before_compute_naming_both(tmp_path, small_cfg, extensions):
    with pytest.raises(ConfigError, match="cispo and plain_pg cannot be combined.*surrogate"):
        train(small_cfg(tmp_path / "run", "fixes=grpo", "cispo=enabled", extensions.searchpath,
                        "+plain_pg=enabled"))
    assert not (tmp_path / "run").exists()  # refused before the run directory was made


def test_unregistered_names_fail_listing_the_choices(tmp_path, small_cfg):
    with pytest.raises(ConfigError, match="algo.adv_estimator='rank' is not valid; choose one of: grpo"):
        train(small_cfg(tmp_path, "algo.adv_estimator=rank"))
    with pytest.raises(ConfigError, match="algo.ext.const_bonus is read by no registered fix"):
        train(small_cfg(tmp_path, "+algo.ext.const_bonus=0.5"))
    assert not (tmp_path / rundir.SUMMARY).exists()  # refused before the run directory was touched
