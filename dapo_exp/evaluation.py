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

The endpoint (``eval.endpoint``): the final evaluation may be larger than the intermediate ones
that draw the curves (``eval.final_problems`` x ``eval.final_samples`` against ``eval.problems`` x
``eval.k``, :func:`eval_size`), so that its noise is a small share of a paired difference's
variance while the curves stay cheap; :func:`endpoint_summary` records which endpoint a run
declares (the final evaluation, or the mean of the last k, labelled as such) in ``summary.json``,
and :func:`endpoint_line` is the sentence the comparison table's caption opens with.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Any

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


def majority_vote(preds: Sequence[Hashable | None]) -> tuple[Hashable | None, int | None]:
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
    preds_per_problem: Sequence[Sequence[Hashable | None]],
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
    sample_preds: Sequence[Hashable | None],
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


# --------------------------------------------------------------------------- #
# The endpoint: the final evaluation's size and what the table reports          #
# --------------------------------------------------------------------------- #
ENDPOINTS = ("final", "last_k_mean")


def eval_size(eval_cfg: Any, final: bool, n_available: int) -> tuple[int, int]:
    """(problems, samples per problem) of an evaluation: the first ``eval.problems`` held-out
    problems x ``eval.k`` samples, or at the final step ``eval.final_problems`` x
    ``eval.final_samples`` (each null = the intermediate value). Problems are capped at the
    held-out set's size (the arith task's is ``task.arith_n_eval``)."""
    problems = eval_cfg.problems or n_available
    k = eval_cfg.k
    if final:
        problems = eval_cfg.final_problems or problems
        k = eval_cfg.final_samples or k
    return min(problems, n_available), k


def sizes_line(eval_cfg: Any, n_available: int) -> str:
    """The evaluations' sizes for the run's first log line, e.g. ``evaluations 64 x 4 of 256 held-out
    problems, the final one 256 x 8``: the toy's sizes are schema defaults, so a run of another task
    without a preset says here that it evaluates only part of its held-out set."""
    (p, k), (fp, fk) = eval_size(eval_cfg, False, n_available), eval_size(eval_cfg, True, n_available)
    final = "" if (p, k) == (fp, fk) else f", the final one {fp} x {fk}"
    return f"evaluations {p} x {k} of {n_available} held-out problems{final}"


def last_k_steps(steps: Any, k: int) -> list[int]:
    """The steps of the last ``k`` evaluations of the trained policy (step > 0 when there is one,
    else the base policy's): what ``eval.endpoint=last_k_mean`` averages."""
    trained = sorted(s for s in steps if s > 0) or sorted(steps)
    return trained[-k:]


def endpoint_summary(eval_cfg: Any, evals: dict[int, dict[str, float]], final_step: int,
                     n_available: int) -> dict[str, Any]:
    """The run's declared endpoint for the summary: its name, the label the table prints, its value
    of ``eval/acc_avg`` and how it was measured (the final evaluation's problems x samples, the
    steps it covers, and the repeats of the final evaluation when ``eval.final_repeats`` > 0).

    ``final``: the last evaluation. ``last_k_mean``: the mean of the last ``eval.endpoint_k``
    evaluations of the trained policy (step > 0 when there is one), labelled as such."""
    name = eval_cfg.endpoint
    if name not in ENDPOINTS:
        raise ValueError(f"eval.endpoint={name!r}: choose one of {', '.join(ENDPOINTS)}")
    problems, k = eval_size(eval_cfg, True, n_available)
    acc = "eval/acc_avg"
    if name == "final":
        covered = [final_step]
        label = f"final held-out accuracy (avg@{k} over {problems} problems at step {final_step})"
    else:
        covered = last_k_steps(evals, eval_cfg.endpoint_k)
        label = (f"mean held-out accuracy over the last {len(covered)} evaluations (steps "
                 f"{', '.join(map(str, covered))}; final avg@{k} over {problems} problems)")
    values = [evals[s].get(acc) for s in covered]
    value = float(np.mean(values)) if values and all(v is not None for v in values) else float("nan")
    final = evals.get(final_step, {})
    repeats = [final[key] for key in sorted(final) if key.startswith(acc + "_rep")]
    return {"name": name, "k": int(eval_cfg.endpoint_k) if name == "last_k_mean" else 1, "label": label,
            "metric": acc, "value": value, "steps": covered, "final_problems": problems, "final_samples": k,
            "final_repeats": repeats}


ENDPOINT_EVALS = "endpoint/n_evals"  # runs-frame column: how many evaluations a run's endpoint averages


def endpoint_evals(runs: Any) -> Any:
    """Per run of a runs frame, how many evaluations its endpoint value averages: ``endpoint/n_evals``
    (fewer than ``eval.endpoint_k`` in a short run), else ``eval.endpoint_k`` for ``last_k_mean`` and 1
    for ``final`` (frames without the column); an int Series on the frame's index."""
    import pandas as pd

    if ENDPOINT_EVALS in runs:
        return runs[ENDPOINT_EVALS].fillna(1).astype(int)
    names = runs["config.eval.endpoint"] if "config.eval.endpoint" in runs else pd.Series("final", index=runs.index)
    ks = runs["config.eval.endpoint_k"] if "config.eval.endpoint_k" in runs else pd.Series(1, index=runs.index)
    return ks.where(names == "last_k_mean", 1).fillna(1).astype(int)


def endpoint_line(runs: Any) -> str:
    """The table's first caption sentence: which endpoint its accuracy column is (the last
    evaluation, or the mean of the last ``eval.endpoint_k`` ones), and its size,
    read from the runs' resolved configs (``config.eval.*`` columns of the runs frame); runs that
    declare different endpoints are named as such. "" without config columns."""
    import pandas as pd

    if not isinstance(runs, pd.DataFrame) or not len(runs) or "config.eval.k" not in runs:
        return ""

    def col(name: str) -> pd.Series:
        return runs[name] if name in runs else pd.Series([None] * len(runs), index=runs.index)

    def size(i: Any, final: bool) -> str:
        k = col("config.eval.final_samples")[i] if final else None
        p = col("config.eval.final_problems")[i] if final else None
        k = int(k) if pd.notna(k) else int(col("config.eval.k")[i])
        p = p if pd.notna(p) else col("config.eval.problems")[i]
        n = col("config.task.arith_n_eval")[i] if col("config.task.name")[i] == "arith" else None
        if pd.notna(p) and pd.notna(n):
            p = min(int(p), int(n))
        elif pd.isna(p):
            p = n
        return f"avg@{k} over {int(p)} problems" if pd.notna(p) else f"avg@{k} over the held-out set"

    texts = set()
    n_evals = endpoint_evals(runs)  # fewer than eval.endpoint_k in a short run
    for i in runs.index:
        name = col("config.eval.endpoint")[i]
        name = "final" if pd.isna(name) else name
        if name == "last_k_mean" and n_evals[i] > 1:
            text = (f"mean held-out accuracy of the last {n_evals[i]} evaluations "
                    f"(eval.endpoint=last_k_mean; the final one {size(i, True)}")
        else:
            text = f"final held-out accuracy, the last evaluation ({size(i, True)}"
        if size(i, False) != size(i, True):
            text += f"; intermediate evaluations {size(i, False)}"
        text += ")"
        texts.add(text)
    return "Endpoint: " + (" | ".join(sorted(texts)) if len(texts) > 1 else texts.pop()) + "."
