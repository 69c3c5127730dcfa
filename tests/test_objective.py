"""Exact, hand-computed tests of every function in dapo_exp.objective."""

import functools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_exp import objective as obj

# --------------------------------------------------------------------------- #
# group_advantages                                                              #
# --------------------------------------------------------------------------- #


def test_group_advantages_hand_computed():
    r = torch.tensor([[1.0, -1.0, -1.0, -1.0]])
    # mean = -0.5; unbiased std = sqrt(((1.5)^2 + 3 * 0.5^2) / 3) = sqrt(1) = 1
    a = obj.group_advantages(r, eps=0.0)
    assert torch.allclose(a, torch.tensor([[1.5, -0.5, -0.5, -0.5]]))
    a_eps = obj.group_advantages(r, eps=1.0)
    assert torch.allclose(a_eps, torch.tensor([[0.75, -0.25, -0.25, -0.25]]))


def test_group_advantages_dr_grpo_no_std():
    r = torch.tensor([[1.0, -1.0, -1.0, -1.0], [2.0, 0.0, 0.0, 2.0]])
    a = obj.group_advantages(r, norm_std=False)
    assert torch.allclose(a, torch.tensor([[1.5, -0.5, -0.5, -0.5], [1.0, -1.0, -1.0, 1.0]]))


def test_group_advantages_identical_rewards_exactly_zero_never_nan():
    r = torch.tensor([[0.1, 0.1, 0.1], [-1.0, -1.0, -1.0], [0.7, 0.7, 0.7]])
    for norm in (True, False):
        for eps in (0.0, 1e-6):
            a = obj.group_advantages(r, norm_std=norm, eps=eps)
            assert torch.equal(a, torch.zeros_like(r))  # exact zeros, no NaN even with eps = 0


def test_group_advantages_group_of_one_and_rows_independent():
    assert torch.equal(obj.group_advantages(torch.tensor([[3.0], [-1.0]])), torch.zeros(2, 1))
    r = torch.tensor([[1.0, -1.0], [5.0, 5.0]])
    a = obj.group_advantages(r, eps=0.0)
    s = math.sqrt(2.0)  # unbiased std of (1, -1)
    assert torch.allclose(a, torch.tensor([[1 / s, -1 / s], [0.0, 0.0]]))


def test_group_advantages_rejects_flat_input():
    with pytest.raises(ValueError, match="rewards must be"):
        obj.group_advantages(torch.tensor([1.0, 2.0]))


# --------------------------------------------------------------------------- #
# clipped_surrogate (Clip-Higher)                                               #
# --------------------------------------------------------------------------- #


def _ratio_to_logp(ratios):
    r = torch.tensor(ratios, dtype=torch.float64)
    return torch.log(r), torch.zeros_like(r)


def test_surrogate_positive_advantage_upper_clip_hand_values():
    logp, old = _ratio_to_logp([[0.5, 1.0, 1.25, 1.5]])
    adv = torch.tensor([2.0], dtype=torch.float64)
    sym = obj.clipped_surrogate(logp, old, adv, 0.2, 0.2)
    # A > 0: min(r, 1 + eps_high) * A ; loss = -that
    assert torch.allclose(sym.loss, -torch.tensor([[1.0, 2.0, 2.4, 2.4]], dtype=torch.float64))
    assert sym.clipped_high.tolist() == [[False, False, True, True]]
    assert not sym.clipped_low.any()
    hi = obj.clipped_surrogate(logp, old, adv, 0.2, 0.28)
    assert torch.allclose(hi.loss, -torch.tensor([[1.0, 2.0, 2.5, 2.56]], dtype=torch.float64))
    assert hi.clipped_high.tolist() == [[False, False, False, True]]


def test_surrogate_negative_advantage_lower_clip_and_dual_clip():
    logp, old = _ratio_to_logp([[0.5, 0.9, 1.5, 20.0]])
    adv = torch.tensor([-1.0], dtype=torch.float64)
    out = obj.clipped_surrogate(logp, old, adv, 0.2, 0.28)
    # A < 0: max(r, 1 - eps_low) * A ; loss = -that = max(r, 0.8)
    assert torch.allclose(out.loss, torch.tensor([[0.8, 0.9, 1.5, 20.0]], dtype=torch.float64))
    assert out.clipped_low.tolist() == [[True, False, False, False]]
    assert not out.clipped_high.any()
    dual = obj.clipped_surrogate(logp, old, adv, 0.2, 0.28, dual_clip=10.0)
    # dual clip bounds the loss of an A < 0 token by -c * A = 10
    assert torch.allclose(dual.loss, torch.tensor([[0.8, 0.9, 1.5, 10.0]], dtype=torch.float64))
    assert dual.clipped_dual.tolist() == [[False, False, False, True]]


