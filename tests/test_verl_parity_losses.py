"""verl's other registered policy losses (sapo, gpg, dro, dppo_tv, dppo_kl; reinforce) and GPG's estimator against
the switches that are them (dapo_exp/fixes/<name>.py).

Run with verl's interpreter: `.venv-verl/bin/python -m pytest -q -m verl tests/test_verl_parity_losses.py`
(in the main environment, where verl is not installed, every test here skips saying so).

As tests/test_verl_parity.py (whose seeded cases and comparison helpers this file imports): the same float64
tensors through ours (the switch's surrogate hook, reduced with our `aggregate_loss` in verl's `loss_agg_mode`)
and through verl's function (`core_algos.get_policy_loss_fn(name)` with verl's own `ActorConfig`); the loss
and its gradient w.r.t. the log-probs agree to rtol 1e-7 (token-mean) / 2e-6 (seq-mean-token-mean, verl's
1e-8 in each row's divisor). Each comparison has a mutation test (a perturbed copy fails it), and each
difference from verl is asserted, not skipped: SAPO's aggregation (verl's sapo ignores its loss_agg_mode, so
ours equals it in seq-mean-token-mean only, the switch's own), DRO's default beta (verl has none and refuses
null; ours 0.05). Also asserted: verl's reinforce loss without importance weights is GPG's loss; DPPO's
dropped tokens are verl's (its pg_clipfrac); GPG's estimator equals verl's (float32, rtol 1e-6) and is
``R - mean`` with +-1 rewards.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

verl = pytest.importorskip("verl", reason="verl is not installed here: run these tests with "
                           ".venv-verl/bin/python (bash .ci/install-verl creates it)")

from test_verl_parity import MODES, RTOL, agree, cases, ours_loss  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.workers.config.actor import ActorConfig, PolicyLossConfig  # noqa: E402

from dapo_exp import objective as obj  # noqa: E402
from dapo_exp.fixes import dppo_kl, dppo_tv, dro, gpg, gpg_adv, sapo  # noqa: E402

pytestmark = pytest.mark.verl


def actor(loss_mode: str, *, low: float = 0.2, high: float = 0.2, cap: float = 3.0, tau=(1.0, 1.05),
          **policy_loss) -> ActorConfig:
    """verl's actor config for one loss: its clip_ratio_low/high, clip_ratio_c, SAPO's tau_pos/neg (actor fields),
    and ``policy_loss`` fields (dro_beta)."""
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=0.2,
                       clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=cap, tau_pos=tau[0], tau_neg=tau[1],
                       policy_loss=PolicyLossConfig(loss_mode=loss_mode, **policy_loss))


def verl_run(name, cfg, mode="token-mean", metrics=None):
    """verl's registered loss ``name`` as ``(c, logp) -> loss``; its metrics appended to ``metrics``."""
    fn = core_algos.get_policy_loss_fn(name)

    def run(c, logp):
        loss, m = fn(old_log_prob=c["old"], log_prob=logp, advantages=c["adv"], response_mask=c["mask"],
                     loss_agg_mode=mode, config=cfg)
        if metrics is not None:
            metrics.append(m)
        return loss

    return run


# --------------------------------------------------------------------------- #
# SAPO                                                                          #
# --------------------------------------------------------------------------- #
TAUS = [(1.0, 1.05), (0.5, 2.0), (3.0, 1.0)]


@pytest.mark.parametrize("tau", TAUS)
def test_sapo_is_verls_in_its_own_aggregation(tau):
    ours = ours_loss(functools.partial(sapo.surrogate, tau_pos=tau[0], tau_neg=tau[1]), "seq-mean-token-mean")
    for mode in MODES:  # verl's sapo aggregates in seq-mean-token-mean whatever loss_agg_mode says
        assert agree(ours, verl_run("sapo", actor("sapo", tau=tau), mode), cases(), rtol=RTOL["seq-mean-token-mean"])


def test_sapo_mutations_and_documented_aggregation():
    theirs = verl_run("sapo", actor("sapo"), "token-mean")
    batches = list(cases())
    tol = dict(rtol=RTOL["seq-mean-token-mean"])
    assert not agree(ours_loss(functools.partial(sapo.surrogate, tau_pos=1.0, tau_neg=1.1), "seq-mean-token-mean"),
                     theirs, batches, **tol)
    assert not agree(ours_loss(functools.partial(sapo.surrogate, tau_pos=1.05, tau_neg=1.0), "seq-mean-token-mean"),
                     theirs, batches, **tol)

    def no_normalisation(c, logp):  # the gate without its 4 / tau
        r = torch.exp((logp - c["old"]).clamp(-20, 20))
        tau = torch.where(c["adv"] > 0, 1.0, 1.05)
        return obj.aggregate_loss(-torch.sigmoid(tau * (r - 1)) * c["adv"], c["mask"], "seq-mean-token-mean")

    assert not agree(no_normalisation, theirs, batches, **tol)
    # documented: token-mean is not SAPO's aggregation in verl (it ignores loss_agg_mode), so the sapo switch
    # excludes the token-level and constant normalisers (tests/test_family.py)
    assert not agree(ours_loss(sapo.surrogate, "token-mean"), theirs, batches, **tol)


