"""The GRPO family after DAPO as switches: each trains two CPU steps with a finite loss and logs
its metrics, is labelled and tagged by its short name, and bad combinations fail before compute."""

import json
import math

import pytest

from dapo_exp import fixes, rundir
from dapo_exp.config import ConfigError
from dapo_exp.train import preflight, train

FAMILY_SWITCHES = ["dr_grpo_adv", "dr_grpo_norm", "gspo", "cispo", "gmpo", "clip_cov", "kl_cov", "top_entropy",
                   "rollout_correction",
                   "sapo", "gpg", "gpg_adv", "dro", "dppo_tv", "dppo_kl"]


@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILY_SWITCHES)
def test_each_family_fix_trains_two_steps_and_logs_its_metrics(tmp_path, small_cfg, name):
    fix = fixes.FIXES[name]
    s = train(small_cfg(tmp_path, "fixes=grpo", f"{name}=enabled"))
    assert s["status"] == "finished" and s["label"] in (fix.short, name)  # its preset's name where one matches
    assert s["switches"] == {k: k == name for k in fixes.FIXES}
    rows = [json.loads(x) for x in (tmp_path / rundir.METRICS).read_text().splitlines()]
    trained = [r for r in rows if "actor/pg_loss" in r]
    assert len(trained) == 2
    for r in trained:
        assert math.isfinite(r["actor/pg_loss"]) and math.isfinite(r["actor/grad_norm"])
        assert all(m in r for m in fix.metrics), [m for m in fix.metrics if m not in r]


@pytest.mark.slow
def test_a_family_fix_changes_the_update(tmp_path, small_cfg):
    """Same seed, same samples at step 1: GSPO's surrogate gives another loss than PPO's clip."""
    base = train(small_cfg(tmp_path / "grpo", "fixes=grpo", "train.steps=1"))
    gspo = train(small_cfg(tmp_path / "gspo", "fixes=gspo", "train.steps=1"))
    row = {k: [json.loads(x) for x in (tmp_path / k / rundir.METRICS).read_text().splitlines()
               if "actor/pg_loss" in x][0] for k in ("grpo", "gspo")}
    assert row["grpo"]["reward/mean"] == row["gspo"]["reward/mean"]  # same samples
    assert row["grpo"]["actor/grad_norm"] != row["gspo"]["actor/grad_norm"]
    assert base["label"] == "grpo" and gspo["label"] == "gspo"


def _metric_rows(run_dir):
    return [r for r in (json.loads(x) for x in (run_dir / rundir.METRICS).read_text().splitlines())
            if "actor/pg_loss" in r]


@pytest.mark.slow
def test_top_entropy_keeps_the_top_fifth_of_the_tokens(tmp_path, small_cfg):
    """Two CPU steps: about rho = 0.2 of the loss-mask tokens carry a policy gradient (ties at the
    threshold are kept), the threshold is a positive entropy, and the update differs from GRPO's."""
    train(small_cfg(tmp_path / "grpo", "fixes=grpo", "train.steps=1"))
    s = train(small_cfg(tmp_path / "ent", "fixes=grpo", "top_entropy=enabled"))
    assert s["label"] == "ent" and s["switches"]["top_entropy"]
    rows = _metric_rows(tmp_path / "ent")
    for r in rows:
        assert 0.2 <= r["actor/update_mask_kept_frac"] < 0.3
        assert r["actor/update_mask_entropy_min"] > 0 and math.isfinite(r["actor/pg_loss"])
    grpo = _metric_rows(tmp_path / "grpo")[0]
    assert grpo["reward/mean"] == rows[0]["reward/mean"]  # same samples at step 1 ...
    assert grpo["actor/grad_norm"] != rows[0]["actor/grad_norm"]  # ... another gradient
    assert "actor/update_mask_kept_frac" not in grpo


