"""The GRPO family of dapo_exp.objective against verl 0.9.1's own registered policy losses.

Run with verl's interpreter: `.venv-verl/bin/python -m pytest -q -m verl tests/test_verl_parity.py`
(in the main environment, where verl is not installed, every test here skips saying so).

The same seeded random tensors (several shapes, rows without tokens, garbage in the padding,
log-ratios from 0.01 to +-19) go through ours and through verl's function
(`core_algos.get_policy_loss_fn(name)` with verl's own `ActorConfig` / `PolicyLossConfig`):
the loss and its gradient w.r.t. the log-probs are compared, our per-token loss reduced with our
`aggregate_loss` in verl's `loss_agg_mode`. Each comparison has a mutation test: a perturbed
copy of ours (a changed constant, a dropped stop-gradient) must fail it. Where we deliberately
differ from verl (a paper default, verl's normalisers, verl's missing overflow guard) the
difference is asserted, not skipped.

Imports only torch / numpy / pytest and dapo_exp.objective (.venv-verl lacks our other dependencies).
"""

from __future__ import annotations

import functools
import inspect
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

verl = pytest.importorskip("verl", reason="verl is not installed here: run these tests with "
                           ".venv-verl/bin/python (bash .ci/install-verl creates it)")

from verl.trainer.config.algorithm import AlgoConfig  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.trainer.ppo import rollout_corr_helper as rc  # noqa: E402
from verl.workers.config.actor import ActorConfig, PolicyLossConfig  # noqa: E402

from dapo_exp import objective as obj  # noqa: E402

pytestmark = pytest.mark.verl

D = torch.float64
SHAPES = [(1, 1), (3, 5), (8, 17), (16, 40), (5, 3), (32, 9)]


def actor(loss_mode: str, clip_low: float = 0.2, clip_high: float = 0.2, global_batch_info=None, **policy_loss):
    """verl's actor config (its own dataclass) for one policy loss."""
    cfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=0.2,
                      clip_ratio_low=clip_low, clip_ratio_high=clip_high,
                      policy_loss=PolicyLossConfig(loss_mode=loss_mode, **policy_loss))
    cfg.global_batch_info.update(global_batch_info or {})
    return cfg


def cases(n: int = 30, seed: int = 1234, extreme: bool = True):
    """Seeded batches: dict(logp, old, adv (B, T) masked as verl's, adv_row (B, 1), mask)."""
    gen = torch.Generator().manual_seed(seed)
    for k in range(n):
        B, T = SHAPES[k % len(SHAPES)]
        lengths = torch.randint(0, T + 1, (B,), generator=gen)
        lengths[0] = max(int(lengths[0]), 1)  # at least one token in the batch
        mask = (torch.arange(T)[None] < lengths[:, None]).to(D)
        if B > 2 and k % 2 == 0:
            mask[1 + int(torch.randint(0, B - 1, (1,), generator=gen))] = 0.0  # a row without tokens
        old = -torch.rand(B, T, generator=gen, dtype=D) * 4 - 0.01
        scale = (0.01, 0.3, 2.0)[k % 3]
        log_ratio = torch.randn(B, T, generator=gen, dtype=D) * scale
        if extreme and k % 4 == 3:  # a few extreme log-ratios, inside the +-20 overflow guard
            hit = torch.rand(B, T, generator=gen) < 0.2
            log_ratio = torch.where(hit, torch.sign(log_ratio) * (5 + 14.5 * torch.rand(B, T, generator=gen,
                                                                                         dtype=D)), log_ratio)
        log_ratio = torch.where(mask.bool(), log_ratio, torch.full_like(log_ratio, 30.0))  # garbage in padding
        adv_row = torch.randn(B, 1, generator=gen, dtype=D) * (1 + 2 * (k % 2))
        if k % 5 == 0:
            adv_row[0] = 0.0
        yield dict(logp=old + log_ratio, old=old, adv=adv_row * mask, adv_row=adv_row, mask=mask, k=k)


def loss_and_grad(fn, logp):
    leaf = logp.detach().clone().requires_grad_()
    loss = fn(leaf)
    (g,) = torch.autograd.grad(loss, leaf)
    return loss.detach(), g