def test_sapo_damped_tokens_are_those_whose_gradient_weight_is_below_half():
    for c in cases(n=12):
        leaf = c["logp"].clone().requires_grad_()
        out = sapo.surrogate(leaf, c["old"], c["adv"])
        adv = c["adv"].expand_as(leaf)
        (g,) = torch.autograd.grad(out.loss.sum(), leaf)
        live = adv != 0
        weight = (g[live] / -adv[live])  # d l / d logp = -w A
        assert torch.equal(out.selected[live], weight < sapo.DAMPED)
        assert torch.allclose(weight[(c["logp"] - c["old"]).abs()[live] < 1e-12], torch.tensor(1.0, dtype=weight.dtype))


# --------------------------------------------------------------------------- #
# GPG's loss, and verl's reinforce                                              #
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("mode", MODES)
def test_gpg_is_verls(mode):
    assert agree(ours_loss(gpg.surrogate, mode), verl_run("gpg", actor("gpg"), mode), cases(), rtol=RTOL[mode])


def test_gpg_mutation_and_reinforce_is_the_same_loss():
    batches = list(cases())
    theirs = verl_run("gpg", actor("gpg"))

    def ratio_weighted(c, logp):  # an importance weight the loss does not have
        r = torch.exp((logp - c["old"]).clamp(-20, 20)).detach()
        return obj.aggregate_loss(-r * c["adv"] * logp, c["mask"], "token-mean")

    assert not agree(ratio_weighted, theirs, batches)
    # verl's compute_policy_loss_reinforce (reached only through bypass_mode) without importance weights is the
    # same per-token loss: -A logp, in every aggregation
    for mode in MODES:
        def reinforce(c, logp, mode=mode):
            loss, _ = core_algos.compute_policy_loss_reinforce(rollout_log_prob=c["old"], log_prob=logp,
                                                               advantages=c["adv"], response_mask=c["mask"],
                                                               loss_agg_mode=mode, config=actor("gpg"))
            return loss

        assert agree(ours_loss(gpg.surrogate, mode), reinforce, batches, rtol=RTOL[mode])


# --------------------------------------------------------------------------- #
# DRO                                                                           #
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("beta", [0.05, 0.5, 2.0])
def test_dro_is_verls(mode, beta):
    ours = ours_loss(functools.partial(dro.surrogate, beta=beta), mode)
    assert agree(ours, verl_run("dro", actor("dro", dro_beta=beta), mode), cases(), rtol=RTOL[mode])


def test_dro_mutations_and_documented_default():
    batches = list(cases())
    theirs = verl_run("dro", actor("dro", dro_beta=0.05))
    assert not agree(ours_loss(functools.partial(dro.surrogate, beta=0.06)), theirs, batches)
    assert not agree(ours_loss(functools.partial(dro.surrogate, beta=-0.05)), theirs, batches)  # the penalty's sign
    # verl has no default beta (its dro refuses null); ours is 0.05
    assert PolicyLossConfig().dro_beta is None
    with pytest.raises(ValueError, match="dro_beta must be a positive value"):
        c = next(cases())
        verl_run("dro", actor("dro"))(c, c["logp"])
    assert agree(ours_loss(dro.surrogate), theirs, batches)


# --------------------------------------------------------------------------- #
# DPPO-Binary-TV / -KL                                                          #
# --------------------------------------------------------------------------- #
DPPO = {"dppo_tv": dppo_tv.surrogate, "dppo_kl": dppo_kl.surrogate}
DPPO_PARAMS = {"dppo_tv": [(0.15, 0.15, 20.0), (0.05, 0.3, 3.0), (0.4, 0.02, 1e4)],
               "dppo_kl": [(0.05, 0.05, 20.0), (0.01, 0.3, 3.0), (0.5, 0.002, 1e4)]}


def dppo_cases(seed=3):
    """cases() whose log-ratios move probabilities by tenths (the bounds' scale), with many tokens near p = 1."""
    gen = torch.Generator().manual_seed(seed)
    for c in cases(seed=seed):
        old = torch.where(torch.rand(c["old"].shape, generator=gen) < 0.3, c["old"] / 20, c["old"])
        yield {**c, "old": old, "logp": old + (c["logp"] - c["old"])}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name, params", [(n, p) for n, ps in DPPO_PARAMS.items() for p in ps])
