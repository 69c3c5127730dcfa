"""Hand-computed tests of the GRPO family after DAPO in dapo_exp.objective (issue 22).

Dr. GRPO (advantage without std, constant normaliser), GSPO / GSPO-token, CISPO, GMPO,
Clip-Cov, KL-Cov, the top-entropy token mask (against TRL's own selection) and the
sequence-level rollout correction. Parity with verl's registered losses: tests/test_verl_parity.py.
"""

import functools
import math
from types import SimpleNamespace

import pytest
import torch

from dapo_exp import objective as obj

D = torch.float64


def _t(x):
    return torch.tensor(x, dtype=D)


def _grad(fn, logp):
    """d fn(logp) / d logp for a leaf copy of logp."""
    leaf = logp.detach().clone().requires_grad_()
    (g,) = torch.autograd.grad(fn(leaf), leaf)
    return g


# --------------------------------------------------------------------------- #
# Dr. GRPO (Liu et al. 2025, arXiv 2503.20783)                                  #
# --------------------------------------------------------------------------- #
def test_dr_grpo_advantage_is_reward_minus_group_mean():
    r = _t([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    a = obj.group_advantages(r, norm_std=False)
    # Dr. GRPO Eq. (3): A_i = R_i - mean_j R_j, no division by std
    assert torch.allclose(a, torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.75, -0.25, -0.25, -0.25]]).float())
    assert torch.equal(obj.group_advantages(_t([[2.0, 2.0, 2.0]]), norm_std=False), torch.zeros(1, 3))


def test_dr_grpo_normaliser_is_responses_times_max_length():
    """Dr. GRPO: sum_i sum_t l_it / (G * L_max) per group; the mean over N groups is sum / (N G L_max)."""
    loss = _t([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0], [5.0, 6.0, 0.0, 0.0], [9.0, 9.0, 9.0, 9.0]])
    mask = _t([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]])  # last response filtered out
    L = 10
    # one group of G = 4: (6 + 4 + 11 + 0) / (4 * 10); the empty response still counts in G
    assert obj.aggregate_loss(loss, mask, "seq-mean-token-sum-norm", max_len=L).item() == pytest.approx(21 / 40)
    # two groups of G = 2: mean of (6 + 4) / (2 L) and (11 + 0) / (2 L) = 21 / (4 L)
    per_group = [(6 + 4) / (2 * L), 11 / (2 * L)]
    assert obj.aggregate_loss(loss, mask, "seq-mean-token-sum-norm", max_len=L).item() == pytest.approx(
        sum(per_group) / 2)
    # the weight is the same constant 1 / (B L_max) for every token, whatever its response's length
    w = obj.loss_normaliser(mask, "seq-mean-token-sum-norm", max_len=L)
    assert torch.allclose(w.double(), torch.full((4,), 1 / 40, dtype=D))
    g = _grad(lambda x: obj.aggregate_loss(x, mask, "seq-mean-token-sum-norm", max_len=L), loss)
    assert torch.allclose(g, mask / 40)


# --------------------------------------------------------------------------- #
# GSPO                                                                          #
# --------------------------------------------------------------------------- #
def _gspo_batch():
    # row 0: log-ratios 0.2, 0.0 (mean 0.1, s = e^0.1); row 1: -0.002, 0 (s = e^-0.001);
    # the padding (column 2) holds garbage that must not enter s_i
    old = _t([[-1.0, -2.0, -3.0], [-1.0, -2.0, -3.0]])
    logp = old + _t([[0.2, 0.0, 50.0], [-0.002, 0.0, -50.0]])
    mask = _t([[1, 1, 0], [1, 1, 0]])
    return logp, old, mask


