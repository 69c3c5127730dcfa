"""Extending dapo-exp from outside the package: one fix per hook slot, each registered from this
file alone (one Python object + one config group, here written to a temporary search path),
trains two CPU steps and reaches the run label, the summary's switches and the analysis table."""

import functools
import json
import os
from types import SimpleNamespace

import pytest
import torch
from helpers import SMALL

from dapo_exp import fixes, objective, rundir
from dapo_exp.config import ConfigError
from dapo_exp.fixes.base import Fix, GroupFilter, Out
from dapo_exp.train import train

CALLS: dict[str, list] = {}
# The evaluations no assertion here reads, shrunk: no evaluation of the base policy, the final one on 1 sample per
# problem (helpers.SMALL's 8 x 8 was about half of a 2-step run's compute); the final evaluation still runs.
CHEAP_EVAL = ("eval.before_training=false", "eval.final_samples=1")


def _record(name, value):
    CALLS.setdefault(name, []).append(value)
    return value


def _plain_pg(logp, old_logp, advantages, *, mask):
    """An unclipped policy gradient, -r A per token (no clip flag ever set), logging the tokens whose ratio
    moved past 1.2 (what a clip would have bounded): a surrogate's own metric, summed over micro-batches."""
    ratio = torch.exp(logp - old_logp)
    adv = advantages if advantages.dim() == 2 else advantages[:, None]
    never = torch.zeros_like(ratio, dtype=torch.bool)
    _record("surrogate", tuple(logp.shape))
    return Out(objective.SurrogateOut(-ratio * adv, ratio, never, never, never),
               {"actor/plain_pg_tokens": mask.sum(), "actor/plain_pg_past_1.2": ((ratio > 1.2) & mask.bool()).sum()})


def _entropy_bonus(*, logp, old_logp, entropy, mask, weights, coef):
    """An entropy bonus, ``-coef x`` the policy's entropy under the run's normaliser, logging that entropy as a
    metric of its own (no step of the loop names it)."""
    _record("loss_term", tuple(entropy.shape))
    assert entropy.requires_grad  # the policy's entropy, with its gradient
    ent = objective.aggregate_loss(entropy, mask, weights=weights)
    return Out(-coef * ent, {"actor/entropy_bonus": ent})


def _bonus(*, lengths, correct, texts, value):
    """A constant bonus, logging the share of responses that hold an ``Answer:`` line (the slot sees the texts)."""
    assert len(texts) == len(lengths) and all(isinstance(t, str) for t in texts)
    bonus = _record("reward", torch.full_like(lengths, value))
    return Out(bonus, {"reward/answer_line_frac": sum("Answer:" in t for t in texts) / len(texts)})


def _loo(rewards, *, lengths, parts):
    """A leave-one-out baseline (an estimator), logging the mean response length it was given."""
    assert lengths.shape == rewards.shape and set(parts) >= {"accuracy"}
    torch.testing.assert_close(sum(parts.values()), rewards)  # the components add up to the reward
    G = rewards.shape[1]
    adv = _record("estimator", (rewards - rewards.mean(1, keepdim=True)) * G / (G - 1))
    return Out(adv, {"est/len_mean": lengths.mean()})


def _scaled(adv, rewards, *, factor):
    """Scale the advantages, logging the scale as a metric of its own."""
    _record("advantage", adv * factor)
    return Out(adv * factor, {"actor/adv_scale": factor})


