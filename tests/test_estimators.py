"""verl's advantage estimators as switches of the ``estimator`` slot: each on a hand-computed example, each
training two CPU steps and logging its metrics, ReMax's greedy baseline decoded and scored by the rollout, the ones
the trainer cannot run (GAE, the optimal token baseline) and the meaningless combinations refused before compute
naming why, and their verl translations (the refusals included). Parity with verl's own functions:
tests/test_verl_parity_estimators.py."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dapo_exp import fixes, rundir
from dapo_exp.config import ConfigError
from dapo_exp.fixes import gdpo, grpo_passk, opo, reinforce_pp, remax, rloo
from dapo_exp.train import preflight, train

ESTIMATORS = ["rloo", "reinforce_pp", "opo", "grpo_passk", "gdpo", "remax"]
REFUSED = {"gae": "critic", "optimal_token_baseline": "per-token", "bypass_mode": "recomputes"}
R = torch.tensor([[1.0, -1.0, -1.0, 1.0], [1.0, 1.0, 1.0, -1.0]])
L = torch.tensor([[2.0, 4.0, 1.0, 1.0], [3.0, 1.0, 1.0, 3.0]])


def test_rloo_is_the_leave_one_out_baseline():
    adv, m = rloo.leave_one_out(R)
    # row 0: 1 - (-1 - 1 + 1) / 3 = 4/3, -1 - (1 - 1 + 1) / 3 = -4/3; row 1: 1 - 1/3 = 2/3, -1 - 1 = -2
    torch.testing.assert_close(adv, torch.tensor([[4 / 3, -4 / 3, -4 / 3, 4 / 3], [2 / 3, 2 / 3, 2 / 3, -2.0]]))
    assert m["estimator/zero_adv_frac"] == 0


def test_reinforce_pp_whitens_over_the_batchs_tokens():
    adv, m = reinforce_pp.reinforce_pp(R, lengths=L)
    # 16 tokens: 8 with reward +1 (row 0: 2 + 1, row 1: 3 + 1 + 1), 8 with -1 (row 0: 4 + 1, row 1: 3)
    n, s = 16.0, 0.0  # sum L R = 8 - 8
    mean = s / (n + 1e-8)
    var = (n * 1.0) / (n + 1e-8) * n / (n - 1)  # every (R - 0)^2 = 1
    torch.testing.assert_close(adv, (R - mean) / math.sqrt(var + 1e-8))
    torch.testing.assert_close(m["estimator/whiten_std"], torch.tensor(math.sqrt(var)))
    base, _ = reinforce_pp.reinforce_pp(R, lengths=L, baseline=True)
    centred = R - R.mean(1, keepdim=True)  # row 0: +-1, row 1: 0.5, 0.5, 0.5, -1.5
    mu = float((L * centred).sum() / (n + 1e-8))
    v = float((L * (centred - mu) ** 2).sum() / (n + 1e-8) * n / (n - 1))
    torch.testing.assert_close(base, (centred - mu) / math.sqrt(v + 1e-8))


def test_opo_subtracts_the_length_weighted_mean():
    adv, m = opo.length_weighted(R, lengths=L)
    # row 0: (2 - 4 - 1 + 1) / 8 = -0.25; row 1: (3 + 1 + 1 - 3) / 8 = 0.25
    torch.testing.assert_close(adv, R - torch.tensor([[-0.25], [0.25]]))
    torch.testing.assert_close(m["estimator/baseline_mean"], torch.tensor(0.0))
    one, _ = opo.length_weighted(torch.tensor([[0.7]]), lengths=torch.tensor([[3.0]]))
    assert one.item() == pytest.approx(0.7)  # a group of one keeps its reward, as verl's


def test_grpo_passk_gives_only_the_best_its_margin():
    r = torch.tensor([[1.0, -1.0, -1.0, -1.0], [1.0, 1.0, -1.0, -1.0], [0.2, 0.9, 0.5, 0.1]])
    adv, m = grpo_passk.best_margin(r, norm_std=False)
    torch.testing.assert_close(adv, torch.tensor([[2.0, 0, 0, 0], [0, 0, 0, 0], [0, 0.4, 0, 0]]))
    assert m["estimator/zero_adv_frac"] == pytest.approx(10 / 12)
    adv, _ = grpo_passk.best_margin(r[:1], norm_std=True, eps=1e-6)
    assert adv[0, 0].item() == pytest.approx(2.0 / (1.0 + 1e-6))  # std of (1, -1, -1, -1) = 1


def test_gdpo_normalises_each_component_apart():
    acc = torch.tensor([[1.0, -1.0], [1.0, 1.0]])
    pen = torch.tensor([[0.0, -0.5], [-0.2, 0.0]])
    lengths = torch.tensor([[1.0, 1.0], [1.0, 1.0]])
    adv, m = gdpo.decoupled(acc + pen, lengths=lengths, parts={"accuracy": acc, "overlong_punishment": pen})
    # accuracy: row 0 centred +-1, std sqrt(2); row 1 all equal -> 0. Penalty: row 0 centred +-0.25, std sqrt(0.125);
    # row 1 centred -+0.1, std sqrt(0.02). Each divided by (std + 1e-6), summed, whitened (every length 1: mean 0)
    a, p, q = 1 / (math.sqrt(2) + 1e-6), 0.25 / (math.sqrt(0.125) + 1e-6), 0.1 / (math.sqrt(0.02) + 1e-6)
    total = torch.tensor([[a + p, -a - p], [-q, q]])
    var = float((total ** 2).sum()) / (4 + 1e-8) * 4 / 3
    torch.testing.assert_close(adv, total / math.sqrt(var + 1e-8))
    assert m["estimator/components"] == 2.0


def test_remax_subtracts_the_greedy_responses_reward():
    adv, m = remax.greedy_baseline(R, baseline=torch.tensor([1.0, -1.0]))
    # row 0 against a correct greedy response: 0 where correct, -2 where not; row 1 against a wrong one: +2 or 0
    torch.testing.assert_close(adv, torch.tensor([[0.0, -2.0, -2.0, 0.0], [2.0, 2.0, 2.0, 0.0]]))
    assert m["estimator/zero_adv_frac"] == pytest.approx(3 / 8) and m["remax/baseline_reward"] == 0
    one, _ = remax.greedy_baseline(torch.tensor([[0.5], [-1.0]]), baseline=torch.tensor([0.25, -1.0]))
    torch.testing.assert_close(one, torch.tensor([[0.25], [0.0]]))  # a group of one: the baseline is not the group


def test_a_plan_that_reads_a_greedy_baseline_refuses_a_batch_without_one(small_cfg, tmp_path):
    plan = preflight(small_cfg(tmp_path, "fixes=grpo", "remax=enabled"))
    assert plan.greedy_baseline and not preflight(small_cfg(tmp_path, "fixes=grpo")).greedy_baseline
    with pytest.raises(ValueError, match="greedy baseline .* none was passed"):
        plan.advantage(R)
    torch.testing.assert_close(plan.advantage(R, baseline=torch.tensor([1.0, -1.0])).value[1], torch.full((4,), 2.0)
                               - torch.tensor([0.0, 0.0, 0.0, 2.0]))


def _greedy_by_argmax(model, prompt: list[int], max_new: int, eos: set[int]) -> list[int]:
    """The greedy response, one forward of the whole sequence per token (no cache, no generate)."""
    ids, out = list(prompt), []
    with torch.no_grad():
        for _ in range(max_new):
            nxt = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            out.append(nxt)
            ids.append(nxt)
            if nxt in eos:
                break
    return out


@pytest.mark.slow
def test_remax_baseline_is_the_scored_reward_of_the_argmax_response(small_cfg, tmp_path):
    """The rollout decodes one greedy response per prompt (whatever the seed or keys) and scores it like the
    samples, the reward terms included: each group's baseline is the reward of the argmax response."""
    from dapo_exp import runner
    from dapo_exp.build import build_run
    from dapo_exp.rollout.engine import SamplingSpec
    from dapo_exp.tasks.verifier import reward_of
    from dapo_exp.train import rollout_groups

    cfg = small_cfg(tmp_path, "fixes=grpo", "remax=enabled", "overlong_punishment=soft", "rollout.max_response_len=12",
                    "algo.overlong_cache_len=6", "train.randomness=keyed")
    cleanup = []
    run = build_run(cfg, preflight(cfg), tmp_path, "remax", cleanup)
    try:
        assert run.model.generation_config.min_new_tokens in (None, 0)  # no EOS ban for the loop below
        groups, *_ = rollout_groups(run, runner.resume(run), step=1)
        prompts = [g.prompt_ids for g in groups]
        eos = run.engine.eos_ids
        want = [_greedy_by_argmax(run.model, p, 12, eos) for p in prompts]
        for seed, keys in ((0, None), (7, list(range(len(prompts))))):
            gens = run.engine.generate(prompts, SamplingSpec(n=1, max_new_tokens=12, greedy=True, seed=seed, keys=keys))
            assert gens.response_ids == want
        texts = run.tokenizer.batch_decode(want, skip_special_tokens=True)
        results = run.verifier.verify_batch(texts, [run.answers[g.prompt_index] for g in groups])
        terms, _ = run.plan.reward(lengths=torch.tensor([len(w) for w in want], dtype=torch.float32),
                                   correct=torch.tensor([r.correct for r in results]), texts=texts)
        expect = [reward_of(r) + float(terms["overlong_punishment"][i]) for i, r in enumerate(results)]
        assert [g.baseline for g in groups] == pytest.approx(expect)
        assert any(float(terms["overlong_punishment"][i]) < 0 for i in range(len(want))) or all(
            len(w) <= 6 for w in want)  # the term is part of the baseline where a greedy response runs long
    finally:
        for close in reversed(cleanup):
            close()


