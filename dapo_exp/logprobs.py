"""Per-token log-probabilities and entropy of response tokens, computed in chunks.

The naive way, ``log_softmax(model(x).logits.float())``, materialises a float32
``(B, L, V)`` tensor for the whole micro-batch (for Qwen2.5, V = 151,936: 2.4 GB
for 4 x 1024 tokens) and keeps it alive for backward. Here the decoder's hidden
states are projected to the vocabulary ``chunk`` positions at a time; with grad
enabled each chunk is recomputed in backward (activation checkpointing), so only
one chunk of logits exists at a time in either pass (a micro-batch whose logits take
at most ``CKPT_MIN_BYTES`` in all keeps them instead: recomputing costs more than they
take). The trainer projects only the response positions (``start``).

Padding: the trainer's rows are ``[left-padded prompt | right-padded response]``;
position ids are ``cumsum(attention_mask) - 1``, so every row gets positions 0, 1, ...
from its first real token
and the decoder gets the attention mask, so a row's real tokens never see its
padding. Outputs at padded positions are garbage; the caller's mask drops them.

``autocast_dtype=torch.bfloat16`` runs the decoder and the vocabulary projection
under ``torch.autocast`` (the way verl and TRL train; the one autocast path of the
project); the log-softmax, the gather and the entropy are always computed in float32.

:class:`ResponseForward` is what the trainer calls: it lays out ``[prompt | response]``
rows (:func:`rows_to_tensors`) and returns the response tokens' log-probs, entropy and mask.

Models whose ``forward`` post-processes logits (Gemma-2's final soft-capping,
Cohere's logit scale) are refused: this module projects hidden states with the
output embedding directly and would silently differ from ``model(x).logits``.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

# chunks are checkpointed (recomputed in backward) only when the micro-batch's float32 logits
# exceed this: 16 MiB is 512 positions x 8k vocabulary, or ~27 positions of Qwen2.5's 152k
CKPT_MIN_BYTES = 16 * 2**20


def _decoder_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    head = model.get_output_embeddings()
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    if head is None or decoder is None:
        raise TypeError(f"{type(model).__name__} exposes no decoder / output embeddings")
    config = getattr(model, "config", None)
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", 1.0) not in (None, 1.0):
        raise NotImplementedError(
            f"{type(model).__name__} post-processes its logits (soft-capping / logit scale); "
            "token_logprobs would differ from model(x).logits"
        )
    return decoder, head


def _autocast(device: torch.device, dtype: torch.dtype | None):
    return torch.autocast(device_type=device.type, dtype=dtype) if dtype is not None else nullcontext()


def _upcast(x: Tensor) -> Tensor:
    """At least float32 (float64 stays float64: the exactness tests run in it)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _chunk_stats(head: torch.nn.Module, h: Tensor, targets: Tensor, temperature: float, want_entropy: bool):
    logits = head(h)
    with torch.autocast(device_type=h.device.type, enabled=False):
        return _stats_from_logits(_upcast(logits), targets, temperature, want_entropy)


def _stats_from_logits(logits: Tensor, targets: Tensor, temperature: float, want_entropy: bool):
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if want_entropy:
        ent = -(logp_all.exp() * logp_all).sum(-1)
    else:
        ent = torch.zeros_like(logp)
    return logp, ent


def token_logprobs(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    chunk: int = 1024,
    with_entropy: bool = False,
    temperature: float = 1.0,
    autocast_dtype: torch.dtype | None = None,
    start: int = 0,
) -> tuple[Tensor, Tensor]:
    """Log-prob of each next token and the entropy of each next-token distribution.

    Args:
        model: a transformers causal LM (``get_decoder()`` and ``get_output_embeddings()``).
        input_ids, attention_mask: ``(B, L)`` ``prompt + response`` rows, padded on either side.
        chunk: positions projected to the vocabulary at a time.
        with_entropy: also compute the entropy (costs one more pass over each chunk's logits).
        temperature: divide logits by it (the sampling distribution's log-probs).
        autocast_dtype: run the decoder and the projection under autocast in this
            dtype (``torch.bfloat16``, ``torch.float16``); None = the model's own dtype.
        start: the first position to project to the vocabulary (the trainer passes the
            last prompt position: prompt tokens are never scored, so their logits are
            never computed).

    Returns:
        ``(logp, entropy)``, each ``(B, L - 1 - start)``: index ``i`` is position
        ``start + i``, which scores token ``start + i + 1``. ``entropy`` is zeros when
        ``with_entropy`` is False.

    Each chunk's projection is recomputed in backward (activation checkpointing) when the
    micro-batch's float32 logits would take more than :data:`CKPT_MIN_BYTES` in all; below
    that they are kept (at the toy's vocabulary the recomputation costs more than the memory
    it saves).
    """
    decoder, head = _decoder_and_head(model)
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    with _autocast(input_ids.device, autocast_dtype):
        out = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    hidden = out.last_hidden_state[:, start:-1]
    return _project(head, hidden, input_ids[:, start + 1 :], chunk, with_entropy, temperature, autocast_dtype)


