"""Token-budget micro-batching: a partition that respects the budget, and gradient invariance.

THE INVARIANCE TEST: for every aggregation mode, the gradient accumulated over
token-budget micro-batches (each padded only to its own longest row, each loss
weighted by the *mini-batch* normaliser) equals the gradient of the whole
mini-batch computed in one piece (float64, tight tolerance).
"""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_exp import objective
from dapo_exp.batching import (
    fixed_size_microbatches,
    microbatches,
    padding_waste,
    token_budget_microbatches,
)


# --------------------------------------------------------------------------- #
# The partition                                                                 #
# --------------------------------------------------------------------------- #
@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 60), max_size=40), st.integers(1, 200))
def test_every_index_once_and_budget_respected(lengths, budget):
    mbs = token_budget_microbatches(lengths, budget)
    flat = [i for mb in mbs for i in mb]
    assert sorted(flat) == list(range(len(lengths)))
    assert all(mbs), "no empty micro-batch"
    for mb in mbs:
        padded = len(mb) * max(lengths[i] for i in mb)
        assert padded <= budget or len(mb) == 1, (mb, padded, budget)
    # greedy: the next micro-batch's first row would not have fitted in the previous one
    for a, _ in zip(mbs, mbs[1:]):
        assert (len(a) + 1) * lengths[a[0]] > budget


def test_by_hand():
    lengths = [3, 10, 4, 4, 1, 25]
    # sorted: 25 (i5), 10 (i1), 4 (i2), 4 (i3), 3 (i0), 1 (i4); budget 16
    assert token_budget_microbatches(lengths, 16) == [[5], [1], [2, 3, 0, 4]]
    assert token_budget_microbatches(lengths, 20) == [[5], [1, 2], [3, 0, 4]]
    assert padding_waste(lengths, [[5], [1], [2, 3, 0, 4]]) == pytest.approx(1 - 47 / (25 + 10 + 16))
    assert padding_waste([], []) == 0.0
    assert fixed_size_microbatches(5, 2) == [[0, 1], [2, 3], [4]]
    assert microbatches(lengths, 4, None) == [[0, 1, 2, 3], [4, 5]]
    assert microbatches(lengths, 4, 16) == token_budget_microbatches(lengths, 16)
    with pytest.raises(ValueError, match="budget"):
        token_budget_microbatches(lengths, 0)


def test_budget_packing_wastes_less_than_fixed_size():
    g = torch.Generator().manual_seed(0)
    lengths = (torch.randint(1, 200, (64,), generator=g)).tolist()
    fixed = padding_waste(lengths, fixed_size_microbatches(64, 8))
    packed = padding_waste(lengths, token_budget_microbatches(lengths, 8 * 200))
    assert packed < fixed


# --------------------------------------------------------------------------- #
# Gradient invariance                                                           #
# --------------------------------------------------------------------------- #
class Bigram(torch.nn.Module):
    """logp of token t+1 given token t: a tiny model so the gradient has real structure."""

    def __init__(self, vocab=11, dim=4):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(vocab, dim, dtype=torch.float64)
        self.out = torch.nn.Linear(dim, vocab, dtype=torch.float64)

    def forward(self, prev: torch.Tensor, nxt: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(self.out(self.emb(prev)), dim=-1)
        return logp.gather(-1, nxt.unsqueeze(-1)).squeeze(-1)


def _rows(lengths, vocab=11, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n + 1,), generator=g) for n in lengths]  # n response tokens + 1 context


def _pad(rows, idx, width):
    prev = torch.zeros(len(idx), width, dtype=torch.long)
    nxt = torch.zeros_like(prev)
    for k, i in enumerate(idx):
        n = len(rows[i]) - 1
        prev[k, :n], nxt[k, :n] = rows[i][:-1], rows[i][1:]
    return prev, nxt


@pytest.mark.parametrize("mode", objective.LOSS_AGG_MODES)
def test_token_budget_accumulation_equals_whole_minibatch_gradient(mode):
    lengths = [7, 2, 12, 5, 1, 9, 3, 12]  # unequal response lengths
    group_index = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])  # G = 2, group-major
    truncated = torch.tensor([False, False, True, False, False, False, False, False])  # one filtered row
    b, width = len(lengths), max(lengths)
    rows = _rows(lengths)
    g = torch.Generator().manual_seed(5)
    advantages = torch.randn(b, generator=g, dtype=torch.float64)
    old_shift = 0.3 * torch.randn(b, width, generator=g, dtype=torch.float64)  # ratios away from 1: clipping active
    ref_shift = 0.2 * torch.randn(b, width, generator=g, dtype=torch.float64)
    mask = torch.zeros(b, width, dtype=torch.float64)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    mask = objective.overlong_filtering(mask, truncated)
    # the normaliser of the whole mini-batch: one weight per row
    weights = objective.loss_normaliser(mask, mode, group_index=group_index, max_len=width)
    surrogate = functools.partial(objective.clipped_surrogate, eps_low=0.2, eps_high=0.28, dual_clip=3.0)
    hp = dict(surrogate=surrogate, kl_coef=0.1, kl_estimator="k3")

    def loss_of(model, idx, w):
        prev, nxt = _pad(rows, idx, w)  # padded only to this micro-batch's width
        logp = model(prev, nxt)
        base = logp.detach()
        loss, _ = objective.policy_loss(
            logp=logp,
            old_logp=base + old_shift[idx, :w],
            advantages=advantages[idx],
            mask=mask[idx, :w],
            weights=weights[idx],
            ref_logp=base + ref_shift[idx, :w],
            **hp,
        )
        return loss

    # whole mini-batch, one piece
    whole = Bigram()
    loss_whole = loss_of(whole, list(range(b)), width)
    loss_whole.backward()

    # the same loss read straight from the mode's definition (no precomputed weights)
    with torch.no_grad():
        prev, nxt = _pad(rows, list(range(b)), width)
        logp = whole(prev, nxt)
        surr = objective.clipped_surrogate(logp, logp + old_shift, advantages, 0.2, 0.28, 3.0)
        kl = objective.kl_penalty(logp, logp + ref_shift, "k3")
        direct = objective.aggregate_loss(surr.loss + 0.1 * kl, mask, mode, group_index, max_len=width)
    torch.testing.assert_close(loss_whole.detach(), direct, rtol=1e-12, atol=1e-14)

    # token-budget micro-batches, gradients accumulated
    mbs = token_budget_microbatches(lengths, budget=24)
    assert len(mbs) >= 3 and any(max(lengths[i] for i in mb) < width for mb in mbs), "a meaningful split"
    acc = Bigram()
    total = 0.0
    for mb in mbs:
        loss = loss_of(acc, mb, max(lengths[i] for i in mb))
        loss.backward()
        total += loss.item()
    assert total == pytest.approx(loss_whole.item(), rel=1e-12, abs=1e-14)
    for (name, p_whole), (_, p_acc) in zip(whole.named_parameters(), acc.named_parameters()):
        assert p_whole.grad is not None and p_whole.grad.abs().sum() > 0
        torch.testing.assert_close(p_acc.grad, p_whole.grad, rtol=1e-10, atol=1e-13, msg=name)