@pytest.mark.parametrize("form", obj.GSPO_FORMS)
def test_gspo_hand_values_and_flags(form):
    logp, old, mask = _gspo_batch()
    s0, s1 = math.exp(0.1), math.exp(-0.001)
    pos = obj.gspo_surrogate(logp, old, _t([1.0, 1.0]), mask=mask, form=form)
    assert torch.allclose(pos.ratio[:, :2], _t([[s0, s0], [s1, s1]]))
    # A > 0: -min(s, clip(s, 1 - 3e-4, 1 + 4e-4)): row 0 capped at 1.0004, row 1 unclipped
    assert torch.allclose(pos.loss[:, :2], _t([[-1.0004, -1.0004], [-s1, -s1]]))
    assert pos.clipped_high[:, :2].tolist() == [[True, True], [False, False]] and not pos.clipped_low.any()
    neg = obj.gspo_surrogate(logp, old, _t([-1.0, -1.0]), mask=mask, form=form)
    # A < 0: max(s, clip(s)): row 0 unclipped (s > 1), row 1 floored at 1 - 3e-4
    assert torch.allclose(neg.loss[:, :2], _t([[s0, s0], [0.9997, 0.9997]]))
    assert neg.clipped_low[:, :2].tolist() == [[False, False], [True, True]] and not neg.clipped_high.any()
    assert not neg.clipped_dual.any()


def test_gspo_forms_agree_for_sequence_advantages_under_every_aggregation():
    torch.manual_seed(0)
    B, T = 5, 6
    mask = (torch.arange(T)[None] < torch.tensor([6, 1, 3, 0, 4])[:, None]).to(D)
    old = -torch.rand(B, T, dtype=D) * 3
    logp = old + torch.randn(B, T, dtype=D) * 0.05
    adv = torch.randn(B, 1, dtype=D)
    groups = torch.tensor([0, 0, 1, 1, 1])
    for mode in obj.LOSS_AGG_MODES:
        def f(form, mode=mode):
            return lambda x: obj.aggregate_loss(
                obj.gspo_surrogate(x, old, adv, mask=mask, eps_low=0.02, eps_high=0.03, form=form).loss, mask, mode,
                groups)
        assert f("token")(logp).item() == pytest.approx(f("sequence")(logp).item(), rel=1e-12)
        torch.testing.assert_close(_grad(f("token"), logp), _grad(f("sequence"), logp), rtol=1e-10, atol=1e-14)


def test_gspo_sequence_gradient_is_paper_eq_and_forms_differ_with_token_advantages():
    logp, old, mask = _gspo_batch()
    adv = _t([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]])

    def seq_loss(x):
        return obj.aggregate_loss(obj.gspo_surrogate(x, old, adv, mask=mask, eps_low=0.5, eps_high=0.5,
                                                     form="sequence").loss, mask, "seq-mean-token-mean")

    # GSPO Eq. (8): grad J = (1/G) sum_i s_i A_i (1/|y_i|) sum_t grad logp_it (no clip active)
    s = torch.exp(_t([0.1, -0.001]))
    expected = -(s * adv[:, 0] / 2)[:, None] / 2 * mask
    torch.testing.assert_close(_grad(seq_loss, logp), expected)
    # GSPO-token with an advantage that varies along the response: token t gets -s_i A_it w_i
    tok_adv = _t([[1.0, 3.0, 0.0], [-2.0, 0.0, 0.0]])
    tok = _grad(lambda x: obj.aggregate_loss(obj.gspo_surrogate(x, old, tok_adv, mask=mask, eps_low=0.5,
                                                                eps_high=0.5).loss, mask, "token-mean"), logp)
    torch.testing.assert_close(tok, -(s[:, None] * tok_adv) / 4 * mask)
    seq = _grad(lambda x: obj.aggregate_loss(obj.gspo_surrogate(x, old, tok_adv, mask=mask, eps_low=0.5,
                                                                eps_high=0.5, form="sequence").loss, mask,
                                             "token-mean"), logp)
    assert not torch.allclose(tok, seq)
    # the sequence form uses the masked row mean of the advantages (2 and -1 here)
    torch.testing.assert_close(seq, -(s * _t([2.0, -1.0]) / 2)[:, None] * 2 / 4 * mask)


def test_gspo_empty_row_guard_and_validation():
    old = torch.zeros(3, 2, dtype=D)
    logp = _t([[12.0, 12.0], [5.0, 5.0], [-3.0, -3.0]])
    mask = _t([[1, 1], [0, 0], [1, 1]])
    out = obj.gspo_surrogate(logp, old, _t([-1.0, 1.0, 1.0]), mask=mask)
    # row 0: log s = 12 clamped to 10 (verl's guard); row 1 has no tokens: s = 1; row 2: e^-3
    torch.testing.assert_close(out.ratio[:, 0], _t([math.exp(10), 1.0, math.exp(-3)]))
    assert torch.isfinite(out.loss).all()
    with pytest.raises(ValueError, match="token, sequence"):
        obj.gspo_surrogate(logp, old, _t([1.0, 1.0, 1.0]), mask=mask, form="seq")
    with pytest.raises(ValueError, match="eps_low"):
        obj.gspo_surrogate(logp, old, _t([1.0, 1.0, 1.0]), mask=mask, eps_low=-1)
    with pytest.raises(TypeError):
        obj.gspo_surrogate(logp, old, _t([1.0, 1.0, 1.0]), mask, 0.1, 0.1)  # scalars are keyword-only