# name, short, slot, its hook (bound from the ext value), a metric it logs
EXTENSIONS = [
    ("const_bonus", "bonus", "reward",
     lambda v: functools.partial(_bonus, value=float(v)), "reward/const_bonus_mean"),
    ("loo_est", "looe", "estimator", lambda v: _loo, "est/len_mean"),
    ("adv_scale", "advx", "advantage", lambda v: functools.partial(_scaled, factor=float(v)), "actor/adv_scale"),
    ("keep_all", "keep", "group_filter",
     lambda v: GroupFilter(keep=lambda correct, reward: Out(
         _record("group_filter", torch.ones(len(correct), dtype=bool)), {"group_filter/kept_frac": 1.0}),
                           max_rounds=int(v)),
     "dynamic_sampling/gen_rounds"),
    ("first_tokens", "ftok", "token_mask",
     lambda v: lambda mask, truncated: _record("token_mask", mask * (torch.arange(mask.shape[1]) < int(v))),
     "actor/masked_token_frac"),
    ("plain_pg", "ppg", "surrogate", lambda v: _plain_pg, "actor/pg_clipfrac_higher"),
    ("sum_norm", "snorm", "normaliser",
     lambda v: lambda mask, group_index: Out(_record("normaliser", torch.full((mask.shape[0],), 1.0 / float(v))),
                                             {"norm/rows": float(mask.shape[0])}),
     "norm/rows"),
    ("keep_first", "kfirst", "update_mask",
     lambda v: lambda entropy, mask: Out(_record("update_mask", mask.bool() & (torch.arange(mask.shape[1]) < int(v))),
                                         {"keep_first/width": float(v)}),
     "actor/update_mask_kept_frac"),
    ("const_weight", "cweight", "rollout_weight",
     lambda v: lambda old_logp, engine_logp, mask: Out(_record("rollout_weight", torch.full_like(old_logp, float(v))),
                                                       {"const_weight/rows": float(old_logp.shape[0])}),
     "actor/rollout_weight_mean"),
    ("entropy_bonus", "entb", "loss_term", lambda v: functools.partial(_entropy_bonus, coef=float(v)),
     "actor/entropy_bonus"),
]


def _fix(name, short, slot, hook, metric):
    return Fix(name=name, short=short, title=name, paper="(test)", keys=(f"ext.{name}",),
               is_on=lambda a: name in a.ext, slots=(slot,), bind=lambda algo, run: {slot: hook(algo.ext[name])},
               metrics=(metric,))


VALUES = {"const_bonus": 0.5, "loo_est": 1, "adv_scale": 2.0, "keep_all": 3, "first_tokens": 2, "plain_pg": 1, "sum_norm": 100.0,
          "keep_first": 2, "const_weight": 0.5, "entropy_bonus": 0.1}


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
        s = train(small_cfg(runs / name, "fixes=grpo", *CHEAP_EVAL, extensions.searchpath, f"+{name}=enabled"))
        assert s["status"] == "finished" and s["label"] == short, name
        assert s["switches"] == {k: k == name for k in fixes.FIXES}, name
        assert CALLS.get(slot), f"the {slot} hook of {name} was never called"
        trained = [r for r in _rows(runs / name) if "reward/mean" in r]
        assert len(trained) == 2 and all(metric in r for r in trained)
        if slot == "reward":  # the bonus is added to the +1/-1 correctness reward of every response
            assert all(r["reward/const_bonus_mean"] == 0.5 for r in trained)
            assert all(r["reward/mean"] == pytest.approx(2 * r["reward/acc_mean"] - 1 + 0.5, abs=1e-6) for r in trained)
            assert all(0 < r["reward/answer_line_frac"] <= 1 for r in trained)  # its own metric, from the texts
        if slot == "group_filter":  # its own metric, from its keep
            assert all(r["group_filter/kept_frac"] == 1.0 for r in trained)
        if slot == "token_mask":  # only the first 2 tokens of each response count
            assert all(r["actor/masked_token_frac"] > 0 for r in trained)
        if slot == "update_mask":  # the first 2 tokens of each response carry the policy gradient
            assert all(0 < r["actor/update_mask_kept_frac"] < 1 for r in trained)
            # its own metric: once per mini-batch, summed per mini-batch, mean over updates (one call each)
            assert all(r["keep_first/width"] == 2.0 for r in trained)
        if slot == "rollout_weight":
            assert all(r["actor/rollout_weight_mean"] == 0.5 for r in trained)
            # its own metric: once per micro-batch (its rows), summed over a mini-batch's: the mini-batch's rows
            assert all(r["const_weight/rows"] == 8.0 for r in trained)
        if slot == "normaliser":  # its own metric: once per mini-batch, the mini-batch's rows
            assert all(r["norm/rows"] == 8.0 for r in trained)
        if slot == "surrogate":
            assert all(r["actor/pg_clipfrac_higher"] == 0 and r["actor/pg_clipfrac_lower"] == 0 for r in trained)
            # its own metrics: the loss tokens of each optimizer step (summed over its micro-batches), and a count
            assert all(r["actor/plain_pg_tokens"] > 0 and 0 <= r["actor/plain_pg_past_1.2"] <= r["actor/plain_pg_tokens"]
                       for r in trained)
        if slot == "advantage":
            assert all(r["actor/adv_scale"] == 2.0 for r in trained)
        if slot == "estimator":  # its own metric: the mean response length of the trained batch
            assert all(r["est/len_mean"] == pytest.approx(r["response_length/mean"], rel=1e-5) for r in trained)
        if slot == "loss_term":  # the entropy the term saw: per-token entropies of a few nats, > 0
            assert all(0 < r["actor/entropy_bonus"] < 20 for r in trained)
    train(small_cfg(runs / "grpo", "fixes=grpo", *CHEAP_EVAL))
    first = {name: next(r for r in _rows(runs / name) if "reward/mean" in r) for name in ("grpo", "entropy_bonus")}
    assert first["entropy_bonus"]["reward/mean"] == first["grpo"]["reward/mean"]  # step 1: the same rollouts
    assert first["entropy_bonus"]["actor/grad_norm"] != first["grpo"]["actor/grad_norm"]  # the bonus has a gradient
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
    with pytest.raises(ConfigError, match="algo.ext.const_bonus is read by no registered fix"):
        train(small_cfg(tmp_path, "+algo.ext.const_bonus=0.5"))
    assert not (tmp_path / rundir.SUMMARY).exists()  # refused before the run directory was touched


