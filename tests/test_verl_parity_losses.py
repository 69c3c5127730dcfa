"""verl's other registered policy losses (sapo, gpg, dro, dppo_tv, dppo_kl; reinforce) and GPG's estimator against
the switches that are them (dapo_exp/fixes/<name>.py).

Run with verl's interpreter: `.venv-verl/bin/python -m pytest -q -m verl tests/test_verl_parity_losses.py`
(in the main environment, where verl is not installed, every test here skips saying so).

As tests/test_verl_parity.py (whose seeded cases and comparison helpers this file imports): the same float64
tensors through ours (the switch's surrogate hook, reduced with our `aggregate_loss` in verl's `loss_agg_mode`)
and through verl's function (`core_algos.get_policy_loss_fn(name)` with verl's own `ActorConfig`); the loss
and its gradient w.r.t. the log-probs agree to rtol 1e-7 (token-mean, seq-mean-token-sum-norm) / 2e-6
(seq-mean-token-mean, verl's 1e-8 in each row's divisor). gpg, dro and DPPO compose with Dr. GRPO's normaliser
(dr_grpo_norm), so they are compared in seq-mean-token-sum-norm too, with the global-batch normalisers the
trainer's translation gives verl (every response of the mini-batch, L_max). Each comparison has a mutation test
(a perturbed copy fails it), and each difference from verl is asserted, not skipped: SAPO's aggregation (verl's
sapo ignores its loss_agg_mode, so ours equals it in seq-mean-token-mean only, the switch's own), DRO's default
beta (verl has none and refuses null; ours 0.05), and DRO under a rollout-correction weight (ours weights the
advantage, verl the whole per-token loss, penalty included: they differ by beta/2 (1 - w) (log r)^2 per token,
docs/explanation/fixes.md), where SAPO, GPG and DPPO, homogeneous in the advantage, equal verl's weighted losses.
Also asserted: verl's reinforce loss without importance weights is GPG's loss; DPPO's dropped tokens are verl's
(its pg_clipfrac); GPG's estimator equals verl's in float64 (rtol 1e-12; both compute its alpha = B / M in
torch's default dtype, float32) and is ``R - mean`` with +-1 rewards; every name of verl's policy-loss registry is
compared (here or in tests/test_verl_parity.py) or refused by a switch.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

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


D = torch.float64
# Dr. GRPO's normaliser (the dr_grpo_norm switch): token sums / (B x L_max). gpg, dro and DPPO compose with it
NORM = "seq-mean-token-sum-norm"
LOSS_MODES = [*MODES, NORM]
TOL = {**RTOL, NORM: 1e-7}  # no per-row divisor: float64 rounding only
L_PAD = 3  # L_max - T: the generation cap is wider than a batch's padding


def verl_run(name, cfg, mode="token-mean", metrics=None, weighted=False, batch_size=None):
    """verl's registered loss ``name`` as ``(c, logp) -> loss``; its metrics appended to ``metrics``; ``weighted``:
    with the batch's ``rollout_is_weights`` ``c["w"]``. In seq-mean-token-sum-norm with the global-batch
    normalisers the trainer's translation gives verl (tests/test_verl_backend.py): ``global_batch_size`` = every
    response of the mini-batch (or ``batch_size(c)``), ``loss_scale_factor`` = L_max (T + L_PAD)."""
    fn = core_algos.get_policy_loss_fn(name)

    def run(c, logp):
        if mode == NORM:
            B, T = c["mask"].shape
            cfg.global_batch_info.update(global_batch_size=batch_size(c) if batch_size else B,
                                         loss_scale_factor=T + L_PAD)
        extra = {"rollout_is_weights": c["w"]} if weighted else {}
        loss, m = fn(old_log_prob=c["old"], log_prob=logp, advantages=c["adv"], response_mask=c["mask"],
                     loss_agg_mode=mode, config=cfg, **extra)
        if metrics is not None:
            metrics.append(m)
        return loss

    return run


def ours(surrogate, mode="token-mean", weighted=False, pad=L_PAD):
    """Ours in ``mode`` (L_max = T + ``pad`` for seq-mean-token-sum-norm); ``weighted``: as the trainer applies a
    rollout weight ``c["w"]`` (dapo_exp.steps.token_advantages), multiplying each token's advantage before the
    surrogate."""
    def run(c, logp):
        out = surrogate(logp, c["old"], c["adv"] * c["w"] if weighted else c["adv"], mask=c["mask"])
        return obj.aggregate_loss(out.loss, c["mask"], mode, max_len=c["mask"].shape[1] + pad)

    return run


def with_weights(batches, seed=77):
    """``batches`` with token weights ``w`` as the rollout_correction switch gives them (tests/test_verl_parity.py's
    weighted_cases): positive, up to the cap, and 0 on about a tenth of the tokens (those a band rejects)."""
    gen = torch.Generator().manual_seed(seed)
    for c in batches:
        w = torch.rand(c["mask"].shape, generator=gen, dtype=D) * 2.9 + 0.1
        w = torch.where(torch.rand(c["mask"].shape, generator=gen) < 0.1, torch.zeros_like(w), w)
        yield {**c, "w": w * c["mask"]}


def rejected_with_advantage(batches) -> int:
    """Tokens of the batches' masks weighted 0 whose advantage is not: where a weight could go wrong."""
    return sum(int(((c["w"] == 0) & c["mask"].bool() & (c["adv"] != 0)).sum()) for c in batches)


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
@pytest.mark.parametrize("mode", LOSS_MODES)
def test_gpg_is_verls(mode):
    assert agree(ours(gpg.surrogate, mode), verl_run("gpg", actor("gpg"), mode), cases(), rtol=TOL[mode])


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
@pytest.mark.parametrize("mode", LOSS_MODES)
@pytest.mark.parametrize("beta", [0.05, 0.5, 2.0])
def test_dro_is_verls(mode, beta):
    mine = ours(functools.partial(dro.surrogate, beta=beta), mode)
    assert agree(mine, verl_run("dro", actor("dro", dro_beta=beta), mode), cases(), rtol=TOL[mode])


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


