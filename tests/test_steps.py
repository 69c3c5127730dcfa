"""Old log-probs of on-policy rows come from the update forward itself (dapo_exp.steps).

The rows of a batch's first mini-batch are scored by the update before any optimizer
step, so their old log-probs are that forward's own, detached (ratio 1 exactly), and
no separate no-grad forward is spent on them. These tests check that this gives the
same loss and gradients as recomputing them (``recompute_old_logprobs``), that the
recompute is really skipped with one mini-batch, and that with two mini-batches the
rows of the second one are still recomputed before the first update.
"""

from __future__ import annotations

import functools

import pytest
import torch
from test_logprobs import tiny_qwen2

from dapo_exp import objective, steps
from dapo_exp.compose import Plan
from dapo_exp.logprobs import ResponseForward
from dapo_exp.rollout.groups import Group

G, N_GROUPS, V = 4, 4, 97


def make_groups(seed: int = 0, engine_logprobs: bool = False) -> list[Group]:
    """Four groups of four responses of varied lengths, mixed rewards (so advantages are non-zero)."""
    g = torch.Generator().manual_seed(seed)

    def ids(n: int) -> list[int]:
        return torch.randint(4, V, (n,), generator=g).tolist()

    groups = []
    for i in range(N_GROUPS):
        lengths = torch.randint(3, 12, (G,), generator=g).tolist()
        responses = [ids(n) for n in lengths]
        correct = [bool(j % 2 == (i % 2)) or j == 3 for j in range(G)]
        groups.append(Group(
            prompt_index=i, prompt_ids=ids(int(torch.randint(3, 8, (1,), generator=g))), response_ids=responses,
            truncated=[False] * G, correct=correct, reward=[1.0 if c else -1.0 for c in correct],
            shaping={}, preds=[None] * G,
            # an engine that samples from a slightly different distribution than the trainer
            sampled_logprobs=[(-3.0 - 0.3 * torch.rand(n, generator=g)).tolist() for n in lengths]
            if engine_logprobs else None,
        ))
    return groups


class RecordingSGD(torch.optim.SGD):
    """SGD that keeps a copy of every update's gradient."""

    def __init__(self, params, lr: float) -> None:
        super().__init__(params, lr=lr)
        self.grads: list[list[torch.Tensor]] = []

    def step(self, closure=None):
        self.grads.append([p.grad.detach().clone() for p in self.param_groups[0]["params"]])
        return super().step(closure)


class CountingForward:
    """A ResponseForward that records every call: (grad enabled, rows, the model it scored)."""

    def __init__(self, fwd: ResponseForward) -> None:
        self.fwd, self.calls = fwd, []

    @property
    def device(self) -> torch.device:
        return self.fwd.device

    def __call__(self, model, prompts, responses, **kw):
        self.calls.append((torch.is_grad_enabled(), len(prompts), model))
        return self.fwd(model, prompts, responses, **kw)


def TOKEN_MEAN(mask, group_index):
    return objective.loss_normaliser(mask, "token-mean", group_index, max_len=16)


def one_step(*, recompute: bool, mini_batch_size: int, ppo_epochs: int = 1, tis_cap: float | None = None,
             kl_coef: float = 0.0, micro_batch_size: int = 4, seed: int = 3):
    """One training step on the tiny model: (update stats, gradients of each update, OldLogprobs, forward calls)."""
    model = tiny_qwen2(vocab=V, dtype=torch.float64)
    ref = tiny_qwen2(vocab=V, dtype=torch.float64, seed=1) if kl_coef else None
    groups = make_groups(engine_logprobs=tis_cap is not None)
    # truncated IS against the engine's log-probs (rollout_correction's token level) when tis_cap is set
    weight = None if tis_cap is None else functools.partial(objective.rollout_correction_weights, level="token",
                                                            cap=tis_cap)
    plan = Plan.of(surrogate=functools.partial(objective.clipped_surrogate, eps_low=0.2, eps_high=0.28),
                   normaliser=TOKEN_MEAN, kl_coef=kl_coef, kl_estimator="k3", rollout_weight=weight)
    batch = steps.build_batch(groups, group_size=G, plan=plan)
    sizes = steps.UpdateSizes(group_size=G, mini_batch_size=mini_batch_size, micro_batch_size=micro_batch_size,
                              token_budget=None, ppo_epochs=ppo_epochs, grad_clip=0.0)
    fwd = CountingForward(ResponseForward(pad_id=0, device=torch.device("cpu")))
    on_policy = [] if recompute else steps.on_policy_rows(len(groups), sizes=sizes, seed=seed)
    old = steps.old_logprobs(model, batch, fwd=fwd, ref_model=ref, micro_batch_size=micro_batch_size,
                             token_budget=None, on_policy=on_policy)
    opt = RecordingSGD(model.parameters(), lr=0.5)
    upd = steps.update_policy(model, opt, batch, old, fwd=fwd, plan=plan, sizes=sizes, seed=seed)
    return upd, opt.grads, old, fwd.calls, batch