def agree(ours, theirs, batches, rtol=1e-7, atol=1e-10):
    """True iff ours(c, logp) and theirs(c, logp) agree in loss and gradient on every batch."""
    for c in batches:
        a, ga = loss_and_grad(functools.partial(ours, c), c["logp"])
        b, gb = loss_and_grad(functools.partial(theirs, c), c["logp"])
        scale = max(1.0, float(b.abs()))
        if not (torch.isfinite(a) and torch.isfinite(b)):
            return False
        if abs(float(a) - float(b)) > atol * scale + rtol * abs(float(b)):
            return False
        if not torch.allclose(ga, gb, rtol=rtol, atol=atol * max(1.0, float(gb.abs().max()))):
            return False
    return True


def verl_loss(name, cfg, mode="token-mean", weighted=False):
    """verl's registered loss; ``weighted``: with the batch's ``rollout_is_weights`` ``c["w"]``, which each of
    verl's losses applies to its own per-token (or row) loss."""
    fn = core_algos.get_policy_loss_fn(name)

    def run(c, logp):
        extra = {"rollout_is_weights": c["w"]} if weighted else {}
        loss, _ = fn(old_log_prob=c["old"], log_prob=logp, advantages=c["adv"], response_mask=c["mask"],
                     loss_agg_mode=mode, config=cfg, **extra)
        return loss

    return run


def ours_loss(surrogate, mode="token-mean", needs_mask=True, scale=1.0, weighted=False):
    """Ours; ``weighted``: as the trainer applies a rollout weight ``c["w"]`` (dapo_exp.steps.token_advantages),
    multiplying each token's advantage before the surrogate."""
    def run(c, logp):
        f = functools.partial(surrogate, mask=c["mask"]) if needs_mask else surrogate
        out = f(logp, c["old"], c["adv"] * c["w"] if weighted else c["adv"])
        return obj.aggregate_loss(out.loss, c["mask"], mode, max_len=c["mask"].shape[1]) * scale

    return run


MODES = ["token-mean", "seq-mean-token-mean"]
# verl's seq-mean-token-mean divides each row by (|o_i| + 1e-8): a relative 1e-8 per row, which
# cancellation between rows of opposite signs can raise to ~1e-7 of the total
RTOL = {"token-mean": 1e-7, "seq-mean-token-mean": 2e-6}


# --------------------------------------------------------------------------- #
# GSPO                                                                          #
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("form", obj.GSPO_FORMS)
def test_gspo_is_verls(mode, form):
    eps = dict(eps_low=3e-4, eps_high=4e-4)
    ours = ours_loss(functools.partial(obj.gspo_surrogate, form=form, **eps), mode)
    theirs = verl_loss("gspo", actor("gspo", 3e-4, 4e-4), mode)
    assert agree(ours, theirs, cases(), rtol=RTOL[mode])
    wide = ours_loss(functools.partial(obj.gspo_surrogate, form=form, eps_low=0.05, eps_high=0.1), mode)
    assert agree(wide, verl_loss("gspo", actor("gspo", 0.05, 0.1), mode), cases(seed=5), rtol=RTOL[mode])


def test_gspo_mutations_are_seen(monkeypatch):
    theirs = verl_loss("gspo", actor("gspo", 3e-4, 4e-4))
    batches = list(cases())
    shifted = ours_loss(functools.partial(obj.gspo_surrogate, eps_low=3e-4, eps_high=5e-4))
    assert not agree(shifted, theirs, batches)
    monkeypatch.setattr(obj, "GSPO_LOG_RATIO_MAX", 1.0)  # the guard, too tight
    assert not agree(ours_loss(functools.partial(obj.gspo_surrogate, eps_low=3e-4, eps_high=4e-4)), theirs, batches)


def test_gspo_documented_defaults():
    # the paper's sequence clip range is ours by default; verl has no GSPO-specific default (the
    # actor's clip_ratio_low / high, 0.2 / 0.2, unless set)
    cfg = actor("gspo")
    assert (cfg.clip_ratio_low, cfg.clip_ratio_high) == (0.2, 0.2)
    sig = inspect.signature(obj.gspo_surrogate).parameters
    assert (sig["eps_low"].default, sig["eps_high"].default, sig["form"].default) == (3e-4, 4e-4, "token")


# --------------------------------------------------------------------------- #
# CISPO                                                                         #
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("eps", [(0.2, 0.2), (1.0, 4.0), (0.1, 0.28)])
def test_cispo_is_verls(mode, eps):
    ours = ours_loss(functools.partial(obj.cispo_surrogate, eps_low=eps[0], eps_high=eps[1]), mode, needs_mask=False)
    assert agree(ours, verl_loss("cispo", actor("cispo", *eps), mode), cases(), rtol=RTOL[mode])