def test_surrogate_zero_advantage_and_shapes():
    logp, old = _ratio_to_logp([[0.1, 5.0]])
    out = obj.clipped_surrogate(logp, old, torch.zeros(1, 2, dtype=torch.float64), 0.2, 0.28)
    assert torch.equal(out.loss, torch.zeros(1, 2, dtype=torch.float64))
    assert not (out.clipped_high.any() or out.clipped_low.any())
    assert out.ratio.shape == (1, 2)


def test_surrogate_gradient_vanishes_only_where_clipped():
    logp = torch.log(torch.tensor([[1.1, 1.3]], dtype=torch.float64)).requires_grad_()
    out = obj.clipped_surrogate(logp, torch.zeros(1, 2, dtype=torch.float64), torch.tensor([1.0]), 0.2, 0.2)
    out.loss.sum().backward()
    # d(-r A)/dlogp = -r A where unclipped; 0 where the upper bound is active
    assert torch.allclose(logp.grad, torch.tensor([[-1.1, 0.0]], dtype=torch.float64))


@pytest.mark.parametrize("bad", [dict(eps_low=-0.1), dict(eps_high=-0.1), dict(dual_clip=1.0)])
def test_surrogate_rejects_bad_bounds(bad):
    kw = dict(eps_low=0.2, eps_high=0.2, dual_clip=None) | bad
    with pytest.raises(ValueError):
        obj.clipped_surrogate(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), **kw)


@settings(max_examples=300, deadline=None)
@given(
    log_ratio=st.floats(-3, 3),
    adv=st.floats(-5, 5).filter(lambda x: abs(x) > 1e-9),
    eps_low=st.floats(0, 0.9),
    eps_high=st.floats(0, 2),
)
def test_one_sided_form_equals_two_sided(log_ratio, adv, eps_low, eps_high):
    """A > 0: min(r, 1 + eps_high) A; A < 0: max(r, 1 - eps_low) A (reference, 'The formulas')."""
    logp = torch.tensor([[log_ratio]], dtype=torch.float64)
    out = obj.clipped_surrogate(logp, torch.zeros_like(logp), torch.tensor([adv], dtype=torch.float64),
                                eps_low, eps_high)
    r = math.exp(log_ratio)
    one_sided = min(r, 1 + eps_high) * adv if adv > 0 else max(r, 1 - eps_low) * adv
    assert -out.loss.item() == pytest.approx(one_sided, rel=1e-12, abs=1e-12)


# --------------------------------------------------------------------------- #
# aggregation modes (Token-level Loss)                                          #
# --------------------------------------------------------------------------- #
LOSS = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0], [5.0, 6.0, 0.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
GROUPS = torch.tensor([0, 0, 1])


def test_aggregation_hand_values():
    # lengths 3, 1, 2; row sums 6, 4, 11
    assert obj.aggregate_loss(LOSS, MASK, "token-mean").item() == pytest.approx(21 / 6)
    assert obj.aggregate_loss(LOSS, MASK, "seq-mean-token-mean").item() == pytest.approx((2 + 4 + 5.5) / 3)
    assert obj.aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm", max_len=10).item() == pytest.approx(21 / 30)
    # default L_max is the padded width T = 4
    assert obj.aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm").item() == pytest.approx(21 / 12)
    # group 0: rows 0,1 -> (6 + 4) / 4 tokens = 2.5; group 1: 11 / 2 = 5.5; mean = 4
    assert obj.aggregate_loss(LOSS, MASK, "group-token-mean", GROUPS).item() == pytest.approx(4.0)


def test_aggregation_empty_rows_and_empty_batch():
    mask = MASK.clone()
    mask[1] = 0  # a fully masked row (e.g. overlong-filtered) leaves numerator and denominator
    assert obj.aggregate_loss(LOSS, mask, "token-mean").item() == pytest.approx(17 / 5)
    assert obj.aggregate_loss(LOSS, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 5.5) / 2)
    assert obj.aggregate_loss(LOSS, mask, "group-token-mean", GROUPS).item() == pytest.approx((6 / 3 + 11 / 2) / 2)
    zero = torch.zeros_like(MASK)
    for mode in obj.LOSS_AGG_MODES:
        v = obj.aggregate_loss(LOSS, zero, mode, GROUPS)
        assert v.item() == 0.0 and not torch.isnan(v)