@pytest.mark.parametrize("mode", LOSS_MODES)
@pytest.mark.parametrize("name, params", [(n, p) for n, ps in DPPO_PARAMS.items() for p in ps])
def test_dppo_is_verls(name, params, mode):
    low, high, cap = params
    mine = ours(functools.partial(DPPO[name], low=low, high=high, cap=cap), mode)
    metrics = []
    theirs = verl_run(name, actor(name, low=low, high=high, cap=cap), mode, metrics)
    batches = list(dppo_cases())
    assert agree(mine, theirs, batches, rtol=TOL[mode])
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
# Dr. GRPO's normaliser (seq-mean-token-sum-norm) under gpg, dro and DPPO        #
# --------------------------------------------------------------------------- #
# each switch's defaults (the switch's surrogate) and verl's actor config set to them
NORM_LOSSES = {"gpg": (gpg.surrogate, {}), "dro": (dro.surrogate, {"dro_beta": 0.05}),
               "dppo_tv": (dppo_tv.surrogate, {"low": 0.15, "high": 0.15, "cap": 20.0}),
               "dppo_kl": (dppo_kl.surrogate, {"low": 0.05, "high": 0.05, "cap": 20.0})}


@pytest.mark.parametrize("name", list(NORM_LOSSES))
def test_dr_grpo_normaliser_mutations_are_seen(name):
    """The comparisons in seq-mean-token-sum-norm see the normaliser: another L_max, or verl dividing by the
    responses that keep a token (B') instead of every response of the mini-batch (B), is another loss."""
    surrogate, kw = NORM_LOSSES[name]
    cfg = functools.partial(actor, name, **kw)
    batches = list(dppo_cases() if name.startswith("dppo") else cases())
    assert agree(ours(surrogate, NORM), verl_run(name, cfg(), NORM), batches, rtol=TOL[NORM])
    assert not agree(ours(surrogate, NORM, pad=L_PAD + 1), verl_run(name, cfg(), NORM), batches, rtol=TOL[NORM])
    with_empty = [c for c in batches if (c["mask"].sum(1) == 0).any()]
    kept_rows = verl_run(name, cfg(), NORM, batch_size=lambda c: int((c["mask"].sum(1) > 0).sum()))
    assert with_empty and not agree(ours(surrogate, NORM), kept_rows, with_empty, rtol=TOL[NORM])


