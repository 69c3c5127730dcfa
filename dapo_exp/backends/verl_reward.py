"""The native verifier as verl's reward function, for tasks verl has no scorer of its own for (the toy).

verl loads this file by path (``reward.custom_reward_function.path``, name ``compute_score``) in its
reward workers and calls :func:`compute_score` once per response through its DAPO reward manager,
which adds the overlong penalty (``algo.overlong_punishment=soft``) to the returned ``score``; ``acc``
is what Dynamic Sampling filters on (``algorithm.filter_groups.metric=acc``). The score is the
native trainer's: :func:`dapo_exp.tasks.verifier.reward_of` of ``task.verifier``'s verdict (+1 / -1),
so the toy is scored by the same code on both engines. Imports nothing of verl.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from dapo_exp.tasks.verifier import get_verifier, reward_of

VERIFIER_ENV = "DAPO_VERL_VERIFIER"  # task.verifier, set in the job's environment by the translation


@functools.cache
def _verifier(name: str):
    return get_verifier(name)


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None,
                  **kwargs: Any) -> dict[str, Any]:
    """``{"score": +1 | -1, "acc": correct, "pred": the extracted answer}`` of one response."""
    result = _verifier(os.environ.get(VERIFIER_ENV, "math_dapo")).verify(solution_str, ground_truth)
    return {"score": reward_of(result), "acc": bool(result.correct), "pred": result.pred or ""}