# --------------------------------------------------------------------------- #
# CISPO                                                                         #
# --------------------------------------------------------------------------- #
def test_cispo_hand_values_gradient_and_flags():
    old = _t([[-1.0, -1.0, -1.0, -1.0]])
    logp = old + torch.log(_t([[0.5, 1.0, 3.0, 6.0]]))
    for a in (2.0, -2.0):
        adv = _t([a])
        out = obj.cispo_surrogate(logp, old, adv)
        # defaults: no lower bound (1 - 1 = 0), weight capped at 1 + 4 = 5
        w = _t([[0.5, 1.0, 3.0, 5.0]])
        torch.testing.assert_close(out.loss, -w * a * logp)
        # the weight is detached: d l / d logp = -w A on every token, none is dropped
        torch.testing.assert_close(_grad(lambda x, adv=adv: obj.cispo_surrogate(x, old, adv).loss.sum(), logp), -w * a)
        assert out.clipped_high.tolist() == [[False, False, False, True]] and not out.clipped_low.any()
    narrow = obj.cispo_surrogate(logp, old, _t([1.0]), eps_low=0.2, eps_high=0.2)
    torch.testing.assert_close(_grad(lambda x: obj.cispo_surrogate(x, old, _t([1.0]), eps_low=0.2,
                                                                   eps_high=0.2).loss.sum(), logp),
                               -_t([[0.8, 1.0, 1.2, 1.2]]))
    assert narrow.clipped_low.tolist() == [[True, False, False, False]]
    assert narrow.clipped_high.tolist() == [[False, False, True, True]]


def test_cispo_keeps_gradient_where_ppo_clip_drops_it():
    old = torch.zeros(1, 2, dtype=D)
    logp = torch.log(_t([[1.5, 0.5]]))
    adv = _t([[1.0, -1.0]])
    ppo = _grad(lambda x: obj.clipped_surrogate(x, old, adv, 0.2, 0.2).loss.sum(), logp)
    cis = _grad(lambda x: obj.cispo_surrogate(x, old, adv, eps_low=0.2, eps_high=0.2).loss.sum(), logp)
    assert torch.equal(ppo, torch.zeros_like(ppo))  # both tokens clipped by PPO: no gradient
    torch.testing.assert_close(cis, _t([[-1.2, 0.8]]))


# --------------------------------------------------------------------------- #
# GMPO                                                                          #
# --------------------------------------------------------------------------- #
def test_gmpo_hand_values_against_the_product_formula():
    d = _t([[0.5, -0.5, 0.1, 7.0], [0.5, -0.5, 0.1, 7.0]])  # column 3 is padding
    old = torch.full_like(d, -2.0)
    logp = old + d
    mask = _t([[1, 1, 1, 0], [1, 1, 1, 0]])
    adv = _t([1.0, -1.0])
    out = obj.gmpo_surrogate(logp, old, adv, mask=mask)
    lo, hi = math.exp(-0.4), math.exp(0.4)

    def paper(a, ratios):  # GMPO Eq. (4): {prod_t |min(r A, clip(r) A)|}^(1/|o|) sgn(A)
        prod = 1.0
        for r in ratios:
            prod *= abs(min(r * a, min(max(r, lo), hi) * a))
        return prod ** (1 / len(ratios)) * math.copysign(1.0, a)

    r = [math.exp(0.5), math.exp(-0.5), math.exp(0.1)]
    expected = [-paper(1.0, r), -paper(-1.0, r)]
    assert expected[0] == pytest.approx(-1.0)  # A > 0: (0.4 - 0.5 + 0.1) / 3 = 0
    assert expected[1] == pytest.approx(math.exp(0.2 / 3))  # A < 0: (0.5 - 0.4 + 0.1) / 3
    torch.testing.assert_close(out.loss[:, :3], _t(expected)[:, None].expand(2, 3))
    # flags at padding are not masked here (policy_loss counts masked tokens only), as clipped_surrogate
    assert out.clipped_high[:, :3].tolist() == [[True, False, False], [False] * 3]
    assert out.clipped_low[:, :3].tolist() == [[False] * 3, [False, True, False]]
    # gradient (seq-mean-token-mean = (1/G) sum_i l_i): -A_i R_i / |o_i| / G on unclipped tokens, 0 on clipped ones
    g = _grad(lambda x: obj.aggregate_loss(obj.gmpo_surrogate(x, old, adv, mask=mask).loss, mask,
                                           "seq-mean-token-mean"), logp)
    R1 = math.exp(0.2 / 3)
    torch.testing.assert_close(g, _t([[0.0, -1 / 6, -1 / 6, 0.0], [R1 / 6, 0.0, R1 / 6, 0.0]]))