def test_aggregation_length_one():
    loss, mask = torch.tensor([[3.0]]), torch.tensor([[1.0]])
    for mode in obj.LOSS_AGG_MODES:
        expected = 3.0
        assert obj.aggregate_loss(loss, mask, mode, torch.tensor([0])).item() == pytest.approx(expected)


def test_token_mean_and_seq_mean_agree_iff_lengths_equal():
    torch.manual_seed(0)
    loss = torch.randn(4, 5)
    equal = torch.ones(4, 5)
    a = obj.aggregate_loss(loss, equal, "token-mean")
    b = obj.aggregate_loss(loss, equal, "seq-mean-token-mean")
    assert torch.allclose(a, b)
    unequal = (torch.arange(5)[None, :] < torch.tensor([1, 2, 5, 3])[:, None]).float()
    a = obj.aggregate_loss(loss, unequal, "token-mean")
    b = obj.aggregate_loss(loss, unequal, "seq-mean-token-mean")
    assert not torch.allclose(a, b)


def test_unknown_mode_lists_valid_choices():
    with pytest.raises(ValueError, match="token-mean"):
        obj.aggregate_loss(LOSS, MASK, "token_mean")
    with pytest.raises(ValueError, match="group_index"):
        obj.aggregate_loss(LOSS, MASK, "group-token-mean")


# --------------------------------------------------------------------------- #
# gradient-accumulation invariance                                              #
# --------------------------------------------------------------------------- #
def _clip(eps_low, eps_high, dual_clip=None):
    return functools.partial(obj.clipped_surrogate, eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip)