def test_a_new_slot_reaches_the_plan_with_no_edit_of_compose(tmp_path, small_cfg, monkeypatch):
    """A new slot is its declaration, a plan method and a call site: a slot declared in SLOTS and a fix of it
    reach the plan's hooks with no edit of compose() (its hook is there, bound, under the fix's name)."""
    from dapo_exp import compose
    from dapo_exp.fixes.base import Fix, RunInfo, Slot

    monkeypatch.setitem(fixes.SLOTS, "after_update", Slot("(*, step) -> None", exclusive=False))
    hook = functools.partial(_shifted, by=0.0)
    fix = Fix(name="after_update_test", short="au", title="t", paper="-", slots=("after_update",),
              is_on=lambda a: True, bind=lambda algo, run: {"after_update": hook})
    monkeypatch.setitem(fixes.FIXES, fix.name, fix)
    cfg = small_cfg(tmp_path)
    plan = compose.compose(cfg.algo, RunInfo(max_response_len=cfg.rollout.max_response_len,
                                             group_size=cfg.rollout.n, seed=0))
    assert plan.chain("after_update") == (hook,)
    assert plan.named("after_update") == {"after_update_test": hook}
    assert plan.one("surrogate") is not None and plan.chain("token_mask") == ()  # GRPO's pieces, no other hook


def test_a_metric_a_fix_declares_and_nothing_logs_is_refused():
    from dapo_exp.compose import Plan

    plan = Plan.of(surrogate=objective.clipped_surrogate, declared={"mine": ("actor/mine",)})
    plan.check_logged({"actor/mine": 1.0})
    with pytest.raises(RuntimeError, match=r"not logged: actor/mine \(fix mine\)"):
        plan.check_logged({"actor/pg_loss": 0.1})


def _shifted(adv, rewards, *, by):
    """Shift the advantages (a transform with no metric of its own)."""
    return adv + by


def test_the_plan_merges_its_hooks_metrics_and_chains_the_transforms_in_order():
    """Advantage transforms apply in registry order to what the one before gave (never a recompute): a scaling
    then a shift is ``2 A + 1``, the other order ``2 (A + 1)``; the scaling's metric comes back."""
    from dapo_exp.compose import Plan

    rewards = torch.tensor([[1.0, -1.0, -1.0, 1.0], [1.0, 1.0, 1.0, -1.0]])
    grpo = objective.group_advantages(rewards)
    for hooks, want in (((functools.partial(_scaled, factor=2.0), functools.partial(_shifted, by=1.0)), 2 * grpo + 1),
                        ((functools.partial(_shifted, by=1.0), functools.partial(_scaled, factor=2.0)), 2 * (grpo + 1))):
        adv, metrics = Plan.of(advantage=hooks).advantage(rewards)
        torch.testing.assert_close(adv, want, rtol=1e-6, atol=1e-6)
        assert metrics == {"actor/adv_scale": 2.0}