def test_cispo_mutations_and_documented_defaults(monkeypatch):
    theirs = verl_loss("cispo", actor("cispo", 1.0, 4.0))
    batches = list(cases())

    def no_stop_gradient(c, logp):  # the weight left in the graph
        r = torch.exp((logp - c["old"]).clamp(-20, 20))
        return obj.aggregate_loss(-r.clamp(0.0, 5.0) * c["adv"] * logp, c["mask"], "token-mean")

    assert not agree(no_stop_gradient, theirs, batches)
    monkeypatch.setattr(obj, "LOG_RATIO_GUARD", 1.0)
    assert not agree(ours_loss(obj.cispo_surrogate, needs_mask=False), theirs, batches)
    monkeypatch.undo()
    # ours defaults to no lower bound and a cap of 5 (MiniMax-M1 / ScaleRL); verl's default actor 0.2 / 0.2
    assert agree(ours_loss(obj.cispo_surrogate, needs_mask=False), theirs, batches)
    assert not agree(ours_loss(obj.cispo_surrogate, needs_mask=False), verl_loss("cispo", actor("cispo")), batches)


# --------------------------------------------------------------------------- #
# Where a rollout-correction weight applies                                     #
# --------------------------------------------------------------------------- #
def weighted_cases(seed: int = 77):
    """cases() with token weights ``w`` as the rollout_correction switch gives them: positive, up to the cap, and
    0 on the tokens a band rejects."""
    gen = torch.Generator().manual_seed(seed)
    for c in cases(seed=seed):
        w = torch.rand(c["mask"].shape, generator=gen, dtype=D) * 2.9 + 0.1
        w = torch.where(torch.rand(c["mask"].shape, generator=gen) < 0.1, torch.zeros_like(w), w)
        yield {**c, "w": w * c["mask"]}


@pytest.mark.parametrize("mode", MODES)
def test_a_rollout_weight_on_the_advantage_is_verls_on_the_loss_for_the_homogeneous_surrogates(mode):
    """PPO's clip (dual clip included), GSPO and CISPO are positively homogeneous in the advantage, so weighting
    the advantage (ours) equals weighting the per-token loss (verl), rejected tokens (weight 0) included."""
    batches = list(weighted_cases())
    # (seq-mean-token-mean: verl's 1e-8 in each row's divisor, an absolute 1e-8 of the rows' terms, which the
    # weights' cancellation between rows leaves above RTOL on a loss near 0: 2.6e-9 on 6.5e-4 once)
    tol = dict(rtol=RTOL[mode], atol=1e-8 if mode == "seq-mean-token-mean" else 1e-10)
    ppo = functools.partial(obj.clipped_surrogate, eps_low=0.2, eps_high=0.28, dual_clip=3.0)
    gspo = functools.partial(obj.gspo_surrogate, eps_low=3e-4, eps_high=4e-4)
    cispo = functools.partial(obj.cispo_surrogate, eps_low=1.0, eps_high=4.0)
    for ours, theirs in ((ours_loss(ppo, mode, weighted=True), verl_loss("vanilla", actor("vanilla", 0.2, 0.28), mode,
                                                                         weighted=True)),
                         (ours_loss(gspo, mode, weighted=True), verl_loss("gspo", actor("gspo", 3e-4, 4e-4), mode,
                                                                          weighted=True)),
                         (ours_loss(cispo, mode, needs_mask=False, weighted=True),
                          verl_loss("cispo", actor("cispo", 1.0, 4.0), mode, weighted=True))):
        assert agree(ours, theirs, batches, **tol)
    # the weights do act: unweighted, the same losses differ from verl's weighted ones
    assert not agree(ours_loss(cispo, mode, needs_mask=False),
                     verl_loss("cispo", actor("cispo", 1.0, 4.0), mode, weighted=True), batches, **tol)