@pytest.mark.slow
@pytest.mark.parametrize("name, option", [("rloo", "enabled"), ("reinforce_pp", "enabled"),
                                          ("reinforce_pp", "baseline"), ("opo", "enabled"),
                                          ("grpo_passk", "enabled"), ("gdpo", "enabled"), ("remax", "enabled")])
def test_each_estimator_trains_two_steps_and_logs_its_metrics(tmp_path, small_cfg, name, option):
    fix = fixes.FIXES[name]
    extra = ["overlong_punishment=soft"] if name == "gdpo" else []  # two components to normalise apart
    cfg = small_cfg(tmp_path, "fixes=grpo", f"{name}={option}", *extra)
    s = train(cfg)
    assert s["status"] == "finished" and s["switches"][name]
    rows = [json.loads(x) for x in (tmp_path / rundir.METRICS).read_text().splitlines()]
    trained = [r for r in rows if "actor/pg_loss" in r]
    assert len(trained) == 2
    for r in trained:
        assert math.isfinite(r["actor/pg_loss"]) and all(m in r for m in fix.metrics)
        assert 0 <= r["estimator/zero_adv_frac"] <= 1
    if name == "gdpo":
        assert trained[0]["estimator/components"] == 2.0
    if name == "remax":  # the greedy responses' tokens count in the generation's total, beside the samples'
        assert all(-1 <= r["remax/baseline_reward"] <= 1 for r in trained)
        first = trained[0]
        greedy = first["compute/greedy_gen_tokens"]
        assert 1 <= greedy <= first["dynamic_sampling/kept_groups"] * cfg.rollout.max_response_len
        sampled = first["response_length/mean"] * first["dynamic_sampling/rollouts_generated"]
        assert first["compute/gen_tokens_total"] == pytest.approx(sampled + greedy)
    else:
        assert all("compute/greedy_gen_tokens" not in r for r in trained)