def assert_same_update(a, b) -> None:
    (upd_a, grads_a, old_a, _, batch), (upd_b, grads_b, old_b, _, _) = a, b
    assert upd_a.n_updates == upd_b.n_updates == len(grads_a) == len(grads_b)
    torch.testing.assert_close(torch.tensor(upd_a.pg_loss), torch.tensor(upd_b.pg_loss), rtol=1e-6, atol=1e-9)
    for ga, gb in zip(grads_a, grads_b):
        for x, y in zip(ga, gb):
            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-9)
    mask = batch.resp_mask.bool()
    torch.testing.assert_close(old_a.logp[mask], old_b.logp[mask], rtol=1e-6, atol=1e-7)
    assert old_a.entropy_sum == pytest.approx(old_b.entropy_sum, rel=1e-6)
    assert bool(old_a.known.all()) and bool(old_b.known.all())


@pytest.mark.parametrize("variant", [{}, {"tis_cap": 2.0, "kl_coef": 0.1}], ids=["plain", "tis+kl"])
def test_one_update_per_batch_equals_the_recompute_path(variant):
    """One mini-batch, one epoch: the update forward's detached log-probs as old_logp give the same
    loss, gradient, old log-probs and entropy as the separate no-grad recompute."""
    skip = one_step(recompute=False, mini_batch_size=G * N_GROUPS, **variant)
    forced = one_step(recompute=True, mini_batch_size=G * N_GROUPS, **variant)
    assert_same_update(skip, forced)
    upd = skip[0]
    assert upd.ratio_sum == upd.n_tokens  # ratio exactly 1 on every token
    assert upd.n_clipped_high == upd.n_clipped_low == 0


@pytest.mark.parametrize("variant", [{}, {"tis_cap": 2.0, "kl_coef": 0.1}], ids=["plain", "tis+kl"])
def test_one_update_per_batch_skips_the_recompute(variant):
    """No no-grad forward of the policy at all (the reference model is still scored for KL)."""
    upd, _, old, calls, batch = one_step(recompute=False, mini_batch_size=G * N_GROUPS, **variant)
    policy_no_grad = [rows for grad, rows, m in calls if not grad and _is_policy(calls, m)]
    assert policy_no_grad == []
    ref_rows = sum(rows for grad, rows, m in calls if not _is_policy(calls, m))
    assert ref_rows == (batch.size if variant.get("kl_coef") else 0)
    assert sum(rows for grad, rows, _ in calls if grad) == batch.size  # one update forward per row
    _, _, _, forced_calls, _ = one_step(recompute=True, mini_batch_size=G * N_GROUPS, **variant)
    assert sum(rows for grad, rows, m in forced_calls if not grad and _is_policy(forced_calls, m)) == batch.size


def _is_policy(calls, model) -> bool:
    """The policy is the model the update forward (grad enabled) scores."""
    return any(grad and m is model for grad, _, m in calls)


def test_two_mini_batches_recompute_the_second_one_only():
    """Two updates per batch: the first mini-batch's rows come from its update forward, the second
    mini-batch's rows are recomputed before the first optimizer step; same updates as recomputing all."""
    skip = one_step(recompute=False, mini_batch_size=G * N_GROUPS // 2)
    forced = one_step(recompute=True, mini_batch_size=G * N_GROUPS // 2)
    assert_same_update(skip, forced)
    upd, _, _, calls, batch = skip
    assert upd.n_updates == 2
    recomputed = sum(rows for grad, rows, _ in calls if not grad)
    assert recomputed == batch.size // 2
    # the second update is off-policy: its ratios moved away from 1 (the first update changed the weights)
    assert upd.ratio_sum != upd.n_tokens


def test_two_epochs_reuse_the_first_forward():
    """ppo_epochs=2 over one mini-batch: the second epoch reads the old log-probs the first epoch's
    forward stored (no recompute at all), and equals the recompute path."""
    skip = one_step(recompute=False, mini_batch_size=G * N_GROUPS, ppo_epochs=2)
    forced = one_step(recompute=True, mini_batch_size=G * N_GROUPS, ppo_epochs=2)
    assert_same_update(skip, forced)
    assert not [c for c in skip[3] if not c[0]]


def test_on_policy_rows_are_the_first_mini_batch():
    sizes = steps.UpdateSizes(group_size=G, mini_batch_size=2 * G, micro_batch_size=G, token_budget=None,
                              ppo_epochs=3, grad_clip=0.0)
    rows = steps.on_policy_rows(N_GROUPS, sizes=sizes, seed=5)
    assert rows == steps.minibatch_rows(N_GROUPS, sizes=sizes, seed=5)[0]
    assert len(rows) == 2 * G


def test_the_updates_sums_are_typed_and_an_unknown_statistic_is_refused():
    from dapo_exp.compose import FIX_METRIC

    upd = steps.UpdateSums()
    upd.add({"pg_loss": 0.5, "n_tokens": 4.0, FIX_METRIC + "mine/tokens": 2.0})
    upd.add({"pg_loss": 0.25, "n_tokens": 2.0, FIX_METRIC + "mine/tokens": 1.0})
    assert (upd.pg_loss, upd.n_tokens, upd.fixes) == (0.75, 6.0, {"mine/tokens": 3.0})
    assert upd.kl is None and upd.n_kept is None and upd.rw_tokens is None  # their slots never reported
    with pytest.raises(KeyError, match="'pg_los' is no statistic of the update"):
        upd.add({"pg_los": 1.0})
