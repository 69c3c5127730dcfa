"""Dynamic Sampling: refill with only mixed groups, count rounds, the cap, surplus handling."""

import pytest
from omegaconf import OmegaConf

from dapo_exp.fixes import dynamic_sampling
from dapo_exp.fixes.base import RunInfo
from dapo_exp.rollout.dynamic_sampling import DynamicSamplingCapError, collect_groups
from dapo_exp.rollout.groups import Group


def ds_filter(signal="acc", max_rounds=10, on_cap="error", surplus="discard", oversample=1.0):
    """Dynamic Sampling's group filter as its fix module binds it."""
    algo = OmegaConf.create({"dynamic_sampling": True, "ds_signal": signal, "ds_max_rounds": max_rounds,
                             "ds_on_cap": on_cap, "ds_surplus": surplus, "ds_oversample": oversample})
    return dynamic_sampling.FIX.bind(algo, RunInfo(max_response_len=64, group_size=3, seed=0))["group_filter"]


def group(i, correct, reward=None):
    n = len(correct)
    reward = reward or [1.0 if c else -1.0 for c in correct]
    return Group(i, [1], [[2]] * n, [False] * n, list(correct), reward, {}, [None] * n)


def scripted(rounds):
    """A generate_round that returns the scripted groups of each round and records calls."""
    calls = []

    def gen(round_idx, n_prompts):
        calls.append((round_idx, n_prompts))
        return rounds[round_idx]

    return gen, calls


ALL_RIGHT, ALL_WRONG, MIXED = (True, True, True), (False, False, False), (True, False, False)


def test_refills_until_batch_holds_only_mixed_groups_and_counts_rounds():
    rounds = [
        [group(0, ALL_RIGHT), group(1, MIXED), group(2, ALL_WRONG)],
        [group(3, ALL_WRONG), group(4, ALL_WRONG), group(5, ALL_RIGHT)],
        [group(6, MIXED), group(7, MIXED), group(8, MIXED)],
    ]
    gen, calls = scripted(rounds)
    batch, carry, st = collect_groups(gen, want=3, refill=ds_filter(max_rounds=10))
    assert [g.prompt_index for g in batch] == [1, 6, 7]
    assert all(len(set(g.correct)) == 2 for g in batch)
    assert st.rounds == 3 and calls == [(0, 3), (1, 3), (2, 3)]
    assert st.groups_generated == 9 and st.rollouts_generated == 27
    assert st.zero_var_groups == 5 and st.kept_groups == 3
    assert st.surplus_groups == 1 and carry == []  # surplus discarded (the paper)


def test_surplus_carry_feeds_the_next_step():
    rounds = [[group(0, MIXED), group(1, MIXED), group(2, MIXED)]]
    gen, _ = scripted(rounds)
    batch, carry, st = collect_groups(gen, want=2, refill=ds_filter(surplus="carry"))
    assert [g.prompt_index for g in batch] == [0, 1] and [g.prompt_index for g in carry] == [2]
    gen2, calls2 = scripted([[group(3, MIXED), group(4, ALL_WRONG)]])
    batch2, _, st2 = collect_groups(gen2, want=2, refill=ds_filter(surplus="carry"), carry=carry)
    assert [g.prompt_index for g in batch2] == [2, 3] and st2.carried_in == 1 and calls2 == [(0, 2)]


def test_oversampling_sets_prompts_per_round():
    gen, calls = scripted([[group(i, MIXED) for i in range(6)]])
    collect_groups(gen, want=2, refill=ds_filter(oversample=3.0))
    assert calls == [(0, 6)]


def test_cap_error_names_the_fix_and_partial_trains_on_what_was_kept():
    rounds = [[group(0, ALL_WRONG), group(1, MIXED)], [group(2, ALL_RIGHT), group(3, ALL_WRONG)]] * 3
    gen, _ = scripted(rounds)
    with pytest.raises(DynamicSamplingCapError, match="ds_max_rounds=2"):
        collect_groups(gen, want=2, refill=ds_filter(max_rounds=2, on_cap="error"))
    gen, calls = scripted(rounds)
    batch, _, st = collect_groups(gen, want=2, refill=ds_filter(max_rounds=2, on_cap="partial"))
    assert [g.prompt_index for g in batch] == [1] and st.cap_hit and st.rounds == 2 and len(calls) == 2


def test_unlimited_rounds_when_cap_is_zero():
    rounds = [[group(i, ALL_WRONG)] for i in range(14)] + [[group(99, MIXED)]]
    gen, calls = scripted(rounds)
    batch, _, st = collect_groups(gen, want=1, refill=ds_filter(max_rounds=0))
    assert st.rounds == 15 and batch[0].prompt_index == 99


def test_disabled_keeps_every_group_in_one_round():
    gen, calls = scripted([[group(0, ALL_RIGHT), group(1, ALL_WRONG)]])
    batch, _, st = collect_groups(gen, want=2, refill=None)
    assert len(batch) == 2 and st.rounds == 1 and st.zero_var_groups == 2 and calls == [(0, 2)]


def test_shaped_reward_signal_keeps_all_wrong_group_with_different_penalties():
    g = group(0, ALL_WRONG, reward=[-1.0, -1.5, -1.0])
    gen, _ = scripted([[g]])
    batch, _, _ = collect_groups(gen, want=1, refill=ds_filter(signal="reward"))
    assert batch == [g]
    gen, _ = scripted([[g]])
    with pytest.raises(DynamicSamplingCapError):
        collect_groups(gen, want=1, refill=ds_filter(signal="acc", max_rounds=1))