@pytest.fixture
def engine_logprobs(monkeypatch):
    """The HF engine reports a log-prob of -1 for every sampled token (it reports none: it samples with
    the trainer's own weights), so that the trainer-vs-engine ratio exp(old_logp + 1) varies."""
    import dataclasses

    from dapo_exp.rollout.hf.engine import HFEngine

    generate = HFEngine.generate

    def with_logprobs(self, prompt_ids, spec):
        gens = generate(self, prompt_ids, spec)
        return dataclasses.replace(gens, sampled_logprobs=[[-1.0] * len(r) for r in gens.response_ids])

    monkeypatch.setattr(HFEngine, "generate", with_logprobs)


@pytest.mark.slow
@pytest.mark.parametrize("option", ["enabled", "icepop"])
def test_rollout_correction_weights_the_tokens(tmp_path, small_cfg, engine_logprobs, option):
    s = train(small_cfg(tmp_path, "fixes=grpo", f"rollout_correction={option}"))
    assert s["status"] == "finished" and s["label"] == "rc"
    for r in _metric_rows(tmp_path):
        assert math.isfinite(r["actor/pg_loss"]) and r["rollout/ratio_max"] > r["rollout/ratio_min"]  # mismatch seen
        if option == "enabled":  # sequence weight min(pi_old(y) / pi_engine(y), 2), no band
            assert 0 < r["actor/rollout_weight_mean"] <= 2.0 and r["actor/rollout_weight_zero_frac"] == 0
        else:  # IcePop: the raw token ratio inside [0.5, 5], 0 outside
            assert 0 < r["actor/rollout_weight_zero_frac"] < 1 and 0 < r["actor/rollout_weight_mean"] <= 5.0


@pytest.mark.slow
def test_rollout_correction_without_engine_logprobs_weighs_one(tmp_path, small_cfg):
    """rollout=hf reports no log-probs (it samples with the trainer's weights): nothing to correct."""
    train(small_cfg(tmp_path / "grpo", "fixes=grpo", "train.steps=1"))
    train(small_cfg(tmp_path / "rc", "fixes=grpo", "rollout_correction=enabled", "train.steps=1"))
    rc, grpo = _metric_rows(tmp_path / "rc")[0], _metric_rows(tmp_path / "grpo")[0]
    assert rc["actor/rollout_weight_mean"] == 1.0 and rc["actor/rollout_weight_zero_frac"] == 0.0
    assert rc["actor/grad_norm"] == grpo["actor/grad_norm"]


def test_top_entropy_excludes_the_sequence_losses(small_cfg, tmp_path):
    with pytest.raises(ConfigError, match=r"fixes (gmpo and top_entropy|top_entropy and gmpo) cannot be combined"):
        preflight(small_cfg(tmp_path, "fixes=grpo", "top_entropy=enabled", "gmpo=enabled"))
    with pytest.raises(ConfigError, match=r"fixes gspo and top_entropy cannot be combined with algo.gspo_form"):
        preflight(small_cfg(tmp_path, "fixes=gspo", "top_entropy=enabled", "algo.gspo_form=sequence"))
    for other in ("gspo", "cispo", "clip_cov", "kl_cov", "full", "dr_grpo"):  # token-wise losses: they combine
        preflight(small_cfg(tmp_path, f"fixes={other}", "top_entropy=enabled", "rollout_correction=icepop"))


def test_dr_grpos_normaliser_has_one_label(small_cfg, tmp_path):
    """algo.loss_agg=seq-mean-token-sum-norm trained Dr. GRPO's normaliser under the token-level loss's label
    (``tl``); it is refused, naming the switch that is that behaviour, which composes as before."""
    with pytest.raises(ConfigError, match=r"algo\.loss_agg=seq-mean-token-sum-norm is Dr\. GRPO's constant normaliser, "
                                          r"the dr_grpo_norm switch: use dr_grpo_norm=enabled token_level_loss=disabled"):
        preflight(small_cfg(tmp_path, "fixes=grpo", "algo.loss_agg=seq-mean-token-sum-norm"))
    with pytest.raises(ConfigError, match=r"algo\.loss_agg='per-token' is not valid; choose one of: "
                                          r"seq-mean-token-mean, token-mean, group-token-mean$"):
        preflight(small_cfg(tmp_path, "fixes=grpo", "algo.loss_agg=per-token"))
    preflight(small_cfg(tmp_path, "fixes=grpo", "dr_grpo_norm=enabled"))