def test_gmpo_empty_row_and_zero_advantage():
    logp = _t([[0.3, 0.1], [9.0, 9.0]])
    mask = _t([[1, 1], [0, 0]])
    out = obj.gmpo_surrogate(logp, torch.zeros_like(logp), _t([0.0, 1.0]), mask=mask)
    assert torch.equal(out.loss, torch.zeros_like(logp))  # A = 0 and a row without tokens: nothing
    assert out.ratio[1, 0].item() == 1.0


# --------------------------------------------------------------------------- #
# Clip-Cov and KL-Cov                                                           #
# --------------------------------------------------------------------------- #
def _cov_batch():
    # A mean 0, logp mean -2 over the 4 masked tokens: cov = [[1, -1], [0, 0]]; the padded
    # column holds values that would change both means if they leaked in
    logp = _t([[-1.0, -3.0, 40.0], [-2.0, -2.0, 40.0]])
    adv = _t([[1.0, 1.0, 7.0], [-1.0, -1.0, 7.0]])
    mask = _t([[1, 1, 0], [1, 1, 0]])
    return logp, adv, mask


def test_token_covariance_hand_values():
    logp, adv, mask = _cov_batch()
    torch.testing.assert_close(obj.token_covariance(adv, logp, mask), _t([[1.0, -1.0, 0.0], [0.0, 0.0, 0.0]]))
    assert torch.equal(obj.token_covariance(adv, logp, torch.zeros_like(mask)), torch.zeros_like(logp))


def test_clip_cov_detaches_the_selected_token_only():
    logp, adv, mask = _cov_batch()
    old = logp.detach().clone()  # r = 1: nothing PPO-clipped
    kw = dict(mask=mask, generator=torch.Generator().manual_seed(0), clip_ratio=0.25, cov_lb=0.5, cov_ub=5.0)
    out = obj.clip_cov_surrogate(logp, old, adv, **kw)
    base = obj.clipped_surrogate(logp, old, adv, 0.2, 0.2)
    torch.testing.assert_close(out.loss, base.loss)  # stop-gradient: value kept
    g = _grad(lambda x: (obj.clip_cov_surrogate(x, old, adv, **kw | dict(generator=torch.Generator().manual_seed(0)))
                         .loss * mask).sum(), logp)
    # only (0, 0) has cov in (0.5, 5): its gradient is cut; the others keep -A r
    torch.testing.assert_close(g, _t([[0.0, -1.0, 0.0], [1.0, 1.0, 0.0]]))
    # a token the PPO clip already bounds is not a candidate: nothing is cut
    old2 = old.clone()
    old2[0, 0] -= 0.5  # r = e^0.5 > 1.2 with A > 0
    g2 = _grad(lambda x: (obj.clip_cov_surrogate(x, old2, adv, **kw).loss * mask).sum(), logp)
    torch.testing.assert_close(g2, _grad(lambda x: (obj.clipped_surrogate(x, old2, adv).loss * mask).sum(), logp))


