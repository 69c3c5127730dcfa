"""Rollouts with HF transformers ``generate`` on the trainer's own model.

The engine samples from the very module the trainer optimises, so
:meth:`HFEngine.sync_weights` has nothing to copy. Prompts are left-padded and
generated in chunks of ``gen_batch_size`` sequences with the KV cache; each chunk
is seeded from ``(spec.seed, chunk index)`` so that a resumed run samples exactly
what an uninterrupted one would.

``decode`` (``rollout.decode``) picks the sampling loop: transformers ``generate``, the fused
Llama / Qwen2 step of :mod:`dapo_exp.rollout.hf.fused_decode`, or the static-cache loop of
:mod:`dapo_exp.rollout.hf.static_decode`, eager or with a compiled decode step (``auto``: compiled
on CUDA, fused on CPU). Same samples either way for a fixed seed (up to float rounding); a loop
that cannot run the model (or a compile that fails) falls back to ``generate`` with a logged
warning that names the reason, and ``decode_used`` says which loop ran.

With ``SamplingSpec.keys`` (keyed randomness, :mod:`dapo_exp.keyed`) every row draws Gumbel-max
noise keyed by its own key and the token position, after the same warping (min-new-tokens ban,
temperature, top-p): the hand-written loops through ``sample_next``, ``generate`` through
:class:`KeyedGumbelProcessor` with greedy decoding (argmax of warped scores plus noise). No global
stream is touched, and a row's tokens depend neither on the chunking nor on the other rows.
"""

from __future__ import annotations

import logging
import time

import torch

from dapo_exp.logprobs import pad_rows
from dapo_exp.rollout.engine import Generations, SamplingSpec
from dapo_exp.rollout.hf.fused_decode import FusedDecoder
from dapo_exp.rollout.hf.static_decode import StaticDecoder, resolve_decode

log = logging.getLogger(__name__)


class KeyedGumbelProcessor:
    """A transformers logits processor for keyed sampling with ``generate(do_sample=False)``:
    temperature, top-p (as ``TopPLogitsWarper``), then keyed Gumbel noise, so that greedy decoding
    picks a token distributed as the warped softmax. Runs after generate's own processors (the
    min-new-tokens EOS ban). ``width``: the prompt width (position 0 is the first new token)."""

    def __init__(self, keys: torch.Tensor, width: int, temperature: float, top_p: float) -> None:
        self.keys, self.width, self.temperature, self.top_p = keys, width, temperature, top_p

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        from dapo_exp.keyed import gumbel
        from dapo_exp.rollout.hf.static_decode import warp

        scores = warp(scores, self.temperature, self.top_p)
        return scores + gumbel(self.keys, input_ids.shape[1] - self.width, scores.shape[-1])