@pytest.mark.parametrize("normaliser", ["token_level_loss", "dr_grpo_norm"])
def test_gmpo_refuses_a_normaliser_that_weights_its_responses_by_length(small_cfg, tmp_path, normaliser):
    """GMPO's objective is the mean over responses of one loss per response (GRPO's aggregation); under a
    token-level or constant normaliser it would be neither GMPO's nor verl's: refused before compute, why named."""
    with pytest.raises(ConfigError, match=rf"fixes (gmpo and {normaliser}|{normaliser} and gmpo) cannot be combined "
                                          r"\(GMPO's objective is a mean over responses of one loss each; a "
                                          r"token-level or constant normaliser would weight each response by its length"):
        preflight(small_cfg(tmp_path, "fixes=grpo", "gmpo=enabled", f"{normaliser}=enabled"))
    preflight(small_cfg(tmp_path, "fixes=gmpo"))  # GMPO as its preset composes it: GRPO's aggregation


@pytest.mark.parametrize("a,b", [("gspo", "cispo"), ("gmpo", "kl_cov"), ("clip_cov", "gspo")])
def test_two_surrogates_fail_before_compute_naming_both(small_cfg, tmp_path, a, b):
    with pytest.raises(ConfigError, match=rf"fixes ({a} and {b}|{b} and {a}) cannot be combined \(both fill the "
                                          "surrogate slot\\)"):
        preflight(small_cfg(tmp_path, "fixes=grpo", f"{a}=enabled", f"{b}=enabled"))


@pytest.mark.parametrize("other", ["gspo", "cispo", "gmpo", "kl_cov"])
def test_clip_higher_excludes_the_surrogates_that_ignore_its_range(small_cfg, tmp_path, other):
    with pytest.raises(ConfigError, match=rf"clip_higher and {other} cannot be combined \(they exclude each other\)"):
        preflight(small_cfg(tmp_path, "fixes=grpo", "clip_higher=enabled", f"{other}=enabled"))


def test_what_combines_composes(small_cfg, tmp_path):
    """Clip-Higher's range applies to Clip-Cov's clip; Dr. GRPO's advantage goes with any surrogate;
    its normaliser excludes the Token-level Loss (both are normalisers)."""
    preflight(small_cfg(tmp_path, "fixes=grpo", "clip_higher=enabled", "clip_cov=enabled"))
    preflight(small_cfg(tmp_path, "fixes=gspo", "dr_grpo_adv=enabled"))
    with pytest.raises(ConfigError, match="token_level_loss and dr_grpo_norm cannot be combined"):
        preflight(small_cfg(tmp_path, "fixes=grpo", "token_level_loss=enabled", "dr_grpo_norm=enabled"))


@pytest.mark.parametrize("override,key", [("algo.gspo_form=tokens", "algo.gspo_form"),
                                          ("algo.cispo_eps_low=1.5", "algo.cispo_eps_low"),
                                          ("algo.gmpo_eps_low=-0.1", "algo.gmpo_eps_low"),
                                          ("algo.clip_cov_lb=6", "algo.clip_cov_lb / clip_cov_ub: need lb <= ub"),
                                          ("algo.clip_cov_ratio=2", r"algo.clip_cov_ratio: must be in \[0, 1\], got 2"),
                                          ("algo.kl_cov_coef=-1", "algo.kl_cov_coef: must be >= 0, got -1"),
                                          ("algo.gspo_eps_low=1", r"algo.gspo_eps_low: must be in \[0, 1\), got 1"),
                                          ("algo.top_entropy_rho=0", "algo.top_entropy_rho"),
                                          ("algo.rc_level=row", "algo.rc_level"),
                                          ("algo.rc_aggregation=mean", "algo.rc_aggregation"),
                                          ("algo.rc_cap=0.5", "algo.rc_cap"),
                                          ("algo.rc_band_low=0.5", "algo.rc_band_low / rc_band_high")])