def test_a_rollout_weight_under_gmpo_and_kl_cov_differs_from_verls_documented():
    """Where the surrogate is not homogeneous in the advantage the two places differ (docs/explanation/fixes.md):
    GMPO's row loss uses the row's mean advantage, which ours weights token by token, while verl multiplies the row
    loss by the geometric mean of its token weights; KL-Cov picks its tokens by the covariance of the advantage,
    weighted here, raw in verl. Without weights both are verl's (test_gmpo_is_verls_geo_mean, test_kl_cov_is_verls)."""
    batches = list(weighted_cases())
    gmpo = functools.partial(obj.gmpo_surrogate, eps_low=0.4, eps_high=0.4)
    full = [c for c in batches if (c["mask"].sum(1) > 0).all()]  # (verl's mean over all rows aside)
    assert full and not agree(ours_loss(gmpo, "seq-mean-token-mean", weighted=True),
                              verl_loss("geo_mean", actor("geo_mean", 0.4, 0.4), weighted=True), full, rtol=1e-6)

    def verl_rule(c, logp):  # verl's rule, written with ours: the row loss times the geometric mean of the weights
        out = gmpo(logp, c["old"], c["adv"], mask=c["mask"])
        m = c["mask"]
        seq_w = torch.exp((torch.log(c["w"] + 1e-10) * m).sum(1) / (m.sum(1) + 1e-8))
        return obj.aggregate_loss(out.loss * seq_w[:, None], m, "seq-mean-token-mean")

    assert agree(verl_rule, verl_loss("geo_mean", actor("geo_mean", 0.4, 0.4), weighted=True), full, rtol=1e-6)
    kl_cov = functools.partial(obj.kl_cov_surrogate, k_ratio=0.05, kl_coef=1.0)
    assert not agree(ours_loss(kl_cov, weighted=True), verl_loss("kl_cov", actor("kl_cov", kl_cov_ratio=0.05,
                                                                              ppo_kl_coef=1.0), weighted=True), batches)


# --------------------------------------------------------------------------- #
# GMPO (verl geo_mean)                                                          #
# --------------------------------------------------------------------------- #
def gmpo_as_verl(c, logp, eps=(0.4, 0.4)):
    """ours with seq-mean-token-mean (1/B'), rescaled to verl's mean over all B rows (documented)."""
    out = obj.gmpo_surrogate(logp, c["old"], c["adv"], mask=c["mask"], eps_low=eps[0], eps_high=eps[1])
    b_nonempty = float((c["mask"].sum(1) > 0).sum())
    return obj.aggregate_loss(out.loss, c["mask"], "seq-mean-token-mean") * b_nonempty / c["mask"].shape[0]


@pytest.mark.parametrize("eps", [(0.4, 0.4), (0.2, 0.28), (0.05, 1.0)])
def test_gmpo_is_verls_geo_mean(eps):
    theirs = verl_loss("geo_mean", actor("geo_mean", *eps))
    assert agree(functools.partial(gmpo_as_verl, eps=eps), theirs, cases(), rtol=1e-6)


def test_gmpo_mutation_and_documented_row_mean():
    theirs = verl_loss("geo_mean", actor("geo_mean", 0.4, 0.4))
    batches = list(cases())
    assert not agree(functools.partial(gmpo_as_verl, eps=(0.4, 0.41)), theirs, batches, rtol=1e-6)
    # verl averages l_i over all B rows, rows without tokens included: with one, seq-mean-token-mean differs
    with_empty = [c for c in batches if (c["mask"].sum(1) == 0).any()]
    assert with_empty
    plain = ours_loss(functools.partial(obj.gmpo_surrogate, eps_low=0.4, eps_high=0.4), "seq-mean-token-mean")
    assert not agree(plain, theirs, with_empty, rtol=1e-6)
    full = [c for c in batches if (c["mask"].sum(1) > 0).all()]
    assert full and agree(plain, theirs, full, rtol=1e-6)


