"""Keyed randomness (``train.randomness=keyed``): every random draw is a function of what it is for.

With the default ``stream`` randomness a run draws its prompts from one seeded walk and its
sampling noise from the global torch stream, seeded per generate call; anything that changes how
many numbers one call consumes (a response that ends earlier, a refill round of Dynamic Sampling,
an extra draw) shifts every later draw. Two arms of an ablation that share a seed then share
only their first draws. With ``keyed`` randomness each draw is a pure function of its *key*:

- training prompts: ``(seed, step, slot)`` -- the first round of a step walks a seeded
  permutation at positions ``(step - 1) * round size + slot``; refill rounds draw on their own
  slots ``(seed, step, round, slot)``, so a refill in one arm never moves the other arm's prompts
  (:class:`dapo_exp.build.PromptSampler`);
- training samples: ``(seed, step, round, slot, prompt, sample index, position)``;
- evaluation samples: ``(seed, replica, problem, sample index, position)`` -- the same at every
  evaluation step, so curves and arms compare like with like (``replica`` > 0: a repeat of an
  evaluation with fresh noise).

Purposes are separate key spaces (:data:`TRAIN_PROMPTS`, :data:`REFILL_PROMPTS`,
:data:`TRAIN_SAMPLES`, :data:`EVAL_SAMPLES`): no draw of one purpose reuses another's numbers.

The sampler is Gumbel-max: after the logits are warped (banned tokens, temperature, top-p), the
token is ``argmax(scores + g)`` with ``g = -log(-log(u))`` i.i.d. standard Gumbel, which picks token
``i`` with probability exactly ``softmax(scores)_i`` (Gumbel 1954; Maddison et al. 2014), so the
draws follow the warped distribution, not an approximation of it. The uniforms ``u`` come from a
counter-based hash of ``(row key, position, token id)`` computed on torch tensors for the whole
``[rows, vocab]`` block at once: no generator object per row, the same numbers on CPU and CUDA and
whatever the batch composition or chunking (a row's noise depends on its key only).

The hash is murmur3's 32-bit finaliser applied twice per element, with 32-bit products formed from
16-bit halves inside int64 so that no operation overflows; each row and position first gets two
independent 32-bit words (64 bits: two row-positions share a noise vector with probability 2^-64).
The Python-side keys are 63-bit BLAKE2b digests of the key tuple (:func:`derive`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

RANDOMNESS = ("stream", "keyed")

# purposes: separate key spaces
TRAIN_PROMPTS = "train_prompts"
REFILL_PROMPTS = "refill_prompts"
TRAIN_SAMPLES = "train_samples"
EVAL_SAMPLES = "eval_samples"
SAMPLE = "sample"  # a prompt key and a sample index -> the row key

_M32 = 0xFFFFFFFF
_M63 = (1 << 63) - 1


def derive(*parts: int | str) -> int:
    """A 63-bit key of an integer/string tuple (BLAKE2b; distinct tuples give unrelated keys)."""
    text = "\x1f".join(f"{type(p).__name__[0]}{p}" for p in parts)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") & _M63


def row_keys(prompt_keys: Sequence[int], n: int) -> list[int]:
    """Group-major row keys: sample ``j`` of prompt ``i`` at ``i * n + j`` gets ``derive(SAMPLE, key_i, j)``."""
    return [derive(SAMPLE, k, j) for k in prompt_keys for j in range(n)]


def train_sample_keys(seed: int, step: int, round_idx: int, prompt_indices: Sequence[int]) -> list[int]:
    """Keys of one round's prompts for the sampling noise of training rollouts (slot = position in the round)."""
    return [derive(TRAIN_SAMPLES, seed, step, round_idx, slot, int(p)) for slot, p in enumerate(prompt_indices)]


def eval_sample_keys(seed: int, n_problems: int, replica: int = 0) -> list[int]:
    """Keys of the first ``n_problems`` held-out problems for evaluation noise (independent of the step)."""
    return [derive(EVAL_SAMPLES, seed, replica, i) for i in range(n_problems)]


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``x * c mod 2^32`` for int64 ``x`` in [0, 2^32) without overflowing int64."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _M32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """murmur3's fmix32 on int64 tensors holding 32-bit values (a bijection with full avalanche)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def keys_tensor(keys: Sequence[int], device: torch.device | str | None = None) -> torch.Tensor:
    """Row keys as an int64 tensor (what :func:`gumbel` takes)."""
    return torch.tensor([int(k) & _M63 for k in keys], dtype=torch.int64, device=device)


def uniforms(keys: torch.Tensor, position: int | torch.Tensor, vocab: int) -> torch.Tensor:
    """``[rows, vocab]`` float64 uniforms in (0, 1), a pure function of (row key, position, token id)
    (``position``: an int, or one per row)."""
    lo, hi = keys & _M32, (keys >> 32) & _M32
    t = position if isinstance(position, torch.Tensor) else torch.full_like(keys, int(position) & _M32)
    a = _mix32(lo ^ _mix32(hi ^ _mix32(t ^ 0x9E3779B9)))  # two independent words per row and position
    b = _mix32(hi ^ _mix32(lo ^ _mix32(t ^ 0x7F4A7C15) ^ 0x6A09E667))
    v = torch.arange(vocab, dtype=torch.int64, device=keys.device)
    x = _mix32((a[:, None] + _mul32(v, 0x9E3779B9)[None]) & _M32)
    x = _mix32(x ^ b[:, None])
    return (x.to(torch.float64) + 0.5) * 2.0**-32


def _gumbel_eager(keys: torch.Tensor, position: torch.Tensor, vocab: int) -> torch.Tensor:
    u = uniforms(keys, position, vocab)
    return (-torch.log(-torch.log(u))).to(torch.float32)


_compiled: dict[str, object] = {}


def gumbel(keys: torch.Tensor, position: int, vocab: int) -> torch.Tensor:
    """``[rows, vocab]`` standard Gumbel noise (float32) keyed by (row key, position, token id).

    On CUDA the hash is one ``torch.compile``-d kernel (eagerly it is some forty elementwise
    kernels over ``[rows, vocab]`` int64 tensors); if compiling fails it runs eagerly. The integer
    hash is exact either way; the two logarithms may round differently in the last bit."""
    pos = torch.full_like(keys, int(position) & _M32)
    if keys.is_cuda and _compiled.get("cuda") is not False:
        fn = _compiled.get("cuda")
        try:
            if fn is None:
                fn = _compiled["cuda"] = torch.compile(_gumbel_eager, dynamic=True)
            return fn(keys, pos, vocab)
        except Exception:  # noqa: BLE001 - no triton, say: the eager ops give the same numbers
            _compiled["cuda"] = False
    return _gumbel_eager(keys, pos, vocab)


def gumbel_argmax(scores: torch.Tensor, keys: torch.Tensor, position: int) -> torch.Tensor:
    """One token per row drawn from ``softmax(scores)`` (already warped; -inf = excluded) with keyed noise."""
    g = gumbel(keys, position, scores.shape[-1])
    return (scores.float() + g).argmax(dim=-1)


def vllm_seed(key: int, n: int) -> int:
    """A vLLM request seed from a prompt key (vLLM seeds its ``n`` children ``seed + j``; int32 range)."""
    return key % (2**31 - 1 - n)