@pytest.mark.parametrize("mode", obj.LOSS_AGG_MODES)
def test_the_normaliser_is_exact_for_a_float64_loss_and_unchanged_for_float32(mode):
    """The weights are computed in float64 and cast to the loss's dtype: a float64 loss is normalised to
    float64 precision (in float32, 1/3 is off by 1e-8 absolute, 3e-8 relative), a float32 loss exactly as
    before (1/n of integers rounds the same from float64 as computed in float32)."""
    lengths = torch.tensor([3, 7, 1, 6, 0, 5])
    mask = (torch.arange(7)[None, :] < lengths[:, None]).to(torch.float64)
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    loss = torch.rand(6, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    weights = obj.loss_normaliser(mask, mode, groups, max_len=7)
    assert weights.dtype == torch.float64
    rows = (loss * mask).sum(dim=1)
    n, tokens = int((lengths > 0).sum()), float(lengths.sum())
    exact = {"token-mean": rows.sum() / tokens, "seq-mean-token-sum-norm": rows.sum() / (6 * 7),
             "seq-mean-token-mean": sum(rows[i] / lengths[i] for i in range(6) if lengths[i]) / n,
             "group-token-mean": sum(rows[2 * g:2 * g + 2].sum() / lengths[2 * g:2 * g + 2].sum() for g in range(3)) / 3}
    assert abs(float(obj.aggregate_loss(loss, mask, weights=weights)) - float(exact[mode])) < 1e-15
    in_float32 = torch.where(lengths > 0, 1.0, 0.0).float()  # the float32 computation it replaced, per mode
    if mode == "token-mean":
        in_float32 = in_float32 / lengths.float().sum()
    elif mode == "seq-mean-token-mean":
        in_float32 = in_float32 / (n * lengths.float().clamp(min=1.0))
    elif mode == "seq-mean-token-sum-norm":
        in_float32 = torch.full((6,), 1.0 / 42, dtype=torch.float32)
    else:  # a group's weight on each of its rows (an empty row included: its tokens sum to 0)
        in_float32 = 1.0 / (3 * torch.tensor([10.0, 10.0, 7.0, 7.0, 5.0, 5.0]))
    assert torch.equal(weights.float(), in_float32)


def _accumulated_grad(theta, old, adv, mask, groups, mode, micro, L):
    theta.grad = None
    weights = obj.loss_normaliser(mask, mode, groups, max_len=L)
    for s in range(0, theta.shape[0], micro):
        sl = slice(s, s + micro)
        loss, _ = obj.policy_loss(logp=theta[sl], old_logp=old[sl], advantages=adv[sl], mask=mask[sl],
                                  weights=weights[sl], surrogate=_clip(0.2, 0.28))
        loss.backward()
    return theta.grad.clone()


@pytest.mark.parametrize("mode", obj.LOSS_AGG_MODES)
def test_gradient_accumulation_invariance(mode):
    torch.manual_seed(1)
    B, T, L = 7, 6, 6
    lengths = torch.tensor([1, 6, 3, 2, 5, 4, 6])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(torch.float64)
    mask[3] = 0.0  # one overlong-filtered row
    groups = torch.tensor([0, 0, 1, 1, 1, 2, 2])
    old = torch.randn(B, T, dtype=torch.float64) * 0.1 - 1.0
    adv = torch.randn(B, 1, dtype=torch.float64)
    theta = (old + torch.randn(B, T, dtype=torch.float64) * 0.3).requires_grad_()
    # the loss of the whole mini-batch in one piece, through aggregate_loss
    whole = -torch.minimum(
        torch.exp(theta - old) * adv, torch.clamp(torch.exp(theta - old), 0.8, 1.28) * adv
    )
    ref = torch.autograd.grad(obj.aggregate_loss(whole, mask, mode, groups, max_len=L), theta)[0]
    for micro in (1, 3, B):
        g = _accumulated_grad(theta, old, adv, mask, groups, mode, micro, L)
        assert torch.allclose(g, ref, atol=1e-12, rtol=1e-10), (mode, micro)


def test_naive_per_micro_batch_normaliser_would_differ():
    """Guard against the peers' bug: normalising each micro-batch on its own changes the gradient."""
    torch.manual_seed(2)
    lengths = torch.tensor([1, 6, 2, 3])  # micro-batches of 7 and 5 tokens
    mask = (torch.arange(6)[None, :] < lengths[:, None]).to(torch.float64)
    old = torch.zeros(4, 6, dtype=torch.float64)
    adv = torch.tensor([[1.0], [-1.0], [0.5], [2.0]], dtype=torch.float64)
    theta = (torch.randn(4, 6, dtype=torch.float64) * 0.05).requires_grad_()
    correct = _accumulated_grad(theta, old, adv, mask, None, "token-mean", 2, 6)
    theta.grad = None
    for s in (0, 2):
        sl = slice(s, s + 2)
        w = obj.loss_normaliser(mask[sl], "token-mean") / 2  # per-micro-batch normaliser, averaged
        loss, _ = obj.policy_loss(logp=theta[sl], old_logp=old[sl], advantages=adv[sl], mask=mask[sl], weights=w,
                                  surrogate=_clip(0.2, 0.28))
        loss.backward()
    assert not torch.allclose(theta.grad, correct)


def test_policy_loss_counts_and_kl():
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.0]], dtype=torch.float64))
    old = torch.zeros_like(logp)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    w = obj.loss_normaliser(mask, "token-mean")
    loss, st_ = obj.policy_loss(logp=logp, old_logp=old, advantages=torch.tensor([[1.0], ]), mask=mask, weights=w,
                                surrogate=_clip(0.2, 0.2), ref_logp=torch.zeros_like(logp), kl_coef=0.5,
                                kl_estimator="k1")
    assert st_["n_tokens"].item() == 2 and st_["n_clipped_high"].item() == 1 and st_["n_clipped_low"].item() == 0
    # pg: -(1.2 + 0.5) / 2 ; kl k1: (log 1.5 + log 0.5) / 2
    pg = -(1.2 + 0.5) / 2
    kl = (math.log(1.5) + math.log(0.5)) / 2
    assert st_["pg_loss"].item() == pytest.approx(pg)
    assert loss.item() == pytest.approx(pg + 0.5 * kl)