# --------------------------------------------------------------------------- #
# Where a rollout-correction weight applies                                     #
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("mode", LOSS_MODES)
def test_a_rollout_weight_on_the_advantage_is_verls_on_the_loss_for_sapo_gpg_and_dppo(mode):
    """SAPO (its gate's temperature reads only the advantage's sign), GPG and DPPO (its kept side, too) are
    positively homogeneous in the advantage, so weighting the advantage (ours) equals weighting the per-token
    loss (verl), rejected tokens (weight 0) included, as for the family's (tests/test_verl_parity.py)."""
    # (seq-mean-token-mean: verl's 1e-8 in each row's divisor, which the weights' cancellation between rows can
    # leave above RTOL on a loss near 0, as in tests/test_verl_parity.py)
    def tol(m):
        return dict(rtol=TOL[m], atol=1e-8 if m == "seq-mean-token-mean" else 1e-10)

    batches = list(with_weights(cases()))
    dppo_batches = list(with_weights(dppo_cases()))
    assert rejected_with_advantage(batches) > 0 and rejected_with_advantage(dppo_batches) > 0
    pairs = [(ours(gpg.surrogate, mode, weighted=True), verl_run("gpg", actor("gpg"), mode, weighted=True), batches,
              mode)]
    for name, (low, high, cap) in ((n, ps[0]) for n, ps in DPPO_PARAMS.items()):
        pairs.append((ours(functools.partial(DPPO[name], low=low, high=high, cap=cap), mode, weighted=True),
                      verl_run(name, actor(name, low=low, high=high, cap=cap), mode, weighted=True), dppo_batches,
                      mode))
    if mode != NORM:  # sapo refuses dr_grpo_norm; verl's sapo aggregates in seq-mean-token-mean whatever mode says
        for tau in TAUS:
            pairs.append((ours(functools.partial(sapo.surrogate, tau_pos=tau[0], tau_neg=tau[1]), "seq-mean-token-mean",
                               weighted=True), verl_run("sapo", actor("sapo", tau=tau), mode, weighted=True), batches,
                          "seq-mean-token-mean"))
    for mine, theirs, bs, agg in pairs:
        assert agree(mine, theirs, bs, **tol(agg))
    # the weights do act: unweighted, the same losses differ from verl's weighted ones (gpg, dppo_tv, sapo's first)
    unweighted = [ours(gpg.surrogate, mode), ours(functools.partial(dppo_tv.surrogate, low=0.15, high=0.15, cap=20.0),
                                                  mode)]
    if mode != NORM:
        unweighted.append(ours(sapo.surrogate, "seq-mean-token-mean"))
    for mine, (_, theirs, bs, agg) in zip(unweighted, [pairs[0], pairs[1], *pairs[3:4]], strict=True):
        assert not agree(mine, theirs, bs, **tol(agg))


@pytest.mark.parametrize("mode", LOSS_MODES)
@pytest.mark.parametrize("beta", [0.05, 0.5])
def test_a_rollout_weight_under_dro_differs_from_verls_documented(mode, beta):
    """DRO is not homogeneous in the advantage: its penalty beta/2 (log r)^2 carries none. Ours weights the
    advantage, so the penalty stays unweighted (a rejected token is still pulled back to the sampling policy);
    verl weights the whole per-token loss, penalty included. The two differ by beta/2 (1 - w) (log r)^2 per token,
    exactly (docs/explanation/fixes.md); with beta = 0, or with the penalty weighted too, they are the same.
    Without weights both are verl's (test_dro_is_verls)."""
    tol = dict(rtol=TOL[mode], atol=1e-8 if mode == "seq-mean-token-mean" else 1e-10)
    batches = list(with_weights(cases()))
    assert rejected_with_advantage(batches) > 0
    surrogate = functools.partial(dro.surrogate, beta=beta)
    theirs = verl_run("dro", actor("dro", dro_beta=beta), mode, weighted=True)
    assert not agree(ours(surrogate, mode, weighted=True), theirs, batches, **tol)

    def loss_weighted(c, logp):  # verl's rule, written with ours: the weight on the per-token loss, penalty included
        out = surrogate(logp, c["old"], c["adv"], mask=c["mask"])
        return obj.aggregate_loss(out.loss * c["w"], c["mask"], mode, max_len=c["mask"].shape[1] + L_PAD)

    assert agree(loss_weighted, theirs, batches, **tol)

    def verl_plus_unweighted_penalty(c, logp):  # the documented difference, exactly
        extra = 0.5 * beta * (1 - c["w"]) * (logp - c["old"]).square()
        return theirs(c, logp) + obj.aggregate_loss(extra, c["mask"], mode, max_len=c["mask"].shape[1] + L_PAD)

    assert agree(ours(surrogate, mode, weighted=True), verl_plus_unweighted_penalty, batches, **tol)
    # beta = 0 (which verl's dro refuses): the policy gradient alone, homogeneous, is verl's weighted gpg
    assert agree(ours(functools.partial(dro.surrogate, beta=0.0), mode, weighted=True),
                 verl_run("gpg", actor("gpg"), mode, weighted=True), batches, **tol)