ADV_CLIP = '''"""Advantage clipping: each advantage clipped to [-adv_clip, adv_clip] (an advantage transform)."""

from __future__ import annotations

import functools

from dapo_exp.fixes.base import Fix, Key, Out, check_range, register_fix


def _clip(advantages, rewards, *, bound):
    clipped = advantages.clamp(-bound, bound)
    return Out(clipped, {"actor/adv_clipped_frac": float((clipped != advantages).float().mean())})


FIX = register_fix(Fix(
    name="adv_clip", short="aclip", title="Advantage clipping", paper="(practice)",
    schema=(Key("adv_clip", float | None, None, "clip each advantage to [-adv_clip, adv_clip], null = off"),),
    is_on=lambda a: a.adv_clip is not None, slots=("advantage",),
    bind=lambda algo, run: {"advantage": functools.partial(_clip, bound=algo.adv_clip)},
    check=lambda algo, run: check_range(algo, ("adv_clip", "> 0 or null", lambda v: v is None or v > 0)),
    metrics=("actor/adv_clipped_frac",),
))
'''

VERL_REFUSAL = ("from dapo_exp.backends import verl\nfrom dapo_exp.hydra_setup import compose_config\n"
                "try:\n    verl.translate(compose_config(['backend=verl', 'adv_clip=enabled']), label='x')\n"
                "except verl.Untranslatable as e:\n    print(e)\n")


@pytest.mark.slow
def test_a_fix_inside_the_package_is_its_module_its_config_group_and_one_defaults_line(tmp_path, warm_cache):
    """docs/how-to/extend.md's three files, added to a copy of the package and conf/ (nothing else edited):
    the schema has the fix's key, a bad value is refused naming it, and a run with it on trains, logs the
    fix's own metric and carries its switch and label; a verl job with it on is refused naming the fix."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    src, repo = Path(__file__).resolve().parents[1], tmp_path / "repo"
    for part in ("dapo_exp", "conf", "hydra_plugins"):
        shutil.copytree(src / part, repo / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(src / "run.py", repo)
    (repo / "dapo_exp/fixes/adv_clip.py").write_text(ADV_CLIP)  # 1: the module
    (repo / "conf/adv_clip").mkdir()  # 2: the config group
    (repo / "conf/adv_clip/enabled.yaml").write_text("# @package algo\nadv_clip: 0.5\n")
    (repo / "conf/adv_clip/disabled.yaml").write_text("# @package algo\nadv_clip: null\n")
    defaults = (repo / "conf/config.yaml").read_text()  # 3: one defaults line
    (repo / "conf/config.yaml").write_text(defaults.replace("  - rollout_correction: null",
                                                            "  - adv_clip: null\n  - rollout_correction: null", 1))

    def run(*args: str) -> subprocess.CompletedProcess:
        small = [*SMALL, f"model.cache_dir={warm_cache}"]
        return subprocess.run([sys.executable, "run.py", *small, *args], cwd=repo, capture_output=True, text=True,
                              timeout=600, env={**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"})

    bad = run("adv_clip=enabled", "algo.adv_clip=-1", f"hydra.run.dir={tmp_path / 'bad'}")
    assert bad.returncode == 2 and "algo.adv_clip: must be > 0 or null, got -1" in bad.stderr, bad.stderr[-2000:]
    verl = subprocess.run([sys.executable, "-c", VERL_REFUSAL], cwd=repo, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(repo)})
    assert verl.returncode == 0 and "fix 'adv_clip'" in verl.stdout and "backend=native" in verl.stdout, verl.stderr
    ok = run("fixes=grpo", "adv_clip=enabled", *CHEAP_EVAL, f"hydra.run.dir={tmp_path / 'run'}")
    assert ok.returncode == 0, ok.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / rundir.SUMMARY).read_text())
    assert summary["switches"]["adv_clip"] and summary["label"] == "aclip"
    trained = [r for r in _rows(tmp_path / "run") if "reward/mean" in r]
    assert len(trained) == 2 and all(0 <= r["actor/adv_clipped_frac"] <= 1 for r in trained)