# --------------------------------------------------------------------------- #
# Clip-Cov                                                                      #
# --------------------------------------------------------------------------- #
def clip_cov_pair(clip_ratio, lb, ub, eps=(0.2, 0.2), mode="token-mean", seed_shift=0, zero_selected=True):
    cfg = actor("clip_cov", *eps, clip_cov_ratio=clip_ratio, clip_cov_lb=lb, clip_cov_ub=ub)
    fn = core_algos.get_policy_loss_fn("clip_cov")

    def theirs(c, logp):
        torch.manual_seed(1000 + c["k"])  # verl draws from torch's global generator
        loss, _ = fn(old_log_prob=c["old"], log_prob=logp, advantages=c["adv"], response_mask=c["mask"],
                     loss_agg_mode=mode, config=cfg)
        return loss

    def ours(c, logp):
        gen = torch.Generator().manual_seed(1000 + c["k"] + seed_shift)
        out = obj.clip_cov_surrogate(logp, c["old"], c["adv"], mask=c["mask"], generator=gen, eps_low=eps[0],
                                     eps_high=eps[1], clip_ratio=clip_ratio, cov_lb=lb, cov_ub=ub)
        loss = out.loss
        if zero_selected:  # documented: verl zeroes the selected tokens' value, ours only detaches it
            gen = torch.Generator().manual_seed(1000 + c["k"] + seed_shift)
            base = obj.clipped_surrogate(logp, c["old"], c["adv"], eps[0], eps[1])
            sel = obj.clip_cov_selection(obj.token_covariance(c["adv"], logp, c["mask"]), c["mask"],
                                         clip_ratio=clip_ratio, cov_lb=lb, cov_ub=ub, generator=gen,
                                         exclude=base.clipped_high | base.clipped_low)
            loss = torch.where(sel, torch.zeros_like(loss), loss)
        return obj.aggregate_loss(loss, c["mask"], mode)

    return ours, theirs


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("ratio, lb, ub", [(2e-4, 1.0, 5.0), (0.05, 1.0, 5.0), (0.3, 0.1, 3.0), (1.0, -1.0, 2.0)])
def test_clip_cov_is_verls(mode, ratio, lb, ub):
    ours, theirs = clip_cov_pair(ratio, lb, ub, mode=mode)
    assert agree(ours, theirs, cases(), rtol=RTOL[mode])
    ours_hi, theirs_hi = clip_cov_pair(ratio, lb, ub, eps=(0.2, 0.28), mode=mode)
    assert agree(ours_hi, theirs_hi, cases(seed=9), rtol=RTOL[mode])


def test_clip_cov_gradient_equal_value_documented_and_mutations():
    batches = list(cases())
    ours_detached, theirs = clip_cov_pair(0.3, 0.1, 3.0, zero_selected=False)
    # the gradient is verl's; the value keeps the detached tokens' surrogate where verl has 0
    differs = 0
    for c in batches:
        a, ga = loss_and_grad(functools.partial(ours_detached, c), c["logp"])
        b, gb = loss_and_grad(functools.partial(theirs, c), c["logp"])
        torch.testing.assert_close(ga, gb, rtol=1e-7, atol=1e-10)
        differs += not math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    assert differs > 0
    assert not agree(clip_cov_pair(0.3, 0.1, 3.0, seed_shift=1)[0], theirs, batches)  # another draw
    assert not agree(clip_cov_pair(0.3, 0.1, 3.5)[0], theirs, batches)  # another bound


# --------------------------------------------------------------------------- #
# KL-Cov                                                                        #
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("k_ratio, coef", [(2e-4, 1.0), (0.05, 1.0), (0.3, 0.1), (1.0, 2.0)])
def test_kl_cov_is_verls(mode, k_ratio, coef):
    ours = ours_loss(functools.partial(obj.kl_cov_surrogate, k_ratio=k_ratio, kl_coef=coef), mode)
    theirs = verl_loss("kl_cov", actor("kl_cov", kl_cov_ratio=k_ratio, ppo_kl_coef=coef), mode)
    assert agree(ours, theirs, cases(), rtol=RTOL[mode])


def test_kl_cov_mutations_and_documented_coefficient():
    batches = list(cases())
    theirs = verl_loss("kl_cov", actor("kl_cov", kl_cov_ratio=0.05, ppo_kl_coef=1.0))
    assert not agree(ours_loss(functools.partial(obj.kl_cov_surrogate, k_ratio=0.05, kl_coef=1.01)), theirs, batches)
    assert not agree(ours_loss(functools.partial(obj.kl_cov_surrogate, k_ratio=0.1, kl_coef=1.0)), theirs, batches)
    # verl's PolicyLossConfig defaults ppo_kl_coef to 0.1; ours (the authors' recipe) to 1
    assert PolicyLossConfig().ppo_kl_coef == 0.1 and PolicyLossConfig().kl_cov_ratio == 2e-4
    verl_default = verl_loss("kl_cov", actor("kl_cov"))
    assert agree(ours_loss(functools.partial(obj.kl_cov_surrogate, kl_coef=0.1)), verl_default, batches)
    assert not agree(ours_loss(obj.kl_cov_surrogate), verl_default, batches)