# --------------------------------------------------------------------------- #
# KL estimators                                                                 #
# --------------------------------------------------------------------------- #
def test_kl_estimators_hand_values():
    logp = torch.tensor([[0.0, -1.0, -2.0]])
    ref = torch.tensor([[0.0, -2.0, -1.0]])  # d = 0, 1, -1
    assert torch.allclose(obj.kl_penalty(logp, ref, "k1"), torch.tensor([[0.0, 1.0, -1.0]]))
    assert torch.allclose(obj.kl_penalty(logp, ref, "k2"), torch.tensor([[0.0, 0.5, 0.5]]))
    k3 = torch.tensor([[0.0, math.exp(-1) + 1 - 1, math.exp(1) - 1 - 1]])
    assert torch.allclose(obj.kl_penalty(logp, ref, "k3"), k3)
    with pytest.raises(ValueError, match="k1, k2, k3"):
        obj.kl_penalty(logp, ref, "k4")


# --------------------------------------------------------------------------- #
# Overlong Filtering and Soft Overlong Punishment                               #
# --------------------------------------------------------------------------- #
def test_overlong_filtering_masks_truncated_rows_only():
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    out = obj.overlong_filtering(mask, torch.tensor([True, False, False]))
    assert torch.equal(out, torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]))
    # removed from numerator and denominator: token-mean over rows 1 and 2 only
    loss = torch.tensor([[9.0, 9.0, 9.0], [1.0, 2.0, 0.0], [3.0, 4.0, 5.0]])
    assert obj.aggregate_loss(loss, out, "token-mean").item() == pytest.approx(15 / 5)


def test_soft_overlong_punishment_eq13_hand_values():
    # L_max = 20, L_cache = 4: free up to 16, linear to -1 at 20, -1 beyond
    lengths = torch.tensor([0, 10, 16, 17, 18, 20, 21, 100])
    pen = obj.overlong_punishment(lengths, max_len=20, cache_len=4, factor=1.0, mode="soft")
    assert torch.allclose(pen, torch.tensor([0.0, 0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0]))
    assert torch.allclose(obj.overlong_punishment(lengths, 20, 4, 0.5, "soft"), pen * 0.5)
    # paper scale: 20480 / 4096
    big = obj.overlong_punishment(torch.tensor([16384, 18432, 20480]), 20480, 4096)
    assert torch.allclose(big, torch.tensor([0.0, -0.5, -1.0]))


def test_overlong_punishment_seed_variants_and_edges():
    lengths = torch.tensor([10, 18, 20, 25, 40])
    ramp = obj.overlong_punishment(lengths, 20, 4, 1.0, "linear_ramp")
    assert torch.allclose(ramp, torch.tensor([0.0, -0.5, -1.0, -1.0, -1.0]))
    beyond = obj.overlong_punishment(lengths, 20, 4, 0.5, "beyond_max")
    assert torch.allclose(beyond, torch.tensor([0.0, 0.0, 0.0, -0.5 * 5 / 20, -0.5 * 20 / 20]))
    assert torch.equal(obj.overlong_punishment(lengths, 20, 4, 1.0, "none"), torch.zeros(5))
    # cache_len 0: a hard cliff beyond L_max only; cache_len = max_len: ramp from 0
    assert torch.allclose(obj.overlong_punishment(lengths, 20, 0), torch.tensor([0.0, 0.0, 0.0, -1.0, -1.0]))
    assert torch.allclose(obj.overlong_punishment(torch.tensor([0, 10, 20]), 20, 20), torch.tensor([0.0, -0.5, -1.0]))
    with pytest.raises(ValueError, match="cache_len"):
        obj.overlong_punishment(lengths, 20, 21)
    with pytest.raises(ValueError, match="soft"):
        obj.overlong_punishment(lengths, 20, 4, mode="hard")


# --------------------------------------------------------------------------- #
# Dynamic Sampling predicate                                                    #
# --------------------------------------------------------------------------- #
def test_dynamic_sampling_keep():
    acc = torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0], [0, 1, 1, 1]], dtype=torch.float32)
    assert obj.dynamic_sampling_keep(acc).tolist() == [False, False, True, True]
    # shaped reward as the signal: an all-wrong group with different overlong penalties looks informative
    shaped = torch.tensor([[-1.0, -1.25, -1.0, -1.0]])
    assert obj.dynamic_sampling_keep(shaped).tolist() == [True]
    assert obj.dynamic_sampling_keep(torch.tensor([[1.0]])).tolist() == [False]