def test_bad_family_values_name_the_key(small_cfg, tmp_path, override, key):
    with pytest.raises(ConfigError, match=key):
        preflight(small_cfg(tmp_path, override))


def test_presets_of_the_family_are_their_switches():
    from dapo_exp.hydra_setup import preset_switches

    expect = {"dr_grpo": {"dr_grpo_adv", "dr_grpo_norm"}, "gspo": {"gspo"}, "cispo": {"cispo"}, "gmpo": {"gmpo"},
              "clip_cov": {"clip_cov"}, "kl_cov": {"kl_cov"}, "rloo": {"rloo"}, "reinforce_pp": {"reinforce_pp"},
              "sapo": {"sapo"}, "gpg": {"gpg", "gpg_adv", "token_level_loss"}, "dro": {"dro"}}
    assert set(fixes.FAMILY) == set(expect)
    for preset, on in expect.items():
        assert {k for k, v in preset_switches(preset).items() if v} == on


def test_a_run_recorded_before_a_fix_existed_has_it_off():
    """The analysis reads old runs: an algo config without a fix's keys reads as that fix off."""
    from omegaconf import OmegaConf

    old = OmegaConf.create({"eps_low": 0.2, "eps_high": 0.28, "loss_agg": "token-mean", "dynamic_sampling": True,
                            "overlong_punishment": "soft", "overlong_cache_len": 16, "overlong_factor": 1.0,
                            "overlong_max_len": None, "overlong_filtering": False, "ds_signal": "acc",
                            "ds_max_rounds": 10, "ds_on_cap": "error", "ds_surplus": "discard", "ds_oversample": 1.0})
    on = fixes.switches(old)
    assert [k for k, v in on.items() if v] == ["clip_higher", "dynamic_sampling", "token_level_loss",
                                               "overlong_punishment"]


def test_a_half_fraction_over_three_family_switches_is_generated_and_its_effects_estimated(tmp_path, small_cfg):
    """The design generator takes any compatible registered switches (``design fractional --switches``);
    the attribution code, unchanged, estimates their main effects from run directories."""
    import json as _json

    import numpy as np
    from fixtures_runs import make_switch_run
    from omegaconf import OmegaConf

    from dapo_exp.analysis import design as D
    from dapo_exp.analysis.effects import fit_effects
    from dapo_exp.analysis.runs import load_runs
    from dapo_exp.config import AlgoConfig

    chosen = ["dr_grpo_adv", "gspo", "top_entropy"]
    design = D.make_design("fractional", chosen)
    assert list(design.columns) == chosen and len(design) == 4 == len(design.drop_duplicates())
    assert (design["top_entropy"] == (design["dr_grpo_adv"] == design["gspo"])).all()  # I = abc, c = ab
    lines = D.job_overrides(design)
    assert "dr_grpo_adv=enabled gspo=enabled top_entropy=enabled" in lines
    for line in lines:  # every configuration composes and passes the registry's combination check
        preflight(small_cfg(tmp_path / "cfg", "fixes=grpo", *line.split()))
    truth = {"dr_grpo_adv": 4.0, "gspo": -10.0, "top_entropy": 2.0}  # percentage points, off -> on
    for i, row in design.iterrows():
        for seed in range(3):
            # + a seed block + a residual that sums to 0 over each configuration's seeds
            acc = 40 + sum(v / 2 * (1 if row[s] else -1) for s, v in truth.items()) + seed + ((seed + i) % 3 - 1)
            correct = np.arange(100)[:, None] < round(acc)  # 100 problems x 1 sample, mean = acc / 100
            run = make_switch_run(tmp_path / "runs" / f"c{i}_s{seed}", dict.fromkeys(D.SWITCHES, False), seed, correct)
            summary = run["summary"]
            algo = {**OmegaConf.to_container(OmegaConf.structured(AlgoConfig)), **summary["config"]["algo"],
                    "adv_norm_std": not row["dr_grpo_adv"], "gspo": bool(row["gspo"]),
                    "top_entropy": bool(row["top_entropy"])}
            summary["config"]["algo"] = algo
            summary["switches"] = fixes.switches(OmegaConf.create(algo))
            (run["dir"] / rundir.SUMMARY).write_text(_json.dumps(summary))
    data = load_runs(tmp_path / "runs")
    assert {k for k in chosen if data.runs[k].nunique() == 2} == set(chosen)
    eff = fit_effects(data, model="main", switches=chosen)
    assert eff.design.name == "2^(3-1) fractional factorial, resolution III"
    t = eff.table.set_index("term")
    assert (t["status"] == "estimated").all()
    for s, v in truth.items():
        assert t.loc[s, "effect"] == pytest.approx(v) and t.loc[s, "lo"] < v < t.loc[s, "hi"]
    letters = {s: D.LETTERS[s] for s in chosen}  # registry letters: f = dr_grpo_adv, h = gspo, m = top_entropy
    assert t.loc["gspo", "aliases"] == letters["dr_grpo_adv"] + letters["top_entropy"]  # h = fm, its 2-way alias
    # the whole analysis (python -m dapo_exp.analysis <dir>) finds the varied family switches itself
    from dapo_exp.analysis.report import run_analysis

    result = run_analysis(str(tmp_path / "runs"), out=str(tmp_path / "analysis"), figures=False)
    assert D.switches_in(data.included) == D.SWITCHES + tuple(chosen)
    effects_md = (tmp_path / "analysis" / "effects.md").read_text()
    assert all(f"| {s} " in effects_md for s in chosen), effects_md[:2000]
    assert result is not None