def test_clip_cov_selection_count_and_reproducibility():
    torch.manual_seed(3)
    cov = torch.rand(8, 50, dtype=D) * 6  # about 2/3 of the tokens in (1, 5)
    mask = (torch.rand(8, 50) < 0.8).to(D)
    mask[2] = 0
    cand = mask.bool() & (cov > 1) & (cov < 5)
    n_tok = int(mask.sum())

    def sel(seed, ratio):
        return obj.clip_cov_selection(cov, mask, clip_ratio=ratio, cov_lb=1.0, cov_ub=5.0,
                                      generator=torch.Generator().manual_seed(seed))

    for ratio in (2e-4, 0.05, 0.3, 1.0):
        s = sel(0, ratio)
        assert int(s.sum()) == min(max(int(ratio * n_tok), 1), int(cand.sum()))
        assert not (s & ~cand).any()  # only candidates, never padding
        assert torch.equal(s, sel(0, ratio))  # same seed, same draw
    assert not torch.equal(sel(0, 0.05), sel(1, 0.05))
    # the draw is verl's: the first n of randperm(#candidates) over the candidates in row-major order
    flat = torch.nonzero(cand.reshape(-1), as_tuple=True)[0]
    n = max(int(0.05 * n_tok), 1)
    expected = torch.zeros(8 * 50, dtype=torch.bool)
    expected[flat[torch.randperm(flat.numel(), generator=torch.Generator().manual_seed(7))[:n]]] = True
    assert torch.equal(sel(7, 0.05).reshape(-1), expected)


def test_kl_cov_hand_values_and_gradient():
    logp, adv, mask = _cov_batch()
    old = logp.detach().clone()
    old[0, 0] -= 0.1  # (0, 0): r = e^0.1, |log r| = 0.1
    out = obj.kl_cov_surrogate(logp, old, adv, mask=mask, k_ratio=0.25, kl_coef=1.0)
    # k = max(1, int(4 * 0.25)) = 1 token: the top covariance (0, 0)
    ratio = torch.exp(logp - old)
    expected = -adv * ratio
    expected[0, 0] += 0.1
    torch.testing.assert_close(out.loss * mask, expected * mask)
    g = _grad(lambda x: (obj.kl_cov_surrogate(x, old, adv, mask=mask, k_ratio=0.25, kl_coef=1.0).loss * mask).sum(),
              logp)
    # d(-A r + kappa |log r|) = -A r + kappa sign(log r)
    torch.testing.assert_close(g, _t([[-math.exp(0.1) + 1.0, -1.0, 0.0], [1.0, 1.0, 0.0]]))
    assert not (out.clipped_high.any() or out.clipped_low.any() or out.clipped_dual.any())
    # no clipping anywhere: a huge ratio with A > 0 keeps its gradient
    old3 = logp.detach() - 2.0
    g3 = _grad(lambda x: (obj.kl_cov_surrogate(x, old3, adv, mask=mask, k_ratio=1e-9, kl_coef=0.0).loss
                          * mask).sum(), logp)
    torch.testing.assert_close(g3, -adv * math.exp(2.0) * mask)
    assert obj.kl_cov_selection(torch.zeros(2, 2), torch.zeros(2, 2), k_ratio=0.5).sum() == 0
    with pytest.raises(ValueError, match="k_ratio"):
        obj.kl_cov_surrogate(logp, old, adv, mask=mask, k_ratio=0.0)


# --------------------------------------------------------------------------- #
# the family plugs into policy_loss; sequence-local surrogates accumulate exactly #
# --------------------------------------------------------------------------- #
SURROGATES = {
    "gspo": functools.partial(obj.gspo_surrogate, eps_low=0.01, eps_high=0.02),
    "gspo_seq": functools.partial(obj.gspo_surrogate, eps_low=0.01, eps_high=0.02, form="sequence"),
    "gmpo": functools.partial(obj.gmpo_surrogate, eps_low=0.4, eps_high=0.4),
    "cispo": functools.partial(obj.cispo_surrogate, eps_high=4.0),
}