def test_dppo_is_verls(name, params, mode):
    low, high, cap = params
    ours = ours_loss(functools.partial(DPPO[name], low=low, high=high, cap=cap), mode)
    metrics = []
    theirs = verl_run(name, actor(name, low=low, high=high, cap=cap), mode, metrics)
    batches = list(dppo_cases())
    assert agree(ours, theirs, batches, rtol=RTOL[mode])
    # the dropped tokens are verl's: our selected share of the mask is its pg_clipfrac (one call per batch)
    n_dropped = 0
    for c, m in zip(batches, metrics, strict=True):
        out = DPPO[name](c["logp"], c["old"], c["adv"], low=low, high=high, cap=cap)
        share = float((out.selected & c["mask"].bool()).sum() / c["mask"].sum())
        assert share == pytest.approx(m["actor/pg_clipfrac"], rel=1e-6, abs=1e-9)
        n_dropped += int((out.selected & c["mask"].bool()).sum())
    assert n_dropped > 0


@pytest.mark.parametrize("name", list(DPPO))
def test_dppo_mutations_are_seen(name):
    low, high, cap = DPPO_PARAMS[name][0]
    theirs = verl_run(name, actor(name, low=low, high=high, cap=cap))
    batches = list(dppo_cases())
    for kw in (dict(low=low, high=high * 1.5, cap=cap), dict(low=low * 1.5, high=high, cap=cap),
               dict(low=low, high=high, cap=2.0)):
        assert not agree(ours_loss(functools.partial(DPPO[name], **kw)), theirs, batches), kw

    def symmetric(c, logp):  # the bound on both directions of the move, whatever the advantage's sign
        out = dppo_tv.truncated_pg(logp, c["old"], c["adv"], (torch.exp(logp) - torch.exp(c["old"])).abs().detach()
                                   <= high, cap)
        return obj.aggregate_loss(out.loss, c["mask"], "token-mean")

    assert not agree(symmetric, theirs, batches)


def test_dppo_keeps_the_other_directions_move():
    """A > 0 and p fell, or A < 0 and p rose: kept, however far (the bound is on the advantage's direction)."""
    old = torch.log(torch.tensor([[0.5, 0.5]], dtype=torch.float64))
    logp = torch.log(torch.tensor([[0.05, 0.95]], dtype=torch.float64))
    for surrogate in DPPO.values():
        assert not surrogate(logp, old, torch.tensor([[1.0, -1.0]], dtype=torch.float64)).selected.any()
        assert surrogate(logp, old, torch.tensor([[-1.0, 1.0]], dtype=torch.float64)).selected.all()


# --------------------------------------------------------------------------- #
# GPG's estimator                                                               #
# --------------------------------------------------------------------------- #
def test_gpg_advantages_are_verls():
    gen = torch.Generator().manual_seed(11)
    alpha_seen = set()
    for k in range(48):
        N, G = int(torch.randint(1, 6, (1,), generator=gen)), (1, 2, 4, 8)[k % 4]
        kind = k % 3
        if kind == 0:
            rewards = torch.randint(0, 2, (N, G), generator=gen).float()  # {0, 1}: alpha = B / #correct
        elif kind == 1:
            rewards = torch.randint(0, 2, (N, G), generator=gen).float() * 2 - 1  # +-1: alpha = 1
        else:
            rewards = torch.randn(N, G, generator=gen) * (torch.rand(N, G, generator=gen) < 0.6)
        if k % 5 == 0:
            rewards[0] = 0.0  # an all-zero group (and, with N = 1, a batch without a non-zero reward)
        B, T = N * G, 3
        scores = torch.zeros(B, T)
        scores[:, -1] = rewards.reshape(-1)
        index = np.array([f"p{i // G}" for i in range(B)], dtype=object)
        v, _ = core_algos.compute_gpg_outcome_advantage(scores, torch.ones(B, T), index)
        out = gpg_adv.estimator(rewards)
        torch.testing.assert_close(out.value.reshape(-1), v[:, 0], rtol=1e-6, atol=1e-6)
        alpha = out.metrics["gpg/alpha"]
        alpha_seen.add(round(alpha, 6))
        if kind == 1 and k % 5:
            assert alpha == 1.0  # +-1 rewards: verl's GPG estimator is R - mean (Dr. GRPO's)
            torch.testing.assert_close(out.value, obj.group_advantages(rewards, norm_std=False) if G > 1
                                       else rewards, rtol=1e-6, atol=1e-6)
        # mutation: without alpha (or with GRPO's std division) it is another estimator wherever alpha != 1
        if alpha != 1.0 and (v[:, 0] != 0).any():
            assert not torch.allclose((out.value / alpha).reshape(-1), v[:, 0], atol=1e-4)
    assert len(alpha_seen) > 3