def _project(head: torch.nn.Module, hidden: Tensor, targets: Tensor, chunk: int, with_entropy: bool,
             temperature: float, autocast_dtype: torch.dtype | None) -> tuple[Tensor, Tensor]:
    """Log-prob of ``targets`` and entropy from ``hidden`` (``(B, T, H)``), ``chunk`` positions at a time."""
    logps, ents = [], []
    grad = torch.is_grad_enabled() and hidden.requires_grad
    # all the micro-batch's float32 logits: small enough, and they are kept rather than recomputed
    use_ckpt = grad and hidden.shape[0] * hidden.shape[1] * head.weight.shape[0] * 4 > CKPT_MIN_BYTES
    for s in range(0, hidden.shape[1], chunk):
        h, tgt = hidden[:, s : s + chunk], targets[:, s : s + chunk]
        # checkpoint() records the autocast state and replays it in the recomputation
        with _autocast(hidden.device, autocast_dtype):
            if use_ckpt:
                lp, en = checkpoint(_chunk_stats, head, h, tgt, temperature, with_entropy, use_reentrant=False)
            else:
                lp, en = _chunk_stats(head, h, tgt, temperature, with_entropy)
        logps.append(lp)
        ents.append(en)
    return torch.cat(logps, dim=1), torch.cat(ents, dim=1)


# model families whose decoder takes a plain (full-attention) key/value cache in a training
# forward; others, and any model with sliding-window layers, score every row in full
SHARED_PROMPT_FAMILIES = ("llama", "qwen2", "qwen3")


def full_attention_only(model_config: Any) -> bool:
    """No sliding-window layers in a transformers config (``use_sliding_window``, ``layer_types``)."""
    return (not getattr(model_config, "use_sliding_window", False)
            and all(t == "full_attention" for t in getattr(model_config, "layer_types", None) or ()))


def can_share_prompts(model: torch.nn.Module) -> bool:
    """Whether :func:`shared_prompt_logprobs` applies to ``model``: transformers' own implementation
    of one of :data:`SHARED_PROMPT_FAMILIES` (not remote code that only declares the family), full
    attention only, no gradient checkpointing (which drops the cache in training), and no attention
    dropout in training (one draw per prompt instead of one per row would correlate a group's noise)."""
    cfg = getattr(model, "config", None)
    return (getattr(cfg, "model_type", None) in SHARED_PROMPT_FAMILIES
            and type(model).__module__.startswith("transformers.models.")
            and full_attention_only(cfg)
            and not getattr(model, "is_gradient_checkpointing", False)
            and not (model.training and (getattr(cfg, "attention_dropout", 0.0) or 0.0) > 0))


def cache_kv(cache) -> list[tuple[Tensor, Tensor]]:
    """Each layer's ``(keys, values)`` ``[B, KV heads, length, D]`` of a transformers ``DynamicCache``."""
    if hasattr(cache, "layers"):  # transformers >= 4.56
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