@pytest.mark.parametrize("name", SURROGATES)
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_family_through_policy_loss_accumulates_exactly(name, mode):
    torch.manual_seed(4)
    B, T = 6, 5
    mask = (torch.arange(T)[None] < torch.tensor([5, 2, 0, 4, 1, 3])[:, None]).to(D)
    old = -torch.rand(B, T, dtype=D) * 2
    adv = torch.randn(B, 1, dtype=D)
    theta = (old + torch.randn(B, T, dtype=D) * 0.1).requires_grad_()
    base = SURROGATES[name]
    needs_mask = name != "cispo"

    def bind(m):
        return functools.partial(base, mask=m) if needs_mask else base

    whole = obj.aggregate_loss(bind(mask)(theta, old, adv).loss, mask, mode)
    ref = torch.autograd.grad(whole, theta)[0]
    weights = obj.loss_normaliser(mask, mode)
    total = 0.0
    for sl in (slice(0, 2), slice(2, 5), slice(5, 6)):
        loss, stats = obj.policy_loss(logp=theta[sl], old_logp=old[sl], advantages=adv[sl], mask=mask[sl],
                                      weights=weights[sl], surrogate=bind(mask[sl]))
        loss.backward()
        total += float(loss.detach())
        assert set(stats) >= {"n_clipped_high", "n_clipped_low", "ratio_sum"}
    assert total == pytest.approx(float(whole), rel=1e-12, abs=1e-15)
    torch.testing.assert_close(theta.grad, ref, rtol=1e-10, atol=1e-14)