@pytest.mark.parametrize("switches, message", [
    (["gspo", "cispo"], "switches gspo and cispo cannot be factors of one design"),
    (["top_entropy", "gmpo"], "switches top_entropy and gmpo cannot be factors"),
    (["gspo", "nope"], "unknown switch 'nope'"),
    (["gspo"], "two or more distinct switches"),
])
def test_a_design_over_switches_that_cannot_combine_is_refused(switches, message):
    from dapo_exp.analysis import design as D

    with pytest.raises(ValueError, match=message):
        D.make_design("fractional", switches)


def _update(*, micro_batch_size: int, **plan_kw):
    """One update of the tiny model on test_steps' batch (engine log-probs reported), with ``plan_kw``
    given to the Plan: (update stats, the gradient of each optimizer step)."""
    import functools

    import torch
    from test_steps import N_GROUPS, TOKEN_MEAN, G, RecordingSGD, V, make_groups, tiny_qwen2

    from dapo_exp import objective, steps
    from dapo_exp.compose import Plan
    from dapo_exp.logprobs import ResponseForward

    model = tiny_qwen2(vocab=V, dtype=torch.float64)
    plan = Plan.of(surrogate=functools.partial(objective.clipped_surrogate, eps_low=0.2, eps_high=0.28),
                   normaliser=TOKEN_MEAN, **plan_kw)
    batch = steps.build_batch(make_groups(engine_logprobs=True), group_size=G, plan=plan)
    sizes = steps.UpdateSizes(group_size=G, mini_batch_size=G * N_GROUPS, micro_batch_size=micro_batch_size,
                              token_budget=None, ppo_epochs=1, grad_clip=0.0)
    fwd = ResponseForward(pad_id=0, device=torch.device("cpu"))
    old = steps.old_logprobs(model, batch, fwd=fwd, ref_model=None, micro_batch_size=micro_batch_size,
                             token_budget=None, on_policy=steps.on_policy_rows(N_GROUPS, sizes=sizes, seed=3))
    opt = RecordingSGD(model.parameters(), lr=0.5)
    return steps.update_policy(model, opt, batch, old, fwd=fwd, plan=plan, sizes=sizes, seed=3), opt.grads


def _same_update(a, b):
    import torch

    assert a[0].pg_loss == pytest.approx(b[0].pg_loss, rel=1e-6, abs=1e-9)  # float32 log-softmax
    assert len(a[1]) == len(b[1]) == a[0].n_updates
    for ga, gb in zip(a[1], b[1]):
        for x, y in zip(ga, gb):
            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-9)