def test_documented_overflow_guard_beyond_20():
    """verl's clip_cov / kl_cov / geo_mean exponentiate unclamped: beyond |log r| = 20 they differ from ours."""
    old = torch.zeros(2, 2, dtype=D)
    logp = torch.tensor([[25.0, 0.1], [0.2, -0.1]], dtype=D)
    mask = torch.ones(2, 2, dtype=D)
    adv = torch.tensor([[-1.0, -1.0], [1.0, 1.0]], dtype=D)
    c = dict(logp=logp, old=old, adv=adv, mask=mask, k=0)
    theirs = verl_loss("kl_cov", actor("kl_cov", kl_cov_ratio=1e-6, ppo_kl_coef=0.0))(c, logp)
    ours = ours_loss(functools.partial(obj.kl_cov_surrogate, k_ratio=1e-6, kl_coef=0.0))(c, logp)
    # token (0, 0) has A = -1: verl's loss e^25, ours e^20 (the rest equal)
    assert float(theirs - ours) == pytest.approx((math.exp(25) - math.exp(20)) / 4, rel=1e-9)


# --------------------------------------------------------------------------- #
# Dr. GRPO: advantage and normaliser                                            #
# --------------------------------------------------------------------------- #
def test_dr_grpo_advantage_is_verls():
    gen = torch.Generator().manual_seed(7)
    for k in range(40):
        N, G = int(torch.randint(1, 6, (1,), generator=gen)), (2, 4, 8, 16)[k % 4]
        rewards = torch.randint(0, 2, (N, G), generator=gen).float() if k % 2 else torch.randn(N, G, generator=gen)
        if k % 3 == 0:
            rewards[0] = 0.7  # an all-equal group
        B, T = N * G, 4
        scores = torch.zeros(B, T)
        scores[:, -1] = rewards.reshape(-1)
        index = np.array([f"p{i // G}" for i in range(B)], dtype=object)
        v, _ = core_algos.compute_grpo_outcome_advantage(scores, torch.ones(B, T), index,
                                                         norm_adv_by_std_in_grpo=False)
        ours = obj.group_advantages(rewards, norm_std=False).reshape(-1)
        torch.testing.assert_close(v[:, 0], ours, rtol=1e-6, atol=1e-6)
        # mutation: GRPO's std-normalised advantage is not Dr. GRPO's
        if (rewards.std(dim=1) > 0).any() and k % 2:
            assert not torch.allclose(v[:, 0], obj.group_advantages(rewards, norm_std=True).reshape(-1), atol=1e-3)
    # documented: a group of one response: verl A = R (mean 0), ours exactly 0
    v, _ = core_algos.compute_grpo_outcome_advantage(torch.tensor([[0.0, 2.0]]), torch.ones(1, 2),
                                                     np.array(["solo"], dtype=object), norm_adv_by_std_in_grpo=False)
    assert v[0, 0] == 2.0 and obj.group_advantages(torch.tensor([[2.0]]), norm_std=False)[0, 0] == 0