# --------------------------------------------------------------------------- #
# GPG's estimator                                                               #
# --------------------------------------------------------------------------- #
def test_gpg_advantages_are_verls():
    """float64 rewards through both. verl casts nothing to float32 except alpha = B / M, a Python int over an
    integer tensor, which torch divides in its default dtype (float32); ours computes alpha the same way, so the
    two agree to float64's rounding (rtol 1e-12), and alpha is float32-rounded in both (asserted: 8 / 3 is)."""
    gen = torch.Generator().manual_seed(11)
    alpha_seen = set()
    n_float32_alpha = 0
    for k in range(48):
        N, G = int(torch.randint(1, 6, (1,), generator=gen)), (1, 2, 4, 8)[k % 4]
        kind = k % 3
        if kind == 0:
            rewards = torch.randint(0, 2, (N, G), generator=gen).to(D)  # {0, 1}: alpha = B / #correct
        elif kind == 1:
            rewards = torch.randint(0, 2, (N, G), generator=gen).to(D) * 2 - 1  # +-1: alpha = 1
        else:
            rewards = torch.randn(N, G, generator=gen, dtype=D) * (torch.rand(N, G, generator=gen) < 0.6)
        if k % 5 == 0:
            rewards[0] = 0.0  # an all-zero group (and, with N = 1, a batch without a non-zero reward)
        B, T = N * G, 3
        scores = torch.zeros(B, T, dtype=D)
        scores[:, -1] = rewards.reshape(-1)
        index = np.array([f"p{i // G}" for i in range(B)], dtype=object)
        v, _ = core_algos.compute_gpg_outcome_advantage(scores, torch.ones(B, T, dtype=D), index)
        assert v.dtype == D
        out = gpg_adv.estimator(rewards)
        assert out.value.dtype == D
        torch.testing.assert_close(out.value.reshape(-1), v[:, 0], rtol=1e-12, atol=1e-12)
        alpha = out.metrics["gpg/alpha"]
        alpha_seen.add(round(alpha, 6))
        m = max(int(torch.count_nonzero(rewards)), 1)
        # verl's float32 alpha (torch divides an int by a tensor as its float32 reciprocal times the int)
        assert alpha == float(torch.tensor(alpha, dtype=torch.float32)) and alpha == pytest.approx(B / m, rel=2e-7)
        n_float32_alpha += alpha != B / m
        if kind == 1 and k % 5:
            assert alpha == 1.0  # +-1 rewards: verl's GPG estimator is R - mean (Dr. GRPO's)
            # (group_advantages computes in float32: exact for +-1 rewards, whose group means are k / G)
            torch.testing.assert_close(out.value, obj.group_advantages(rewards, norm_std=False).to(D) if G > 1
                                       else rewards, rtol=1e-12, atol=1e-12)
        # mutation: without alpha (or with GRPO's std division) it is another estimator wherever alpha != 1
        if alpha != 1.0 and (v[:, 0] != 0).any():
            assert not torch.allclose((out.value / alpha).reshape(-1), v[:, 0], atol=1e-4)
        # mutation: alpha in float64 is seen at this tolerance wherever B / M is not a float32
        if alpha != B / m and (v[:, 0] != 0).any():
            exact = (B / m) * (out.value / alpha)
            assert not torch.allclose(exact.reshape(-1), v[:, 0], rtol=1e-12, atol=1e-12)
    assert len(alpha_seen) > 3 and n_float32_alpha > 0
    # verl's own: 3 non-zero rewards of 8 in one group, A = alpha (1 - 3/8) with alpha 8/3 in float32, not float64
    v, _ = core_algos.compute_gpg_outcome_advantage(torch.tensor([[0.0, 1.0]] * 3 + [[0.0, 0.0]] * 5, dtype=D),
                                                    torch.ones(8, 2, dtype=D), np.array(["g"] * 8, dtype=object))
    verl_alpha = float(v[0, 0]) / 0.625
    assert verl_alpha == float(torch.tensor(verl_alpha, dtype=torch.float32)) != 8 / 3
    assert gpg_adv.estimator(torch.tensor([[1.0] * 3 + [0.0] * 5], dtype=D)).metrics["gpg/alpha"] == verl_alpha


