"""Micro-batches of a mini-batch: a fixed number of rows, or as many as fit a token budget.

Responses differ a lot in length (a few tokens to the generation cap). Cutting a
mini-batch into micro-batches of a fixed row count pads every row to the longest
of its micro-batch; packing by a token budget instead (verl's ``use_dynamic_bsz``
with ``ppo_max_token_len_per_gpu``) sorts rows by length and fills each
micro-batch up to ``budget`` padded slots, so short rows travel in large
micro-batches and long rows in small ones: less padding, steady memory.

Either way the gradient is unchanged: each micro-batch's loss uses the
*mini-batch* normaliser (``objective.loss_normaliser`` on the whole mini-batch,
sliced to the micro-batch's rows), so the accumulated gradient equals the
mini-batch gradient for every split (tests/test_batching.py checks it for every
aggregation mode).

Pure Python; imports nothing of the project.
"""

from __future__ import annotations


def token_budget_microbatches(lengths: list[int], budget: int) -> list[list[int]]:
    """Pack row indices into micro-batches whose padded size ``rows * max_len <= budget``.

    Rows are sorted by length, longest first (ties by index), and packed greedily:
    a row joins the current micro-batch if the micro-batch still fits with it,
    otherwise it opens a new one. A single row longer than ``budget`` goes alone
    (it cannot be split). Since the first row of a micro-batch is its longest, its
    padded size is ``len(mb) * lengths[mb[0]]``.

    Args:
        lengths: tokens per row (prompt + response, or what the forward pass pads).
        budget: padded token slots per micro-batch (``train.token_budget``).

    Returns:
        Lists of row indices; every index appears exactly once. Longest rows first.
    """
    if budget < 1:
        raise ValueError(f"token budget must be >= 1, got {budget}")
    if any(n < 0 for n in lengths):
        raise ValueError(f"lengths must be >= 0, got {lengths}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= budget:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def fixed_size_microbatches(n_rows: int, size: int) -> list[list[int]]:
    """Consecutive row indices, ``size`` at a time (``train.micro_batch_size``); the last may be shorter."""
    if size < 1:
        raise ValueError(f"micro-batch size must be >= 1, got {size}")
    return [list(range(s, min(s + size, n_rows))) for s in range(0, n_rows, size)]


def microbatches(lengths: list[int], micro_batch_size: int, token_budget: int | None) -> list[list[int]]:
    """The trainer's split: by ``token_budget`` when set (``micro_batch_size`` is then unused), else by count."""
    if token_budget is None:
        return fixed_size_microbatches(len(lengths), micro_batch_size)
    return token_budget_microbatches(lengths, token_budget)


def padding_waste(lengths: list[int], microbatches: list[list[int]]) -> float:
    """Fraction of the padded slots ``sum_mb len(mb) * max_len(mb)`` that are padding (0 when there are none)."""
    slots = sum(len(mb) * max(lengths[i] for i in mb) for mb in microbatches if mb)
    if slots == 0:
        return 0.0
    used = sum(lengths[i] for mb in microbatches for i in mb)
    return 1.0 - used / slots