# --------------------------------------------------------------------------- #
# Top-entropy tokens (Beyond the 80/20 rule)                                    #
# --------------------------------------------------------------------------- #
def test_top_entropy_mask_hand_values():
    ent = torch.tensor([[0.1, 0.5, 0.9, 0.3], [0.7, 0.2, 99.0, 99.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    # masked entropies sorted: 0.1 0.2 0.3 0.5 0.7 0.9; 0.8-quantile at rank 0.8 * 5 = 4: 0.7
    assert obj.top_entropy_mask(ent, mask).tolist() == [[False, False, True, False], [True, False, False, False]]
    # rho = 0.5: rank 2.5, threshold (0.3 + 0.5) / 2 = 0.4
    half = obj.top_entropy_mask(ent, mask, rho=0.5)
    assert half.tolist() == [[False, True, True, False], [True, False, False, False]]
    assert obj.top_entropy_mask(ent, mask, rho=1.0).tolist() == mask.bool().tolist()
    # ties at the threshold are all kept; nothing masked in: nothing kept
    assert obj.top_entropy_mask(torch.ones(2, 3), torch.ones(2, 3)).all()
    assert not obj.top_entropy_mask(ent, torch.zeros_like(mask)).any()
    with pytest.raises(ValueError, match="rho"):
        obj.top_entropy_mask(ent, mask, rho=0.0)


def _trl_high_entropy_mask():
    grpo = pytest.importorskip("trl.trainer.grpo_trainer", reason="TRL is not installed here")
    one_process = SimpleNamespace(accelerator=SimpleNamespace(pad_across_processes=lambda t, dim, pad_index: t,
                                                              gather=lambda t: t))
    return functools.partial(grpo.GRPOTrainer.get_high_entropy_mask, one_process)


def test_top_entropy_mask_is_trls_selection():
    trl_mask = _trl_high_entropy_mask()
    gen = torch.Generator().manual_seed(0)
    n_cases = 0
    for case in range(120):
        B, T = int(torch.randint(1, 9, (1,), generator=gen)), int(torch.randint(1, 40, (1,), generator=gen))
        ent = torch.rand(B, T, generator=gen) * 3
        if case % 3 == 0:  # heavy ties: a few distinct values
            ent = (ent * 2).round() / 2
        if case % 5 == 0:
            ent[:, : T // 2] = 0.0  # many zero entropies (confident tokens)
        lengths = torch.randint(0, T + 1, (B,), generator=gen)
        mask = (torch.arange(T)[None] < lengths[:, None]).long()
        if B > 1:
            mask[int(torch.randint(0, B, (1,), generator=gen))] = 0  # a fully masked row
        for rho in (0.2, 0.05, 0.5, 0.8, 1.0):
            ours = obj.top_entropy_mask(ent, mask, rho=rho)
            theirs = trl_mask(ent, mask, 1 - rho)
            assert torch.equal(ours, theirs), (case, rho)
            n_cases += 1
    assert n_cases == 600


# --------------------------------------------------------------------------- #
# Sequence-level rollout correction                                             #
# --------------------------------------------------------------------------- #
def test_sequence_is_weights_hand_values():
    engine = torch.zeros(3, 3, dtype=D)
    old = _t([[0.5, 0.5, 9.0], [-1.0, -1.0, 9.0], [3.0, 3.0, 3.0]])
    mask = _t([[1, 1, 0], [1, 1, 0], [0, 0, 0]])
    prod = obj.sequence_is_weights(old, engine, mask, cap=2.0)
    # row 0: e^(0.5 + 0.5) = 2.72 truncated at 2; row 1: e^-2; row 2 has no tokens: 1
    torch.testing.assert_close(prod, _t([2.0, math.exp(-2), 1.0])[:, None].expand(3, 3))
    geo = obj.sequence_is_weights(old, engine, mask, cap=2.0, aggregation="geometric")
    torch.testing.assert_close(geo[:, 0], _t([math.exp(0.5), math.exp(-1), 1.0]))
    big = obj.sequence_is_weights(_t([[30.0, 30.0]]), torch.zeros(1, 2, dtype=D), torch.ones(1, 2), cap=1e12)
    assert big[0, 0].item() == pytest.approx(math.exp(20))  # log ratio clamped at +-20
    assert not obj.sequence_is_weights(old.requires_grad_(), engine, mask).requires_grad
    with pytest.raises(ValueError, match="product, geometric"):
        obj.sequence_is_weights(old, engine, mask, aggregation="sum")
    with pytest.raises(ValueError, match="cap"):
        obj.sequence_is_weights(old, engine, mask, cap=0.5)


def test_rollout_band_mask_levels_and_icepop():
    engine = torch.zeros(1, 5, dtype=D)
    old = torch.log(_t([[0.4, 0.5, 1.0, 5.0, 6.0]]))
    mask = torch.ones(1, 5, dtype=D)
    assert obj.rollout_band_mask(old, engine, mask).tolist() == [[0.0, 1.0, 1.0, 1.0, 0.0]]
    # sequence level: product 0.4 * 0.5 * 1 * 5 * 6 = 6 > 5: the whole response is rejected
    assert obj.rollout_band_mask(old, engine, mask, level="sequence").sum() == 0
    # geometric: 6^(1/5) = 1.43 in [0.5, 5]: kept
    assert obj.rollout_band_mask(old, engine, mask, level="geometric").tolist() == mask.tolist()
    assert obj.rollout_band_mask(old, engine, mask, low=1.0, high=1.0).tolist() == [[0.0, 0.0, 1.0, 0.0, 0.0]]
    # padding stays 0, rows without tokens stay empty
    m2 = _t([[0, 1, 1, 1, 0]])  # product 0.5 * 1 * 5 = 2.5: kept; the unmasked ends stay 0
    assert obj.rollout_band_mask(old, engine, m2, level="sequence").tolist() == m2.tolist()
    m3 = _t([[1, 1, 1, 0, 0]])  # product 0.4 * 0.5 * 1 = 0.2 < 0.5: rejected
    assert obj.rollout_band_mask(old, engine, m3, level="sequence").sum() == 0
    # IcePop's weight: the ratio inside the band, 0 outside
    icepop = obj.truncated_is_weights(old, engine, cap=5.0) * obj.rollout_band_mask(old, engine, mask)
    torch.testing.assert_close(icepop, _t([[0.0, 0.5, 1.0, 5.0, 0.0]]))
    with pytest.raises(ValueError, match="low"):
        obj.rollout_band_mask(old, engine, mask, low=2.0, high=1.0)


def test_rollout_correction_weights_hand_values():
    engine = torch.zeros(2, 3, dtype=D)
    old = torch.log(_t([[0.5, 4.0, 7.0], [1.5, 3.0, 1.0]]))
    mask = _t([[1, 1, 0], [1, 1, 1]])
    # token TIS, cap 2: min(r_t, 2); equal to truncated_is_weights
    tok = obj.rollout_correction_weights(old, engine, mask, level="token", cap=2.0)
    torch.testing.assert_close(tok, _t([[0.5, 2.0, 2.0], [1.5, 2.0, 1.0]]))
    torch.testing.assert_close(tok, obj.truncated_is_weights(old, engine, 2.0))
    # sequence product: row 0 0.5 * 4 = 2 (the padded 7 does not count), row 1 1.5 * 3 * 1 = 4.5 -> cap 3
    seq = obj.rollout_correction_weights(old, engine, mask, cap=3.0)
    torch.testing.assert_close(seq, _t([[2.0] * 3, [3.0] * 3]))
    # geometric: row 0 sqrt(2), row 1 4.5^(1/3)
    geo = obj.rollout_correction_weights(old, engine, mask, aggregation="geometric", cap=10.0)
    torch.testing.assert_close(geo[:, 0], _t([math.sqrt(2.0), 4.5 ** (1 / 3)]))
    # token band [0.75, 3.5] (IcePop with the cap at its top): the ratio inside, 0 outside
    ice = obj.rollout_correction_weights(old, engine, mask, level="token", cap=3.5, band_low=0.75, band_high=3.5)
    torch.testing.assert_close(ice, _t([[0.0, 0.0, 0.0], [1.5, 3.0, 1.0]]))
    # sequence band [0.5, 4] on the product: row 0 (2) kept, row 1 (4.5) rejected whole; no cap: weight 1
    band = obj.rollout_correction_weights(old, engine, mask, cap=None, band_low=0.5, band_high=4.0)
    torch.testing.assert_close(band, _t([[1.0] * 3, [0.0] * 3]))
    # the geometric statistic keeps row 1 (4.5^(1/3) = 1.65 in the band)
    gband = obj.rollout_correction_weights(old, engine, mask, aggregation="geometric", cap=None, band_low=0.5,
                                           band_high=4.0)
    torch.testing.assert_close(gband, torch.ones(2, 3, dtype=D))
    # a row without tokens is kept with weight 1 (nothing of it counts anyway)
    empty = obj.rollout_correction_weights(old, engine, torch.zeros(2, 3), cap=None, band_low=0.5, band_high=4.0)
    torch.testing.assert_close(empty, torch.ones(2, 3, dtype=D))
    assert not obj.rollout_correction_weights(old.clone().requires_grad_(), engine, mask).requires_grad
    with pytest.raises(ValueError, match="both band bounds"):
        obj.rollout_correction_weights(old, engine, mask, band_low=0.5)
    with pytest.raises(ValueError, match="token, sequence"):
        obj.rollout_correction_weights(old, engine, mask, level="row")


def test_policy_loss_keep_masks_the_numerator_only():
    """``keep`` drops tokens from the policy-gradient sum; the normaliser's weights, the surrogate's
    mask and the KL term are unchanged (the 80/20 paper's and TRL's top-entropy form)."""
    logp = _t([[-1.0, -2.0, -0.5], [-0.3, -0.7, -4.0]]).requires_grad_()
    old = _t([[-1.1, -1.8, -0.5], [-0.3, -0.9, -4.0]])
    adv = _t([1.0, -2.0])
    mask = _t([[1, 1, 1], [1, 1, 0]])
    keep = torch.tensor([[True, False, True], [False, True, False]])
    weights = obj.loss_normaliser(mask, "token-mean")  # 1/5 for every row: the 5 masked tokens
    seen = {}

    def surrogate(lp, o, a, *, mask):
        seen["mask"] = mask
        return obj.clipped_surrogate(lp, o, a, mask=mask)

    loss, st = obj.policy_loss(logp=logp, old_logp=old, advantages=adv, mask=mask, weights=weights,
                               surrogate=surrogate, keep=keep, ref_logp=old, kl_coef=0.5, kl_estimator="k1")
    per_token = obj.clipped_surrogate(logp.detach(), old, adv).loss
    expect_pg = (per_token * keep * mask).sum() / 5  # kept tokens over ALL 5 tokens of the mask
    expect_kl = ((logp.detach() - old) * mask).sum() / 5  # the KL over every token
    torch.testing.assert_close(st["pg_loss"], expect_pg)
    torch.testing.assert_close(loss.detach(), expect_pg + 0.5 * expect_kl)
    assert torch.equal(seen["mask"], mask) and st["n_kept"] == 3 and st["n_tokens"] == 5
    loss.backward()
    # a dropped token's gradient is the KL's alone
    assert logp.grad[0, 1].item() == pytest.approx(0.5 / 5)
    no_keep, st0 = obj.policy_loss(logp=logp.detach(), old_logp=old, advantages=adv, mask=mask, weights=weights,
                                   surrogate=obj.clipped_surrogate)
    assert "n_kept" not in st0 and not torch.allclose(no_keep, st["pg_loss"])