class HFEngine:
    def __init__(self, model: torch.nn.Module, tokenizer, gen_batch_size: int = 256, decode: str = "generate") -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.gen_batch_size = gen_batch_size
        self.eos_ids = self._eos_ids(model, tokenizer)
        self.decode_used = resolve_decode(decode, next(model.parameters()).device)
        self._decoder: StaticDecoder | FusedDecoder | None = None
        if self.decode_used != "generate":
            fused = self.decode_used == "fused"
            reason = (FusedDecoder if fused else StaticDecoder).fallback_reason(model)
            if reason is not None:
                self._fall_back(reason)
            else:
                self._decoder = (FusedDecoder(model) if fused
                                 else StaticDecoder(model, compiled=self.decode_used == "compiled"))

    def _fall_back(self, reason: str) -> None:
        log.warning("rollout.decode=%s: falling back to transformers generate: %s", self.decode_used, reason)
        self.decode_used = "generate"
        self._decoder = None

    def _sample_chunk(self, ids: torch.Tensor, att: torch.Tensor, spec: SamplingSpec, seed: int,
                      keys: torch.Tensor | None = None) -> torch.Tensor:
        """New tokens of one left-padded chunk ``[rows, <= max_new_tokens]``, pad after EOS
        (``keys``: the rows' keys for keyed sampling; None: the torch stream seeded with ``seed``)."""
        pad = self.tokenizer.pad_token_id
        if spec.greedy:  # argmax at every token: transformers' own greedy search, whatever rollout.decode picked
            return self._greedy_search(ids, att, spec)
        if self._decoder is not None:
            if keys is None:
                torch.manual_seed(seed)
            try:
                return self._decoder.decode(ids, att, max_new_tokens=spec.max_new_tokens, temperature=spec.temperature,
                                            top_p=spec.top_p, pad=pad, eos_ids=self.eos_ids,
                                            min_new_tokens=self.model.generation_config.min_new_tokens or 0,
                                            **({"keys": keys} if keys is not None else {}))
            except Exception as e:  # noqa: BLE001 - e.g. inductor without a C++ compiler; eager still works
                if not self._decoder.compiled or isinstance(e, torch.OutOfMemoryError):
                    raise  # a bug of the loop itself, or memory that generate would lack too
                self._fall_back(f"the compiled decode step failed: {type(e).__name__}: {str(e)[:300]}")
        if keys is not None:
            return self._greedy_search(ids, att, spec, KeyedGumbelProcessor(keys, ids.shape[1], spec.temperature,
                                                                            spec.top_p))
        torch.manual_seed(seed)
        out = self.model.generate(
            input_ids=ids,
            attention_mask=att,
            do_sample=True,
            temperature=spec.temperature,
            top_p=spec.top_p,
            top_k=0,  # no top-k truncation (transformers defaults to 50)
            max_new_tokens=spec.max_new_tokens,
            pad_token_id=pad,
            eos_token_id=sorted(self.eos_ids),
        )
        return out[:, ids.shape[1]:]

    def _greedy_search(self, ids: torch.Tensor, att: torch.Tensor, spec: SamplingSpec,
                       processor: KeyedGumbelProcessor | None = None) -> torch.Tensor:
        """New tokens of one chunk by transformers' greedy search (argmax at every step): of the raw scores (a greedy
        response), or of ``processor``'s (keyed sampling: the warped scores plus keyed Gumbel noise)."""
        from transformers import LogitsProcessorList

        extra = {} if processor is None else {"logits_processor": LogitsProcessorList([processor])}
        out = self.model.generate(
            input_ids=ids, attention_mask=att, do_sample=False, temperature=1.0, top_p=1.0, top_k=None,
            max_new_tokens=spec.max_new_tokens, pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=sorted(self.eos_ids), **extra,
        )
        return out[:, ids.shape[1]:]

    @staticmethod
    def _eos_ids(model, tokenizer) -> set[int]:
        ids = model.generation_config.eos_token_id
        ids = list(ids) if isinstance(ids, (list, tuple)) else [ids]  # a copy: never edit the model's config
        if tokenizer.eos_token_id is not None:
            ids.append(tokenizer.eos_token_id)
        return {int(i) for i in ids if i is not None}

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], spec: SamplingSpec) -> Generations:
        """Sample ``spec.n`` responses per prompt; group-major output."""
        device = next(self.model.parameters()).device
        pad = self.tokenizer.pad_token_id
        flat = [p for p in prompt_ids for _ in range(spec.n)]  # group-major
        all_keys = None
        if spec.keys is not None and not spec.greedy:
            from dapo_exp.keyed import keys_tensor, row_keys

            if len(spec.keys) != len(prompt_ids):
                raise ValueError(f"SamplingSpec.keys has {len(spec.keys)} keys for {len(prompt_ids)} prompts")
            all_keys = keys_tensor(row_keys(spec.keys, spec.n), device)
        responses: list[list[int]] = []
        truncated: list[bool] = []
        was_training = self.model.training
        self.model.eval()
        t0 = time.perf_counter()
        for c, start in enumerate(range(0, len(flat), self.gen_batch_size)):
            chunk = flat[start : start + self.gen_batch_size]
            ids, att = pad_rows(chunk, pad, left=True)
            keys = None if all_keys is None else all_keys[start : start + self.gen_batch_size]
            new = self._sample_chunk(ids.to(device), att.to(device), spec, spec.seed * 1_000_003 + c, keys)
            for row in new.tolist():
                cut = next((j for j, t in enumerate(row) if t in self.eos_ids), None)
                if cut is None:
                    responses.append(row[: spec.max_new_tokens])
                    truncated.append(True)
                else:
                    responses.append(row[: cut + 1])
                    truncated.append(False)
        if was_training:
            self.model.train()
        if isinstance(self._decoder, FusedDecoder):
            self._decoder.free()  # its weight copy is not kept through training
        secs = time.perf_counter() - t0
        n_tok = sum(len(r) for r in responses)
        return Generations(responses, truncated, None, {"gen_tokens": n_tok, "gen_seconds": secs})

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Nothing to do: the engine samples from the trainer's module itself."""

    def sleep(self) -> None:
        """Nothing freed: the model is the trainer's, and the static loop keeps its last caches
        (at most ``KEEP_CACHES``) on purpose: new cache tensors would make CUDA graphs re-record."""

    def wake(self) -> None:
        """See :meth:`sleep`."""

    def close(self) -> None:
        """The model belongs to the trainer; a compiled decode step's graphs (and CUDA graph
        memory) are dropped, so that the next run of a sweep in this process compiles afresh
        instead of piling up compiled entries (dynamo's recompile limit) for dead models."""
        if self._decoder is not None:
            self._decoder.free()
            if self._decoder.compiled:
                torch._dynamo.reset()
        self._decoder = None
