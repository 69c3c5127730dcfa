"""Rollout-vs-trainer mismatch: metrics and truncated importance sampling (pure functions).

The engine that samples (vLLM, or HF ``generate``) and the trainer's forward pass
compute the "same" next-token distribution with different kernels, dtypes and
batch shapes, so their log-probabilities of the sampled tokens differ a little
(a lot in bf16 with long sequences). The loss always uses the trainer's
log-probs as ``old_logp`` (``dapo_exp.steps``: from the update forward for
on-policy rows, else recomputed); these functions measure the gap and,
optionally, correct for it (the ``rollout_correction`` switch, whose weights sit next to the loss:
:func:`dapo_exp.objective.rollout_correction_weights`).

Shapes: ``(B, T)`` response tokens, right-padded; ``mask`` marks real tokens.
Imports torch only.
"""

from __future__ import annotations

import torch
from torch import Tensor


def rollout_mismatch_stats(trainer_logp: Tensor, engine_logp: Tensor, mask: Tensor) -> dict[str, float]:
    """Summary of the per-token gap between the trainer's and the engine's log-probs.

    Args:
        trainer_logp: ``(B, T)`` log-probs of the sampled tokens under the
            trainer's old policy (same temperature as sampling).
        engine_logp: ``(B, T)`` log-probs the engine reported while sampling.
        mask: ``(B, T)`` 0/1, the tokens that count (padding excluded).

    Returns:
        With ``d_t = trainer_t - engine_t`` and ``r_t = exp(d_t)`` over masked tokens:

        - ``rollout/logp_absdiff_mean``: mean ``|d_t|``
        - ``rollout/logp_absdiff_max``: max ``|d_t|``
        - ``rollout/ratio_mean``: mean ``r_t`` (1 when the two agree)
        - ``rollout/ratio_std``: population std of ``r_t``
        - ``rollout/ratio_max``, ``rollout/ratio_min``: extremes of ``r_t``

        All 0.0 (ratios 1.0) when the mask is empty.
    """
    if trainer_logp.shape != engine_logp.shape or trainer_logp.shape != mask.shape:
        raise ValueError(
            f"shapes differ: trainer_logp {tuple(trainer_logp.shape)}, engine_logp "
            f"{tuple(engine_logp.shape)}, mask {tuple(mask.shape)}"
        )
    keep = mask.bool()
    if not keep.any():
        return {
            "rollout/logp_absdiff_mean": 0.0,
            "rollout/logp_absdiff_max": 0.0,
            "rollout/ratio_mean": 1.0,
            "rollout/ratio_std": 0.0,
            "rollout/ratio_max": 1.0,
            "rollout/ratio_min": 1.0,
        }
    d = (trainer_logp.detach().double() - engine_logp.detach().double())[keep]
    r = torch.exp(d)
    return {
        "rollout/logp_absdiff_mean": d.abs().mean().item(),
        "rollout/logp_absdiff_max": d.abs().max().item(),
        "rollout/ratio_mean": r.mean().item(),
        "rollout/ratio_std": r.std(unbiased=False).item(),
        "rollout/ratio_max": r.max().item(),
        "rollout/ratio_min": r.min().item(),
    }


def pad_logprobs(rows: list[list[float]], length: int, pad: float = 0.0, dtype=torch.float32) -> Tensor:
    """``(B, length)`` tensor from ragged per-row log-probs (``Generations.sampled_logprobs``), right-padded."""
    out = torch.full((len(rows), length), pad, dtype=dtype)
    for i, r in enumerate(rows):
        n = min(len(r), length)
        if n:
            out[i, :n] = torch.tensor(r[:n], dtype=dtype)
    return out