def test_grpo_advantage_is_verls_grpo_and_grpo_vectorized():
    """GRPO's estimator (ours, with and without the std; computed in float32, as the project trains) against verl's
    two registered GRPO estimators given float64 rewards: both equal to float32's precision. The documented
    difference between verl's two: ``grpo_vectorized``'s ``group_mean_std`` (verl/utils/groupwise.py) computes the
    groups' mean and std in float32 whatever the input's dtype, where ``grpo`` keeps float64, so the two differ by
    rounding (asserted: above 1e-10 in some cases, never above 1e-5), and a group whose equal rewards float32
    cannot hold exactly (0.7 here; never the toy's or math's +-1 rewards) gets ``grpo_vectorized`` a rounding residue
    divided by ``std + 1e-6`` (an advantage of 0.01-0.12 here, asserted above 1e-4) where ours and ``grpo``
    give 0."""
    gen = torch.Generator().manual_seed(11)
    grpo, vectorized = (core_algos.get_adv_estimator_fn(n) for n in ("grpo", "grpo_vectorized"))
    rounding = 0
    for k in range(40):
        N, G, T = int(torch.randint(1, 6, (1,), generator=gen)), (2, 3, 4, 8, 16)[k % 5], 6
        rewards = (torch.randint(0, 2, (N, G), generator=gen).to(D) * 2 - 1 if k % 2
                   else torch.randn(N, G, generator=gen, dtype=D))
        if k % 3 == 0:
            rewards[0] = 0.7  # an all-equal group
        B = N * G
        lengths = torch.randint(1, T + 1, (B,), generator=gen)
        mask = (torch.arange(T)[None] < lengths[:, None]).to(D)
        scores = torch.zeros(B, T, dtype=D)
        scores[torch.arange(B), lengths - 1] = rewards.reshape(-1)
        index = np.array([f"p{i // G}" for i in range(B)], dtype=object)
        for norm_std in (True, False):
            ours = obj.group_advantages(rewards, norm_std=norm_std, eps=1e-6).to(D).reshape(-1, 1) * mask
            v, _ = grpo(token_level_rewards=scores.clone(), response_mask=mask, index=index,
                        norm_adv_by_std_in_grpo=norm_std)
            w, _ = vectorized(token_level_rewards=scores.clone(), response_mask=mask, index=index,
                              norm_adv_by_std_in_grpo=norm_std, config=AlgoConfig(norm_adv_by_std_in_grpo=norm_std))
            torch.testing.assert_close(ours, v.to(D), rtol=1e-6, atol=1e-6)
            rows = slice(G, None) if k % 3 == 0 else slice(None)  # the all-equal group 0.7: below
            torch.testing.assert_close(ours[rows], w.to(D)[rows], rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(v.to(D)[rows], w.to(D)[rows], rtol=1e-5, atol=1e-5)
            gap = (v.to(D) - w.to(D))[rows].abs()
            rounding += bool(gap.numel()) and float(gap.max()) > 1e-10
            if k % 3 == 0:
                assert not ours[:G].any() and float(v[:G].abs().max()) < 1e-9
                residue = float(w[:G].abs().max())
                assert (1e-4 < residue < 1) if norm_std else residue < 1e-6, (k, norm_std, residue)
    assert rounding > 0, "grpo_vectorized matched grpo in float64: its float32 statistics are no longer a difference"


def test_dr_grpo_normaliser_is_verls_with_its_global_batch_normalisers():
    for c in cases(n=24):
        B, T = c["mask"].shape
        L = T + 3  # L_max: the generation cap, wider than this batch's padding
        loss_mat = c["logp"] - c["old"]

        def theirs(x, gbs=B, lsf=L, c=c):
            return core_algos.agg_loss(x, c["mask"], "seq-mean-token-sum-norm", global_batch_size=gbs,
                                       loss_scale_factor=lsf)

        def ours(x, max_len=L, c=c):
            return obj.aggregate_loss(x, c["mask"], "seq-mean-token-sum-norm", max_len=max_len)

        a, ga = loss_and_grad(ours, loss_mat)
        b, gb = loss_and_grad(theirs, loss_mat)
        torch.testing.assert_close(a, b.to(a.dtype), rtol=1e-6, atol=1e-12)
        torch.testing.assert_close(ga, gb, rtol=1e-6, atol=1e-12)
        # documented: verl's defaults divide by the rows with tokens (B') and the padded width T
        b_nonempty = float((c["mask"].sum(1) > 0).sum())
        d = core_algos.agg_loss(loss_mat, c["mask"], "seq-mean-token-sum-norm")
        torch.testing.assert_close(d.to(D), ours(loss_mat, max_len=T) * B / b_nonempty, rtol=1e-6, atol=1e-12)
        # mutation: a normaliser of B' responses (not G) is not the paper's
        if b_nonempty < B:
            assert not torch.allclose(theirs(loss_mat, gbs=b_nonempty).to(D), ours(loss_mat))


# --------------------------------------------------------------------------- #
# Sequence-level rollout correction and the band mask                           #
# --------------------------------------------------------------------------- #
def test_sequence_is_weights_are_verls_seq_tis():
    geometric_differs = 0
    for c in cases(n=24):
        engine = c["old"] + 0.05 * torch.randn_like(c["old"]) * (1 + c["k"] % 3)
        for cap in (2.0, 5.0, 1e9):
            w, _ = rc.compute_rollout_correction_weights(c["old"] - engine, c["mask"], rollout_is="sequence",
                                                         rollout_is_threshold=cap)
            ours = obj.sequence_is_weights(c["old"], engine, c["mask"], cap=cap)
            torch.testing.assert_close(ours * c["mask"], w, rtol=1e-9, atol=1e-12)
            # mutation: the geometric mean is another weight (wherever a row has two tokens or more)
            geo = obj.sequence_is_weights(c["old"], engine, c["mask"], cap=cap, aggregation="geometric")
            geometric_differs += not torch.allclose(geo * c["mask"], w)
    assert geometric_differs > 0


@pytest.mark.parametrize("level, option", [("token", "token_k1"), ("sequence", "seq_sum_k1"),
                                           ("geometric", "seq_mean_k1")])
def test_band_mask_is_verls_rejection_with_inverted_bounds(level, option):
    n_rejected = n_inverted_differs = 0
    for c in cases(n=24):
        engine = c["old"] + 0.4 * torch.randn_like(c["old"])
        for low, high in ((0.5, 2.0), (0.5, 5.0), (0.9, 1.3)):
            ours = obj.rollout_band_mask(c["old"], engine, c["mask"], low=low, high=high, level=level)
            # documented: verl's k1 "lo_hi" bounds -log(ratio): ours (low, high) is verl's (1/high, 1/low)
            theirs, _ = rc.compute_rollout_rejection_mask(c["old"] - engine, c["mask"], rollout_rs=option,
                                                          rollout_rs_threshold=f"{1 / high}_{1 / low}")
            assert torch.equal(ours, theirs), (c["k"], low, high)
            n_rejected += int((c["mask"] - ours).sum())
            if low * high != 1.0:  # the same string in verl is another band (its bounds read on 1/ratio)
                same_string, _ = rc.compute_rollout_rejection_mask(c["old"] - engine, c["mask"], rollout_rs=option,
                                                                   rollout_rs_threshold=f"{low}_{high}")
                n_inverted_differs += not torch.equal(ours, same_string)
    assert n_rejected > 0 and n_inverted_differs > 0


def test_icepop_weights_are_verls_token_icepop():
    cfg = rc.RolloutCorrectionConfig.decoupled_token_icepop() if hasattr(rc, "RolloutCorrectionConfig") else None
    spec = cfg.rollout_is_threshold if cfg is not None else "0.5_5.0"
    assert spec == "0.5_5.0"
    n_cut = 0
    for c in cases(n=24):
        engine = c["old"] + 0.6 * torch.randn_like(c["old"])
        ours = obj.truncated_is_weights(c["old"], engine, cap=5.0) * obj.rollout_band_mask(c["old"], engine,
                                                                                              c["mask"])
        try:
            w, _ = rc.compute_rollout_correction_weights(c["old"] - engine, c["mask"], rollout_is="token",
                                                         rollout_is_threshold=spec)
        except ZeroDivisionError:  # verl's metrics divide by 0 when every weight of the batch is 0
            assert torch.equal(ours, torch.zeros_like(ours))
            continue
        torch.testing.assert_close(ours, w, rtol=1e-12, atol=0.0)
        # mutation: the band, not the cap alone (a rejected token would keep weight 5)
        capped = obj.truncated_is_weights(c["old"], engine, cap=5.0) * c["mask"]
        n_cut += not torch.equal(capped, w)
    assert n_cut > 0


# the rollout_correction switch's weight, in each form its verl translation gives (rollout_is level and
# threshold: the cap, or "low_high" for a band with the cap at or above its top)
RC_FORMS = [
    ({"level": "sequence", "cap": 2.0}, "sequence", 2.0),
    ({"level": "token", "cap": 2.0}, "token", 2.0),
    ({"level": "token", "cap": 5.0, "band_low": 0.5, "band_high": 5.0}, "token", "0.5_5.0"),
    ({"level": "sequence", "cap": 1e9, "band_low": 0.2, "band_high": 4.0}, "sequence", "0.2_4.0"),
]


@pytest.mark.parametrize("ours_kw, level, threshold", RC_FORMS)
def test_rollout_correction_weights_are_verls_in_their_translation(ours_kw, level, threshold):
    n_compared = n_mutation_seen = 0
    for c in cases(n=24):
        engine = c["old"] + 0.3 * torch.randn_like(c["old"]) * (1 + c["k"] % 3) / c["old"].shape[1] ** 0.5
        ours = obj.rollout_correction_weights(c["old"], engine, c["mask"], **ours_kw)
        try:
            w, _ = rc.compute_rollout_correction_weights(c["old"] - engine, c["mask"], rollout_is=level,
                                                         rollout_is_threshold=threshold)
        except ZeroDivisionError:  # verl's metrics divide by 0 when every weight of the batch is 0
            continue
        torch.testing.assert_close(ours * c["mask"], w, rtol=1e-9, atol=1e-12)
        n_compared += 1
        # mutation: the other level is another weight
        other = obj.rollout_correction_weights(c["old"], engine, c["mask"],
                                               **{**ours_kw, "level": "token" if level == "sequence" else "sequence"})
        n_mutation_seen += not torch.allclose(other * c["mask"], w)
    assert n_compared > 10 and n_mutation_seen > 0