def shared_prompt_logprobs(
    model: torch.nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    row_prompt: Tensor,
    response_ids: Tensor,
    response_mask: Tensor,
    chunk: int = 1024,
    with_entropy: bool = False,
    temperature: float = 1.0,
    autocast_dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor]:
    """What :func:`token_logprobs` gives for the response positions, with each distinct prompt run
    through the decoder once instead of once per response.

    A group's G responses share their prompt; here the ``U`` distinct left-padded prompts
    (``prompt_ids``, ``prompt_mask``: ``(U, P)``) go through the decoder with a key/value cache,
    the cache rows are gathered for the ``B`` responses (``row_prompt``: ``(B,)``, each row's
    prompt index), and the right-padded responses (``(B, T)``) run on that cache. Gradients flow
    through the gathered cache back to the prompt forward, summed over a group, as they would from
    B separate prompt forwards. Positions, masks and the scored hidden states are those of
    :func:`token_logprobs`'s ``[prompt | response]`` rows, so the result is the same up to float
    rounding (tests/test_logprobs.py).

    Returns ``(logp, entropy)``, each ``(B, T)``: index ``t`` scores response token ``t``.
    """
    from transformers import DynamicCache

    decoder, head = _decoder_and_head(model)
    prompt_pos = (prompt_mask.long().cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    with _autocast(prompt_ids.device, autocast_dtype):
        out_p = decoder(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=prompt_pos,
                        past_key_values=cache, use_cache=True)
        rows = DynamicCache()
        for i, (k, v) in enumerate(cache_kv(cache)):
            rows.update(k.index_select(0, row_prompt), v.index_select(0, row_prompt), i)
        mask = torch.cat([prompt_mask.index_select(0, row_prompt), response_mask], dim=1)
        # positions continue from each prompt's real length (a response's padding comes after its
        # tokens and is never attended to by them)
        pos = prompt_mask.long().sum(-1).index_select(0, row_prompt)[:, None] + torch.arange(
            response_ids.shape[1], device=response_ids.device)
        out_r = decoder(input_ids=response_ids, attention_mask=mask, position_ids=pos, past_key_values=rows,
                        use_cache=True)
    # the prompt's last position scores response token 0; response position t scores token t + 1
    hidden = torch.cat([out_p.last_hidden_state[:, -1:].index_select(0, row_prompt),
                        out_r.last_hidden_state[:, :-1]], dim=1)
    return _project(head, hidden, response_ids, chunk, with_entropy, temperature, autocast_dtype)


def naive_token_logprobs(
    model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, temperature: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Reference implementation (full float32 logits); used by tests and benchmarks."""
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    logits = _upcast(logits[:, :-1]) / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1)
    return logp, ent


def pad_rows(seqs: list[list[int]], pad_id: int, *, left: bool, min_width: int = 0) -> tuple[Tensor, Tensor]:
    """Token lists as one ``(B, width)`` tensor padded on the ``left`` (prompts) or the right
    (responses) with ``pad_id``, and its 0/1 attention mask; ``width`` is the longest list (at
    least ``min_width``)."""
    width = max(min_width, max(len(x) for x in seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    att = torch.zeros_like(ids)
    for i, x in enumerate(seqs):
        if x:
            cols = slice(width - len(x), width) if left else slice(0, len(x))
            ids[i, cols] = torch.tensor(x, dtype=torch.long)
            att[i, cols] = 1
    return ids, att


def rows_to_tensors(
    prompts: list[list[int]], responses: list[list[int]], pad_id: int
) -> tuple[Tensor, Tensor, Tensor, int]:
    """``[left-padded prompt | right-padded response]`` rows.

    Returns ``(input_ids (B, P+T), attention_mask, response_mask (B, T), P)``;
    the response token ``t`` of row ``b`` sits at column ``P + t``, so its
    log-prob is at index ``P - 1 + t`` of :func:`token_logprobs`.
    """
    p_ids, p_att = pad_rows(prompts, pad_id, left=True)
    r_ids, r_att = pad_rows(responses, pad_id, left=False, min_width=1)
    return torch.cat([p_ids, r_ids], 1), torch.cat([p_att, r_att], 1), r_att.float(), p_ids.shape[1]


def shared_prompt_tensors(
    prompts: list[list[int]], responses: list[list[int]], pad_id: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The inputs of :func:`shared_prompt_logprobs`: the distinct prompts left-padded
    ``(U, P)`` with their mask, each row's prompt index ``(B,)``, the right-padded responses
    ``(B, T)`` with their attention mask, and the response mask (float, as :func:`rows_to_tensors`)."""
    index: dict[tuple[int, ...], int] = {}
    row_prompt = torch.tensor([index.setdefault(tuple(p), len(index)) for p in prompts], dtype=torch.long)
    p_ids, p_att = pad_rows([list(p) for p in index], pad_id, left=True)
    r_ids, r_att = pad_rows(responses, pad_id, left=False, min_width=1)
    return p_ids, p_att, row_prompt, r_ids, r_att, r_att.float()


@dataclass(frozen=True)
class ResponseForward:
    """How the trainer scores responses: padding id, device, chunk, temperature, autocast dtype,
    and whether responses that share a prompt share its forward (``share_prompts``,
    ``train.share_prompt_forward``: :func:`shared_prompt_logprobs`, for the families of
    :func:`can_share_prompts` when a micro-batch repeats a prompt).

    ``fwd(model, prompts, responses, with_entropy=...)`` returns
    ``(logp (B, T), entropy (B, T), response_mask (B, T))`` of the response tokens, float32,
    on ``device``; ``entropy`` is zeros unless ``with_entropy``.
    """

    pad_id: int
    device: torch.device
    chunk: int = 1024
    temperature: float = 1.0
    autocast_dtype: torch.dtype | None = None
    share_prompts: bool = False

    def __call__(
        self, model: torch.nn.Module, prompts: list[list[int]], responses: list[list[int]], *, with_entropy: bool = False
    ) -> tuple[Tensor, Tensor, Tensor]:
        opts = {"chunk": self.chunk, "with_entropy": with_entropy, "temperature": self.temperature,
                "autocast_dtype": self.autocast_dtype}
        # worth a second decoder call only when prompts repeat (a micro-batch of whole groups)
        if self.share_prompts and 2 * len({tuple(p) for p in prompts}) <= len(prompts) and can_share_prompts(model):
            p_ids, p_att, row_prompt, r_ids, r_att, rmask = shared_prompt_tensors(prompts, responses, self.pad_id)
            d = self.device
            logp, ent = shared_prompt_logprobs(model, p_ids.to(d), p_att.to(d), row_prompt.to(d), r_ids.to(d),
                                               r_att.to(d), **opts)
            return logp.float(), ent.float(), rmask.to(d)
        ids, att, rmask, width_p = rows_to_tensors(prompts, responses, self.pad_id)
        ids, att = ids.to(self.device), att.to(self.device)
        t = rmask.shape[1]
        logp, ent = token_logprobs(model, ids, att, start=width_p - 1, **opts)
        return logp[:, :t].float(), ent[:, :t].float(), rmask.to(self.device)