def test_top_entropy_selects_over_the_mini_batch_whatever_its_micro_batches():
    """The entropy threshold is the mini-batch's (a no-grad forward of all of it first): one micro-batch
    or four give the same kept tokens, loss and gradient; about rho of the tokens are kept."""
    import functools

    from dapo_exp import objective

    mask = functools.partial(objective.top_entropy_mask, rho=0.2)
    whole, split = _update(micro_batch_size=16, update_mask=(mask,)), _update(micro_batch_size=4, update_mask=(mask,))
    _same_update(whole, split)
    upd = whole[0]
    assert upd.n_kept == split[0].n_kept and 0.2 <= upd.n_kept / upd.n_tokens < 0.25
    assert upd.keep_minibatches == 1 and upd.keep_entropy_min > 0
    plain = _update(micro_batch_size=16)
    assert plain[0].n_kept is None and plain[0].pg_loss != pytest.approx(upd.pg_loss)


def test_token_level_rollout_correction_is_the_truncated_is_weight():
    """rollout_correction at token level with cap C (no band) is truncated IS with cap C
    (objective.truncated_is_weights, Yao et al.), through the update."""
    import functools

    from dapo_exp import objective

    weight = functools.partial(objective.rollout_correction_weights, level="token", cap=2.0)
    rc = _update(micro_batch_size=4, rollout_weight=weight)
    tis = _update(micro_batch_size=4, rollout_weight=lambda old, engine, mask: objective.truncated_is_weights(
        old, engine, 2.0))
    _same_update(rc, tis)
    assert rc[0].rw_tokens == rc[0].n_tokens and 0 < rc[0].rw_sum <= 2 * rc[0].rw_tokens
    seq = _update(micro_batch_size=4, rollout_weight=functools.partial(objective.rollout_correction_weights, cap=2.0))
    assert seq[0].pg_loss != pytest.approx(tis[0].pg_loss)  # the sequence weight is another one


def test_every_conflicting_pair_is_named_not_only_the_first(small_cfg, tmp_path):
    """Issue 34: gspo=enabled cispo=enabled under the default fixes=full named clip_higher+gspo only."""
    with pytest.raises(ConfigError) as caught:
        preflight(small_cfg(tmp_path, "gspo=enabled", "cispo=enabled"))
    msg = str(caught.value)
    assert msg.startswith("fixes clip_higher, gspo and cispo cannot be combined: ")
    assert "gspo and cispo (both fill the surrogate slot)" in msg and "clip_higher and gspo" in msg


@pytest.mark.parametrize("preset, metric", [("clip_cov", "clip_cov/detached_tokens"),
                                            ("kl_cov", "kl_cov/penalised_tokens")])
def test_the_covariance_fixes_log_the_tokens_they_treat_apart(preset, metric):
    """Clip-Cov's detached and KL-Cov's penalised tokens come back as the surrogate's own metric: the mask's
    tokens its SurrogateOut marks selected (at least one of 60 at a ratio that selects a share of them)."""
    import torch

    from dapo_exp import compose
    from dapo_exp.hydra_setup import compose_config

    cfg = compose_config([f"fixes={preset}", "algo.clip_cov_ratio=0.2", "algo.kl_cov_ratio=0.2",
                          "algo.clip_cov_lb=-100", "algo.clip_cov_ub=100"])
    plan = compose.compose(cfg.algo, compose.run_info(cfg))
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(6, 10, generator=g, dtype=torch.float64)
    old = logp + 0.05 * torch.randn(6, 10, generator=g, dtype=torch.float64)
    adv = torch.randn(6, 1, generator=g, dtype=torch.float64).expand(6, 10)
    mask = torch.ones(6, 10)
    mask[0, 5:] = 0
    out, metrics = plan.token_losses(logp, old, adv, mask=mask)
    assert set(metrics) == {metric} and metrics[metric] == (out.selected & mask.bool()).sum() >= 1
    assert not out.selected[0, 5:].any()  # nothing outside the mask