@pytest.mark.parametrize("name, why", REFUSED.items())
def test_what_the_trainer_cannot_run_is_refused_naming_why(small_cfg, tmp_path, name, why):
    with pytest.raises(ConfigError, match=rf"^{name}: not supported, .*{why}"):
        preflight(small_cfg(tmp_path, "fixes=grpo", f"{name}=enabled"))
    preflight(small_cfg(tmp_path, "fixes=grpo", f"{name}=disabled"))


@pytest.mark.parametrize("overrides, match", [
    (["rloo=enabled", "opo=enabled"], "rloo and opo cannot be combined .both fill the estimator slot"),
    (["rloo=enabled", "dr_grpo_adv=enabled"], "dr_grpo_adv and rloo .*algo.adv_norm_std is not read"),
    (["reinforce_pp=baseline", "dr_grpo_adv=enabled"], "dr_grpo_adv and reinforce_pp .*not the group's"),
    (["opo=enabled", "dr_grpo_adv=enabled"], "dr_grpo_adv and opo .*algo.adv_norm_std is not read"),
    (["rloo=enabled", "rollout.n=1", "train.mini_batch_size=4"], "rloo: .*rollout.n >= 2"),
    (["grpo_passk=enabled", "rollout.n=1", "train.mini_batch_size=4"], "grpo_passk: .*rollout.n >= 2"),
    (["remax=enabled", "dr_grpo_adv=enabled"], "dr_grpo_adv and remax .*algo.adv_norm_std is not read"),
    (["remax=enabled", "rloo=enabled"], "rloo and remax cannot be combined .both fill the estimator slot"),
])
def test_meaningless_combinations_fail_before_compute(small_cfg, tmp_path, overrides, match):
    with pytest.raises(ConfigError, match=match):
        preflight(small_cfg(tmp_path, "fixes=grpo", *overrides))


