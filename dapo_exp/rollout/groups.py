"""A group (one prompt and its G scored responses) and how a batch of generations is scored.

The reward of a response is the task's correctness reward (+1 / -1,
:func:`dapo_exp.tasks.verifier.reward_of`, the paper's rule) plus the reward terms of
the fixes that are on (the plan's ``reward`` method, :meth:`dapo_exp.compose.Plan.reward`; the
overlong term of DAPO Eq. 13 when ``overlong_punishment`` is on).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from dapo_exp import checkpoint
from dapo_exp.rollout.engine import Generations
from dapo_exp.tasks.verifier import reward_of


@dataclass
class Group:
    """One prompt and its G scored responses."""

    prompt_index: int
    prompt_ids: list[int]
    response_ids: list[list[int]]
    truncated: list[bool]
    correct: list[bool]
    reward: list[float]  # correctness reward (+1 / -1) plus the reward terms
    shaping: dict[str, list[float]]  # each reward term's values (fix name -> G floats)
    preds: list[str | None]
    sampled_logprobs: list[list[float]] | None = None
    meta: dict = field(default_factory=dict)
    baseline: float | None = None  # the reward of a greedy response to the prompt (ReMax's baseline), when decoded


def score_groups(
    *,
    prompt_indices: list[int],
    prompt_ids: list[list[int]],
    gens: Generations,
    group_size: int,
    answers: list[str],
    tokenizer: Any,
    verifier: Any,
    reward: Callable[..., Any],
) -> tuple[list[Group], int, dict[str, float]]:
    """Verify ``gens`` (``len(prompt_ids) * group_size`` responses, group-major) and build groups.

    ``reward`` is the plan's (:meth:`dapo_exp.compose.Plan.reward`): ``(*, lengths (B,), correct (B,),
    texts) -> Out({fix name: (B,) term}, metrics)``, the terms added to the correctness reward, computed on
    the whole batch. Returns ``(groups, verifier_timeouts, the terms' metrics)``.
    """
    n = group_size
    texts = tokenizer.batch_decode(gens.response_ids, skip_special_tokens=True)
    results = verifier.verify_batch(texts, [a for a in answers for _ in range(n)])
    lengths = torch.tensor(gens.lengths, dtype=torch.float32)
    correct = torch.tensor([r.correct for r in results], dtype=torch.bool)
    values, metrics = reward(lengths=lengths, correct=correct, texts=texts)
    terms = {name: v.tolist() for name, v in values.items()}
    rewards = [reward_of(r) + sum(v[i] for v in terms.values()) for i, r in enumerate(results)]
    groups = []
    for g, pi in enumerate(prompt_indices):
        sl = slice(g * n, (g + 1) * n)
        groups.append(Group(
            prompt_index=pi,
            prompt_ids=prompt_ids[g],
            response_ids=gens.response_ids[sl],
            truncated=gens.truncated[sl],
            correct=[r.correct for r in results[sl]],
            reward=rewards[sl],
            shaping={name: v[sl] for name, v in terms.items()},
            preds=[r.pred for r in results[sl]],
            sampled_logprobs=gens.sampled_logprobs[sl] if gens.sampled_logprobs else None,
            meta={"texts": texts[sl]},
        ))
    return groups, sum(r.timed_out for r in results), {k: float(v) for k, v in metrics.items()}


checkpoint.register_restorable(Group)  # dynamic sampling's carried groups live in the trainer's state
