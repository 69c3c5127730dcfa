"""Sampling with a static KV cache, optionally with a ``torch.compile``-d decode step.

``rollout.decode`` picks how :class:`~dapo_exp.rollout.hf.engine.HFEngine` samples:

- ``generate``: transformers ``generate`` (a dynamic KV cache; per-token Python and
  per-op overhead, which dominates at small model sizes);
- ``static``: :class:`StaticDecoder` eagerly: one prefill, then one forward of one token per
  step into a transformers ``StaticCache`` of fixed shape;
- ``compiled``: the same loop with the one-token forward compiled by ``torch.compile``
  (inductor; ``mode="reduce-overhead"``, i.e. CUDA graphs, on CUDA);
- ``fused``: :mod:`dapo_exp.rollout.hf.fused_decode`, a hand-fused eager step for Llama / Qwen2;
- ``auto``: ``compiled`` on CUDA, ``fused`` on CPU (where compiling costs seconds per shape
  and buys little over eager code; figures in docs/results/benchmarks.md).

The sampling is transformers' own, op for op: temperature (skipped at 1.0), then the top-p
filter of ``TopPLogitsWarper`` (skipped at 1.0), a float32 softmax and one
``torch.multinomial`` over the whole batch per step, finished rows padded until every row
has finished. So for a fixed seed ``static`` draws the samples ``generate`` draws
(same random numbers, same probabilities up to float rounding: identical on CPU in the tests,
>= 90% of rows identical on CUDA, whose kernels round the two cache layouts differently), and ``compiled`` those of
``static`` (the compiled forward's logits differ by float rounding only); tests/test_decode.py
checks both.

Shapes are fixed so that the compiled step is compiled once per shape, not once per call:
rows are padded up to a power of two (at least 8; padding rows repeat the first prompt and
are dropped), the cache length ``prompt width + max new tokens`` up to a multiple of
``LEN_BUCKET``. Padding rows change which random numbers a real row gets, so the equality
with ``generate`` holds when the batch is already a power of two (the toy's 128 and 256).

With keyed randomness (``SamplingSpec.keys``, :mod:`dapo_exp.keyed`) the draw is Gumbel-max over
the same warped scores with noise keyed per row and position: every loop (and ``generate``, through
a logits processor) then draws the same tokens for the same keys, whatever the padding or chunking.

A model or machine that cannot compile (no C++ compiler for inductor, a model without
static-cache support) falls back to ``generate`` with a logged warning naming the reason
(:meth:`StaticDecoder.fallback_reason`).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

import torch

from dapo_exp.config import DECODE_MODES

log = logging.getLogger(__name__)

LEN_BUCKET = 64  # cache lengths are rounded up to a multiple of this (fewer shapes, fewer compiles)
MIN_ROWS = 8
KEEP_CACHES = 2  # static caches kept between calls (most recent shapes; e.g. training's and eval's)
# generation_config settings that generate applies and the static and fused loops do not implement
UNSUPPORTED_GENERATION = ("repetition_penalty", "no_repeat_ngram_size", "encoder_repetition_penalty",
                          "bad_words_ids", "suppress_tokens", "begin_suppress_tokens", "sequence_bias", "min_p",
                          "typical_p", "epsilon_cutoff", "eta_cutoff", "forced_bos_token_id", "forced_eos_token_id",
                          "min_length", "renormalize_logits", "guidance_scale", "top_h",
                          "exponential_decay_length_penalty", "num_beams", "num_beam_groups", "diversity_penalty",
                          "stop_strings", "watermarking_config")


def _neutral(key: str, value: Any) -> bool:
    """Whether a generation_config value changes nothing (unset, or the identity setting)."""
    if value is None or value is False or (isinstance(value, (list, tuple, dict)) and not value):
        return True
    if key in ("repetition_penalty", "encoder_repetition_penalty", "typical_p", "guidance_scale", "top_h",
               "num_beams", "num_beam_groups"):
        return value == 1.0
    if key in ("no_repeat_ngram_size", "min_length", "epsilon_cutoff", "eta_cutoff", "min_p", "diversity_penalty"):
        return value == 0
    return False


def resolve_decode(mode: str, device: torch.device) -> str:
    """``auto`` -> ``compiled`` on CUDA, ``fused`` elsewhere; other modes unchanged."""
    if mode not in DECODE_MODES:
        raise ValueError(f"rollout.decode={mode!r}: choose one of {', '.join(DECODE_MODES)}")
    if mode == "auto":
        return "compiled" if device.type == "cuda" else "fused"
    return mode


def generation_config_issue(model: torch.nn.Module) -> str | None:
    """What in the model's ``generation_config`` a hand-written sampling loop (static or fused)
    does not implement (None: nothing).

    ``generate`` applies the model's ``generation_config`` defaults that the engine does not set
    itself (a repetition penalty, say, from a model's generation_config.json); the loops implement
    ``min_new_tokens`` only, so a model whose config sets any of :data:`UNSUPPORTED_GENERATION`
    samples with generate.
    """
    gc = getattr(model, "generation_config", None)
    if gc is not None:
        odd = [k for k in UNSUPPORTED_GENERATION if not _neutral(k, getattr(gc, k, None))]
        if odd:
            return ("the model's generation_config sets " + ", ".join(f"{k}={getattr(gc, k)!r}" for k in odd)
                    + ", which transformers generate applies and the hand-written loop does not")
    return None


def padded_rows(n: int) -> int:
    """Rows of the static batch for ``n`` sequences: the next power of two, at least ``MIN_ROWS``."""
    return max(MIN_ROWS, 1 << max(0, n - 1).bit_length())


def padded_len(n: int) -> int:
    """Cache length for ``n`` positions: rounded up to a multiple of ``LEN_BUCKET``."""
    return -(-n // LEN_BUCKET) * LEN_BUCKET


def top_p_filter(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filtering as transformers' ``TopPLogitsWarper`` (min_tokens_to_keep=1) does it.

    Sort ascending, drop the tokens whose cumulative probability is at most ``1 - top_p``
    (always keeping the most likely one), set their scores to -inf.
    """
    sorted_logits, sorted_idx = torch.sort(scores, descending=False)
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove = cum <= (1 - top_p)
    remove[..., -1:] = False
    remove = remove.scatter(1, sorted_idx, remove)
    return scores.masked_fill(remove, -float("inf"))


def warp(logits: torch.Tensor, temperature: float, top_p: float, banned: torch.Tensor | None = None) -> torch.Tensor:
    """The sampling scores (float32) as transformers computes them: ``banned`` ids set to -inf first
    (the EOS ids while fewer than ``min_new_tokens`` are out, as ``MinNewTokensLengthLogitsProcessor``
    does), then temperature (skipped at 1.0), then the top-p filter (skipped at 1.0)."""
    scores = logits.float()
    if banned is not None:
        scores = scores.index_fill(-1, banned, -float("inf"))
    if temperature != 1.0:
        scores = scores / temperature
    if top_p < 1.0:
        scores = top_p_filter(scores, top_p)
    return scores


def sample_next(logits: torch.Tensor, temperature: float, top_p: float, banned: torch.Tensor | None = None,
                keys: torch.Tensor | None = None, position: int = 0) -> torch.Tensor:
    """One token per row from the warped distribution (:func:`warp`).

    Without ``keys``: as transformers' sampling does it, a float32 softmax and one
    ``torch.multinomial`` over the batch from the global torch stream (see the module docstring).
    With ``keys`` (one int64 per row, ``train.randomness=keyed``): Gumbel-max with noise keyed by
    (row key, ``position``, token id), :func:`dapo_exp.keyed.gumbel_argmax`.
    """
    scores = warp(logits, temperature, top_p, banned)
    if keys is not None:
        from dapo_exp.keyed import gumbel_argmax

        return gumbel_argmax(scores, keys, position)
    probs = torch.softmax(scores, dim=-1)
    return torch.multinomial(probs, num_samples=1).squeeze(1)


def sampling_loop(logits: torch.Tensor, step: Callable[[int, torch.Tensor], torch.Tensor], finished: torch.Tensor, *,
                  max_new_tokens: int, temperature: float, top_p: float, pad: int, eos_ids: set[int],
                  min_new_tokens: int = 0, keys: torch.Tensor | None = None) -> torch.Tensor:
    """The token loop of the hand-written decoders (static and fused): sample from ``logits``,
    ``pad`` after a row's EOS, stop at ``max_new_tokens`` or when every row not already
    ``finished`` has ended; ``step(t, tokens)`` feeds the ``t``-th sampled tokens and returns
    the next logits. ``keys``: per-row keys for keyed sampling (:func:`sample_next`), the
    ``t``-th new token of a row drawn at position ``t``. Returns ``[rows, <= max_new_tokens]``."""
    device = logits.device
    eos = torch.tensor(sorted(eos_ids), device=device)
    out = []
    sync_every = 1 if device.type == "cpu" else 16  # checking "all finished" syncs the GPU
    for t in range(max_new_tokens):
        nxt = sample_next(logits, temperature, top_p, eos if t < min_new_tokens else None, keys, t)
        nxt = torch.where(finished, torch.full_like(nxt, pad), nxt)
        out.append(nxt)
        finished = finished | torch.isin(nxt, eos)
        if t + 1 == max_new_tokens or ((t + 1) % sync_every == 0 and bool(finished.all())):
            break
        logits = step(t, nxt)
    return torch.stack(out, 1)


class StaticDecoder:
    """The static-cache sampling loop over ``model`` (eager or with a compiled decode step).

    ``decode(ids, att, ...)`` takes a left-padded batch (as ``generate`` does) and returns the
    new tokens ``[rows, <= max_new_tokens]`` with rows after their EOS filled with ``pad``.
    The ``StaticCache`` of the last :data:`KEEP_CACHES` shapes is kept and reset between calls
    (its tensors keep their addresses, which CUDA graphs need); :meth:`free` drops them. A
sweep's runs in one process would pile up compiled entries past dynamo's recompile limit (8,
after which it runs the step eagerly with a warning); the engine's ``close`` resets dynamo.
    """

    def __init__(self, model: torch.nn.Module, compiled: bool) -> None:
        self.model = model
        self.compiled = compiled
        self._caches: dict[tuple[int, int], Any] = {}
        self._step: Callable[..., torch.Tensor] = self._forward_one
        self._accepts_logits_to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        if compiled:
            mode = "reduce-overhead" if next(model.parameters()).device.type == "cuda" else None
            self._step = torch.compile(self._forward_one, dynamic=False, mode=mode)

    @staticmethod
    def fallback_reason(model: torch.nn.Module) -> str | None:
        """Why this model cannot use the static loop (None: it can).

        Static-cache / compile support, and :func:`generation_config_issue`.
        """
        if not getattr(model, "_can_compile_fullgraph", False):
            return (f"{type(model).__name__} does not declare static-cache / torch.compile support "
                    "(_can_compile_fullgraph is False)")
        return generation_config_issue(model)  # (StaticCache and torch.compile exist in every allowed version)

    def _forward_one(self, tok: torch.Tensor, pos: torch.Tensor, cache_pos: torch.Tensor,
                     mask: torch.Tensor, cache: Any) -> torch.Tensor:
        out = self.model(input_ids=tok, position_ids=pos, cache_position=cache_pos, attention_mask=mask,
                         past_key_values=cache, use_cache=True)
        return out.logits[:, -1]

    def _cache(self, rows: int, length: int) -> Any:
        from transformers import StaticCache

        key = (rows, length)
        cache = self._caches.pop(key, None)
        if cache is None:
            cache = StaticCache(config=self.model.config, max_cache_len=length)
        else:
            cache.reset()
        self._caches[key] = cache  # most recent last
        while len(self._caches) > KEEP_CACHES:  # the least recently used shape's memory goes
            self._caches.pop(next(iter(self._caches)))
        return cache

    def free(self) -> None:
        """Drop the kept caches (the engine's ``close``)."""
        self._caches.clear()

    @torch.no_grad()
    def decode(self, ids: torch.Tensor, att: torch.Tensor, *, max_new_tokens: int, temperature: float,
               top_p: float, pad: int, eos_ids: set[int], min_new_tokens: int = 0,
               keys: torch.Tensor | None = None) -> torch.Tensor:
        device = ids.device
        n, width = ids.shape
        rows = padded_rows(n)
        if rows > n:  # padding rows repeat the first prompt; their samples are dropped
            ids = torch.cat([ids, ids[:1].expand(rows - n, -1)])
            att = torch.cat([att, att[:1].expand(rows - n, -1)])
            if keys is not None:  # (keyed noise: a real row's draws do not depend on the padding)
                keys = torch.cat([keys, keys[:1].expand(rows - n)])
        length = padded_len(width + max_new_tokens)
        cache = self._cache(rows, length)
        # the 2-D mask covers the whole cache: left padding 0, the rest 1 (the causal mask hides
        # positions not yet written), so its shape never changes during the loop
        mask = torch.ones(rows, length, dtype=att.dtype, device=device)
        mask[:, :width] = att
        pos = (att.cumsum(-1) - 1).clamp(min=0)  # real tokens 0, 1, ... as generate; pads are masked anyway
        # the prefill scores only the last position, as generate does (logits_to_keep=1): no
        # [rows, width, vocab] tensor
        keep = {"logits_to_keep": 1} if self._accepts_logits_to_keep else {}
        logits = self.model(input_ids=ids, attention_mask=mask, position_ids=pos,
                            cache_position=torch.arange(width, device=device), past_key_values=cache,
                            use_cache=True, **keep).logits[:, -1]
        finished = torch.zeros(rows, dtype=torch.bool, device=device)
        finished[n:] = True  # padding rows: sampled (same random numbers) but never waited for
        last = pos[:, -1:]

        def step(t: int, nxt: torch.Tensor) -> torch.Tensor:
            logits = self._step(nxt[:, None], last + (t + 1), torch.tensor([width + t], device=device), mask, cache)
            return logits.clone()  # a CUDA graph's output buffer is overwritten by its next replay

        out = sampling_loop(logits, step, finished, max_new_tokens=max_new_tokens, temperature=temperature,
                            top_p=top_p, pad=pad, eos_ids=eos_ids, min_new_tokens=min_new_tokens, keys=keys)
        return out[:n]