# --------------------------------------------------------------------------- #
# verl's registry                                                               #
# --------------------------------------------------------------------------- #
# each name of verl 0.9.1's POLICY_LOSS_REGISTRY: (the test comparing it with ours, in this file or in
# tests/test_verl_parity.py; the switch that is it, None for GRPO's own surrogate)
COMPARED = {
    "sapo": ("test_sapo_is_verls_in_its_own_aggregation", "sapo"),
    "gpg": ("test_gpg_is_verls", "gpg"),
    "dro": ("test_dro_is_verls", "dro"),
    "dppo_tv": ("test_dppo_is_verls", "dppo_tv"),
    "dppo_kl": ("test_dppo_is_verls", "dppo_kl"),
    "vanilla": ("test_verl_parity.py::test_a_rollout_weight_on_the_advantage_is_verls_on_the_loss_for_the_homogeneous"
                "_surrogates", None),  # PPO's clip, dual clip: also every preset in tests/test_verl_backend.py
    "gspo": ("test_verl_parity.py::test_gspo_is_verls", "gspo"),
    "cispo": ("test_verl_parity.py::test_cispo_is_verls", "cispo"),
    "geo_mean": ("test_verl_parity.py::test_gmpo_is_verls_geo_mean", "gmpo"),
    "clip_cov": ("test_verl_parity.py::test_clip_cov_is_verls", "clip_cov"),
    "kl_cov": ("test_verl_parity.py::test_kl_cov_is_verls", "kl_cov"),
}
# refused by a switch that fails before any compute, and why
REFUSED = {
    "bypass_mode": "the old log-probs are the rollout engine's; the trainer always recomputes its own (its "
                   "loss_type=reinforce is compute_policy_loss_reinforce, below)",
}
# not registered, reached through a registered name: (how, the test comparing it)
ALIASED = {
    "reinforce": ("bypass_mode's loss_type=reinforce: compute_policy_loss_reinforce; without importance weights it "
                  "is gpg's loss", "test_gpg_mutation_and_reinforce_is_the_same_loss"),
}


def _test_source(ref: str) -> str:
    """The source of the test ``ref`` (a name in this file, or ``file::name``), its decorators included, and of the
    functions of its file that it calls (clip_cov_pair, ...)."""
    path, _, name = ref.rpartition("::")
    source = (Path(__file__).parent / (path or Path(__file__).name)).read_text()
    defs = {node.name: node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)}
    assert name in defs and name.startswith("test_"), f"{ref}: no such test"
    node = defs[name]
    called = {c.func.id for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
    return "".join(ast.get_source_segment(source, x) for x in
                   [*node.decorator_list, node, *(defs[f] for f in sorted(called & set(defs)))])


def test_every_registered_policy_loss_is_compared_or_refused():
    """verl's policy-loss registry: each name is compared with ours by a test that names it (or the parameters it
    runs over do), or refused by a switch that fails before any compute; a name verl adds fails here."""
    from omegaconf import OmegaConf

    from dapo_exp import fixes
    from dapo_exp.errors import ConfigError
    from dapo_exp.fixes.base import RunInfo

    assert set(core_algos.POLICY_LOSS_REGISTRY) == set(COMPARED) | set(REFUSED)
    assert not set(COMPARED) & set(REFUSED)
    for name, (test, switch) in COMPARED.items():
        src = _test_source(test)
        assert f'"{name}"' in src or ("DPPO_PARAMS" in src and name in DPPO_PARAMS), (name, test)
        assert switch is None or switch in fixes.FIXES, name
    for name in REFUSED:
        with pytest.raises(ConfigError, match=f"^{name}: not supported"):
            fixes.FIXES[name].check(OmegaConf.create({name: True}), RunInfo(max_response_len=8, group_size=4, seed=0))
    for name, (_, test) in ALIASED.items():
        assert name not in core_algos.POLICY_LOSS_REGISTRY and hasattr(core_algos, f"compute_policy_loss_{name}")
        assert f"compute_policy_loss_{name}" in _test_source(test)