# --------------------------------------------------------------------------- #
# verl's policy losses (SAPO, GPG, DRO, DPPO) and GPG's estimator               #
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("loss", ["sapo", "gpg", "dro", "dppo_tv", "dppo_kl"])
def test_verls_losses_exclude_clip_higher_and_the_other_surrogates(small_cfg, tmp_path, loss):
    with pytest.raises(ConfigError, match=rf"fixes clip_higher and {loss} cannot be combined \((SAPO|GPG|DRO|DPPO)"):
        preflight(small_cfg(tmp_path, "fixes=grpo", "clip_higher=enabled", f"{loss}=enabled"))
    with pytest.raises(ConfigError, match=rf"fixes ({loss} and gspo|gspo and {loss}) cannot be combined \(both fill "
                                          r"the surrogate slot\)"):
        preflight(small_cfg(tmp_path, "fixes=grpo", "gspo=enabled", f"{loss}=enabled"))
    preflight(small_cfg(tmp_path, "fixes=grpo", f"{loss}=enabled", "dynamic_sampling=enabled",
                        "overlong_punishment=soft", "overlong_filtering=enabled", "rollout_correction=enabled"))


@pytest.mark.parametrize("normaliser", ["token_level_loss", "dr_grpo_norm"])
def test_sapo_refuses_a_normaliser_that_weights_its_responses_by_length(small_cfg, tmp_path, normaliser):
    with pytest.raises(ConfigError, match=rf"fixes ({normaliser} and sapo|sapo and {normaliser}) cannot be combined "
                                          r"\(SAPO's objective is a mean over responses of each one's token mean"):
        preflight(small_cfg(tmp_path, "fixes=grpo", "sapo=enabled", f"{normaliser}=enabled"))
    preflight(small_cfg(tmp_path, "fixes=sapo"))


@pytest.mark.parametrize("dppo", ["dppo_tv", "dppo_kl"])
def test_dppo_refuses_a_dual_clip(small_cfg, tmp_path, dppo):
    with pytest.raises(ConfigError, match=rf"algo.dual_clip=10.0: {dppo} applies no dual clip \(it truncates the "
                                          rf"ratio at algo.{dppo}_cap, verl's clip_ratio_c\); set algo.dual_clip=null"):
        preflight(small_cfg(tmp_path, "fixes=grpo", f"{dppo}=enabled", "algo.dual_clip=10"))
    preflight(small_cfg(tmp_path, "fixes=grpo", f"{dppo}=enabled", "token_level_loss=enabled", "dr_grpo_adv=enabled"))


def test_gpg_adv_excludes_dr_grpo_adv_and_goes_with_any_surrogate(small_cfg, tmp_path):
    with pytest.raises(ConfigError, match=r"fixes dr_grpo_adv and gpg_adv cannot be combined \(GPG's estimator never "
                                          r"divides by the std"):
        preflight(small_cfg(tmp_path, "fixes=grpo", "gpg_adv=enabled", "dr_grpo_adv=enabled"))
    for other in ("full", "cispo", "sapo", "dr_grpo_norm=enabled"):
        preflight(small_cfg(tmp_path, f"fixes={other}" if "=" not in other else "fixes=grpo",
                            *(["gpg_adv=enabled"] + ([other] if "=" in other else []))))


@pytest.mark.parametrize("override,key", [("algo.sapo_tau_pos=0", "algo.sapo_tau_pos: must be > 0, got 0"),
                                          ("algo.sapo_tau_neg=-1", "algo.sapo_tau_neg: must be > 0, got -1"),
                                          ("algo.dro_beta=0", r"algo.dro_beta: must be > 0 \(verl refuses"),
                                          ("algo.dppo_tv_high=-0.1", "algo.dppo_tv_high: must be >= 0"),
                                          ("algo.dppo_kl_low=-1", "algo.dppo_kl_low: must be >= 0"),
                                          ("algo.dppo_kl_cap=0", "algo.dppo_kl_cap: must be > 0")])
def test_bad_values_of_verls_losses_name_the_key(small_cfg, tmp_path, override, key):
    with pytest.raises(ConfigError, match=key):
        preflight(small_cfg(tmp_path, override))
