"""Evaluation metrics over k sampled responses per held-out problem (pure functions).

- ``eval/acc_avg`` = avg@k (the paper's AIME metric, avg@32): mean over problems of the
  fraction of a problem's k samples that are correct, (1/P) sum_i c_i / k.
- ``eval/pass_at_k``: unbiased pass@k of Chen et al. 2021 (Codex), 1 - C(n-c, k) / C(n, k)
  per problem with n samples of which c are correct, averaged over problems. With
  n = k samples it is the fraction of problems with at least one correct sample.
- ``eval/maj_at_k``: majority vote (self-consistency) over the normalised answers
  (``VerifyResult.pred``); a problem counts if its winning answer is correct.
- ``eval/response_len_mean``: mean response length in tokens over all samples.
- ``eval/truncated_frac``: fraction of samples cut at the length cap (no EOS).

Samples are laid out group-major: sample ``j`` of problem ``i`` sits at index ``i * k + j``
(the order of ``verify_batch`` over ``[p.answer for p in problems for _ in range(k)]``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Hashable, Optional, Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimate from ``n`` samples with ``c`` correct: 1 - C(n-c, k) / C(n, k).

    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k / i), which never forms the (huge) binomials.
    Requires 0 <= c <= n and 1 <= k <= n.
    """
    if not (0 <= c <= n):
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}")
    if not (1 <= k <= n):
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def avg_at_k(correct_matrix: Sequence[Sequence[Any]] | np.ndarray) -> float:
    """avg@k: the mean over problems of the mean over that problem's samples of ``correct``.

    ``correct_matrix``: (P, k) array of bools/0-1, or a list of per-problem lists (ragged
    allowed: each problem weighs the same whatever its sample count).
    """
    rows = [np.asarray(r, dtype=np.float64) for r in correct_matrix]
    if not rows or any(r.size == 0 for r in rows):
        raise ValueError("avg_at_k: need at least one problem and one sample per problem")
    return float(np.mean([r.mean() for r in rows]))


def majority_vote(preds: Sequence[Optional[Hashable]]) -> tuple[Optional[Hashable], Optional[int]]:
    """The most frequent non-None answer and the index of its first occurrence.

    Ties go to the answer that appears first among the samples (lowest index), so the
    result does not depend on string order or hashing. None (no answer) wins only when
    every sample is None, and then the result is ``(None, None)``.
    """
    counts = Counter(p for p in preds if p is not None)
    if not counts:
        return None, None
    first: dict[Hashable, int] = {}
    for idx, p in enumerate(preds):
        if p is not None and p not in first:
            first[p] = idx
    winner = max(counts, key=lambda p: (counts[p], -first[p]))
    return winner, first[winner]


def maj_at_k(
    preds_per_problem: Sequence[Sequence[Optional[Hashable]]],
    correct_per_problem: Sequence[Sequence[Any]],
) -> float:
    """maj@k: fraction of problems whose majority answer (see :func:`majority_vote`) is correct.

    The winning answer's correctness is that of its first sample. A problem where no
    sample gave an answer counts as wrong.
    """
    if len(preds_per_problem) != len(correct_per_problem) or not preds_per_problem:
        raise ValueError("maj_at_k: need the same, non-zero number of problems in preds and correct")
    hits = []
    for preds, correct in zip(preds_per_problem, correct_per_problem):
        if len(preds) != len(correct):
            raise ValueError(f"maj_at_k: a problem has {len(preds)} preds but {len(correct)} correct flags")
        _, idx = majority_vote(preds)
        hits.append(idx is not None and bool(correct[idx]))
    return float(np.mean(hits))


def _eval_inputs(problem_ids: Sequence[Any], sample_correct: Sequence[Any], sample_preds: Sequence[Any],
                 lengths: Sequence[Any], truncated: Sequence[Any], k: int) -> tuple:
    """:func:`summarise_eval`'s inputs as arrays and lists, checked: (correct, ids per problem, preds, lens, trunc)."""
    if k < 1:
        raise ValueError(f"summarise_eval: k must be >= 1, got {k}")
    correct = np.asarray(sample_correct, dtype=bool).reshape(-1)
    n = correct.size
    if n == 0 or n % k:
        raise ValueError(f"summarise_eval: {n} samples is not a positive multiple of k={k}")
    n_problems = n // k
    lens = np.asarray(lengths, dtype=np.float64).reshape(-1)
    trunc = np.asarray(truncated, dtype=bool).reshape(-1)
    preds = list(sample_preds)
    ids = list(problem_ids)
    if len(ids) == n and n_problems != n:
        ids = ids[::k]
    if len(ids) != n_problems:
        raise ValueError(f"summarise_eval: {len(ids)} problem_ids for {n_problems} problems x k={k} samples")
    for name, size in (("sample_preds", len(preds)), ("lengths", lens.size), ("truncated", trunc.size)):
        if size != n:
            raise ValueError(f"summarise_eval: {name} has {size} entries, want one per sample ({n})")
    return correct, ids, preds, lens, trunc


def summarise_eval(
    problem_ids: Sequence[Any],
    sample_correct: Sequence[Any],
    sample_preds: Sequence[Optional[Hashable]],
    lengths: Sequence[Any],
    truncated: Sequence[Any],
    k: int,
) -> dict[str, Any]:
    """The eval metrics of one evaluation, plus a per-problem breakdown.

    Inputs are lists or arrays (torch CPU tensors work) over P * k samples, group-major
    (sample j of problem i at index i * k + j). ``problem_ids`` has one id per problem (P)
    or one per sample (P * k). Returns exactly the keys ``eval/acc_avg``,
    ``eval/pass_at_k``, ``eval/maj_at_k``, ``eval/response_len_mean``,
    ``eval/truncated_frac`` (floats) and ``per_problem``: a list of dicts with
    ``problem_id, n, n_correct, acc, pass_at_k, maj_pred, maj_correct, len_mean, truncated_frac``.
    """
    correct, ids, preds, lens, trunc = _eval_inputs(problem_ids, sample_correct, sample_preds, lengths, truncated, k)
    n_problems = len(ids)
    grid = correct.reshape(n_problems, k)
    per_problem = []
    for i in range(n_problems):
        sl = slice(i * k, (i + 1) * k)
        group_preds = preds[sl]
        winner, idx = majority_vote(group_preds)
        c = int(grid[i].sum())
        per_problem.append(
            {
                "problem_id": ids[i],
                "n": k,
                "n_correct": c,
                "acc": c / k,
                "pass_at_k": pass_at_k(k, c, k),
                "maj_pred": winner,
                "maj_correct": idx is not None and bool(grid[i, idx]),
                "len_mean": float(lens[sl].mean()),
                "truncated_frac": float(trunc[sl].mean()),
            }
        )
    return {
        "eval/acc_avg": avg_at_k(grid),
        "eval/pass_at_k": float(np.mean([p["pass_at_k"] for p in per_problem])),
        "eval/maj_at_k": float(np.mean([p["maj_correct"] for p in per_problem])),
        "eval/response_len_mean": float(lens.mean()),
        "eval/truncated_frac": float(trunc.mean()),
        "per_problem": per_problem,
    }