def test_what_composes_composes(small_cfg, tmp_path):
    for extra in (["grpo_passk=enabled", "dr_grpo_adv=enabled"], ["gdpo=enabled", "dr_grpo_adv=enabled"],
                  ["fixes=full", "rloo=enabled"], ["fixes=full", "reinforce_pp=baseline"], ["fixes=rloo"],
                  ["fixes=reinforce_pp"], ["fixes=full", "remax=enabled"],
                  ["remax=enabled", "rollout.n=1", "train.mini_batch_size=4"]):
        preflight(small_cfg(tmp_path, "fixes=grpo", *extra))


def test_presets_are_their_switches():
    from dapo_exp.hydra_setup import preset_switches

    for preset in ("rloo", "reinforce_pp"):
        assert preset in fixes.PRESETS and preset in fixes.FAMILY
        assert {k for k, v in preset_switches(preset).items() if v} == {preset}


def _paper(*overrides):
    from test_backend import paper

    return paper(*overrides)


@pytest.mark.parametrize("overrides, expect", [
    (["fixes=rloo"], {"algorithm.adv_estimator": "rloo"}),
    (["fixes=reinforce_pp"], {"algorithm.adv_estimator": "reinforce_plus_plus", "algorithm.gamma": 1.0}),
    (["fixes=grpo", "reinforce_pp=baseline"], {"algorithm.adv_estimator": "reinforce_plus_plus_baseline"}),
    (["fixes=grpo", "opo=enabled"], {"algorithm.adv_estimator": "opo"}),
    (["fixes=grpo", "grpo_passk=enabled", "dr_grpo_adv=enabled"],
     {"algorithm.adv_estimator": "grpo_passk", "algorithm.norm_adv_by_std_in_grpo": False}),
    (["fixes=grpo"], {"algorithm.adv_estimator": "grpo"}),
])
def test_each_estimator_is_verls_setting(overrides, expect):
    from dapo_exp.backends import verl as vb

    values = vb.translate(_paper(*overrides), label="x").values
    assert {k: values[k] for k in expect} == expect


@pytest.mark.parametrize("overrides, match", [
    (["gdpo=enabled"], r"^algo\.gdpo=True .*gdpo_reward_keys"),
    (["remax=enabled"], r"^algo\.remax=True .*greedy"),
    (["gae=enabled"], r"^algo\.gae=True .*critic"),
    (["optimal_token_baseline=enabled"], r"^algo\.optimal_token_baseline=True .*vocabulary"),
    (["bypass_mode=enabled"], r"^algo\.bypass_mode=True .*engine"),
    (["reinforce_pp=enabled", "overlong_filtering=enabled"], r"^algo\.reinforce_pp=True .*Overlong Filtering"),
    (["opo=enabled", "overlong_filtering=enabled"], r"^algo\.opo=True .*Overlong Filtering"),
])
def test_what_verl_cannot_run_as_ours_fails_naming_why(overrides, match):
    from dapo_exp.backends import verl as vb

    with pytest.raises(vb.Untranslatable, match=match):
        vb.translate(_paper("fixes=grpo", *overrides), label="x")
