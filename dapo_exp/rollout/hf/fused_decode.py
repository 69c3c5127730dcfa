"""A hand-fused decode step for Llama-family decoders (``rollout.decode=fused``).

At a small model's size a decode step is bound by per-op and per-module overhead, not by
arithmetic: transformers ``generate`` spends most of a step in Python (module calls, mask
building, a growing ``DynamicCache`` concatenated every token), and on CPU a
``torch.compile``-d step (:mod:`dapo_exp.rollout.hf.static_decode`) does not remove it (the
benchmark figures: docs/results/benchmarks.md). :class:`FusedDecoder` runs the one-token step of a Llama / Qwen2 decoder as
a short straight-line sequence of tensor ops on the model's own weights:

- q, k and v come from one matmul (their weights concatenated), gate and up from another;
- the KV cache is preallocated for ``prompt width + max new tokens`` and written in place;
- attention over the cache is two batched matmuls and a softmax, with an additive mask for the
  left padding (the causal mask is implicit: unwritten positions are never read);
- RMSNorm, RoPE (the model's own ``rotary_emb`` module, so every RoPE scaling type is the
  model's), SiLU and the residuals follow transformers' Llama/Qwen2 code op for op.

The prompt is prefilled by the model's own forward (``logits_to_keep=1``), once per distinct
row (a group's G rows repeat one prompt), whose cache is then copied into the preallocated one
for every row; RoPE's cos / sin come from one call of the model's rotary module over every
position the loop will feed (per step for the ``dynamic`` and ``longrope`` types, whose
frequencies depend on the length seen so far). Sampling is :func:`~dapo_exp.rollout.hf.static_decode.sample_next`,
transformers' sampling op for op. So for a fixed seed ``fused`` draws the samples ``generate``
draws, up to float rounding (identical rows on the toy; tests/test_fused_decode.py checks it).

The fused weights are built once per rollout (a copy of the decoder's matrices, dropped when the
rollout ends; rebuilt whenever a parameter has changed, e.g. by an optimizer step).

Only families whose decoder layer is exactly Llama's are fused (``model_type`` llama or qwen2,
no sliding window, SiLU MLP, no q/k norms, no tensor-parallel pretraining split);
:meth:`FusedDecoder.fallback_reason` names what else a model has, and the engine falls back
to ``generate`` with that reason logged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from dapo_exp.logprobs import cache_kv, full_attention_only
from dapo_exp.rollout.hf.static_decode import generation_config_issue, sampling_loop

FUSED_FAMILIES = ("llama", "qwen2")


@dataclass
class _Layer:
    ln1: Tensor
    ln2: Tensor
    eps1: float
    eps2: float
    wqkv: Tensor  # [hidden, (H + 2 KV) * D]
    bqkv: Tensor | None
    wo: Tensor  # [H * D, hidden]
    bo: Tensor | None
    wgu: Tensor  # [hidden, 2 * intermediate]
    bgu: Tensor | None
    wd: Tensor  # [intermediate, hidden]
    bd: Tensor | None


@dataclass
class _State:
    """One batch's decode state: fused weights, the preallocated cache, the padding mask."""

    layers: list[_Layer]
    keys: list[Tensor]  # per layer [rows, KV, capacity, D]
    values: list[Tensor]
    mask: Tensor  # [rows, 1, 1, capacity]: -inf at left padding
    pos: Tensor  # [rows, 1]: the position of the last token fed
    length: int  # positions written
    rope: tuple[Tensor, Tensor] | None  # cos, sin [1, positions, D] of every position, or None: per step


def _rms(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """transformers' LlamaRMSNorm / Qwen2RMSNorm, op for op."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def _rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """transformers' ``apply_rotary_pos_emb`` for one tensor: ``x * cos + rotate_half(x) * sin``."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _cat_bias(*linears: torch.nn.Linear) -> Tensor | None:
    biases = [lin.bias for lin in linears]
    if all(b is None for b in biases):
        return None
    return torch.cat([b if b is not None else lin.weight.new_zeros(lin.out_features) for b, lin in zip(biases, linears)])


def _linear(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    return torch.addmm(b, x, w) if b is not None else x @ w


class FusedDecoder:
    """The fused one-token decode loop over ``model`` (see the module docstring)."""

    compiled = False  # (the engine's fallback logic asks)

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        dec = model.get_decoder()
        attn = dec.layers[0].self_attn
        cfg = model.config
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        self._fused: tuple[tuple, list[_Layer]] | None = None

    @staticmethod
    def fallback_reason(model: torch.nn.Module) -> str | None:
        """Why this model cannot use the fused loop (None: it can)."""
        cfg = getattr(model, "config", None)
        kind = getattr(cfg, "model_type", None)
        if kind not in FUSED_FAMILIES:
            return f"model_type {kind!r} is not one of the fused families ({', '.join(FUSED_FAMILIES)})"
        own = f"transformers.models.{kind}.modeling_{kind}"
        if type(model).__module__ != own:  # e.g. remote code that declares the family with its own layer
            return f"{type(model).__module__}.{type(model).__name__} is not transformers' own {kind} implementation"
        if getattr(cfg, "hidden_act", "silu") != "silu":
            return f"hidden_act={cfg.hidden_act!r} (the fused MLP is SiLU-gated)"
        if getattr(cfg, "pretraining_tp", 1) not in (None, 1):
            return f"pretraining_tp={cfg.pretraining_tp} (a split projection the fused step does not do)"
        if not full_attention_only(cfg):
            return "sliding-window attention layers"
        try:
            dec = model.get_decoder()
            layers = list(dec.layers)
            for name in ("embed_tokens", "norm", "rotary_emb"):
                getattr(dec, name)
            for layer in layers:
                if type(layer).__module__ != own:
                    return f"decoder layer {type(layer).__module__}.{type(layer).__name__} is not transformers' own"
                a, m = layer.self_attn, layer.mlp
                for name in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling"):
                    getattr(a, name)
                for name in ("gate_proj", "up_proj", "down_proj"):
                    getattr(m, name)
                for norm in (layer.input_layernorm, layer.post_attention_layernorm):
                    norm.weight, norm.variance_epsilon  # noqa: B018 - the attributes the fused norm reads
                if hasattr(a, "q_norm") or hasattr(a, "k_norm"):
                    return "per-head q/k norms"
        except AttributeError as e:
            return f"the decoder lacks a Llama-layout part ({e})"
        if model.get_output_embeddings() is None:
            return "no output embedding"
        return generation_config_issue(model)

    def _layers(self) -> list[_Layer]:
        """The fused weights, rebuilt when any parameter changed since the last build (an optimizer
        step bumps every updated tensor's version), so a rollout's chunks share one build."""
        key = tuple((p.data_ptr(), p._version) for p in self.model.parameters())
        if self._fused is None or self._fused[0] != key:
            self._fused = (key, self._build_layers())
        return self._fused[1]

    def _build_layers(self) -> list[_Layer]:
        out = []
        for layer in self.model.get_decoder().layers:
            a, m = layer.self_attn, layer.mlp
            out.append(_Layer(
                ln1=layer.input_layernorm.weight, ln2=layer.post_attention_layernorm.weight,
                eps1=layer.input_layernorm.variance_epsilon, eps2=layer.post_attention_layernorm.variance_epsilon,
                wqkv=torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).t().contiguous(),
                bqkv=_cat_bias(a.q_proj, a.k_proj, a.v_proj),
                wo=a.o_proj.weight.t().contiguous(), bo=a.o_proj.bias,
                wgu=torch.cat([m.gate_proj.weight, m.up_proj.weight]).t().contiguous(),
                bgu=_cat_bias(m.gate_proj, m.up_proj),
                wd=m.down_proj.weight.t().contiguous(), bd=m.down_proj.bias,
            ))
        return out

    def free(self) -> None:
        """Drop the fused weights (the engine does after each rollout: a copy of the decoder's
        matrices is not kept through training)."""
        self._fused = None

    @torch.no_grad()
    def _prefill(self, ids: Tensor, att: Tensor, new_tokens: int) -> tuple[_State, Tensor]:
        """The model's own forward over the left-padded prompts; its cache copied into one with
        room for ``new_tokens`` more. Returns the state and the last position's logits."""
        from transformers import DynamicCache

        rows, width = ids.shape
        dec, layers = self.model.get_decoder(), self._layers()
        # a group's G rows repeat one prompt: each distinct row is prefilled once
        uniq, inverse = torch.unique(torch.cat([ids, att], dim=1), dim=0, return_inverse=True)
        u_ids, u_att = uniq[:, :width], uniq[:, width:]
        cache = DynamicCache()
        u_pos = (u_att.cumsum(-1) - 1).clamp(min=0)
        logits = self.model(input_ids=u_ids, attention_mask=u_att, position_ids=u_pos, past_key_values=cache,
                            use_cache=True, logits_to_keep=1).logits[:, -1].index_select(0, inverse)
        cap, dtype = width + new_tokens, layers[0].wqkv.dtype
        keys = [ids.new_empty((rows, self.kv_heads, cap, self.head_dim), dtype=dtype) for _ in layers]
        values = [torch.empty_like(k) for k in keys]
        for i, (k0, v0) in enumerate(cache_kv(cache)):
            keys[i][:, :, :width] = k0.index_select(0, inverse)
            values[i][:, :, :width] = v0.index_select(0, inverse)
        # left padding is never attended to; later positions are written before they are read
        mask = ids.new_zeros((rows, 1, 1, cap), dtype=dtype)
        mask[:, 0, 0, :width].masked_fill_(att == 0, float("-inf"))
        pos = u_pos[:, -1:].index_select(0, inverse)
        # cos / sin of every position the loop will feed, from the model's own rotary module
        # (one call; types whose frequencies depend on the length seen so far are called per step)
        table = None
        if getattr(dec.rotary_emb, "rope_type", "default") not in ("dynamic", "longrope"):
            x = dec.embed_tokens.weight[:1]
            table = dec.rotary_emb(x, torch.arange(int(pos.max()) + new_tokens + 1, device=ids.device)[None])
        return _State(layers, keys, values, mask, pos, width, table), logits

    @torch.no_grad()
    def _step(self, st: _State, tokens: Tensor) -> Tensor:
        """Feed one token per row (``[rows]``); the next-token logits ``[rows, vocab]``."""
        model, dec = self.model, self.model.get_decoder()
        rows = tokens.shape[0]
        H, KV, D = self.heads, self.kv_heads, self.head_dim
        G, hq, hk = H // KV, H * D, KV * D
        st.pos = st.pos + 1
        c = st.length  # the cache position this token's keys and values go to
        st.length += 1
        x = F.embedding(tokens, dec.embed_tokens.weight)  # [rows, hidden]
        if st.rope is None:
            cos, sin = dec.rotary_emb(x, st.pos)  # [rows, 1, D]
        else:
            cos, sin = (t[0].index_select(0, st.pos[:, 0])[:, None] for t in st.rope)
        for i, L in enumerate(st.layers):
            h = _rms(x, L.ln1, L.eps1)
            qkv = _linear(h, L.wqkv, L.bqkv)
            qk = _rope(qkv[:, : hq + hk].view(rows, H + KV, D), cos, sin)  # q and k rotated at once
            st.keys[i][:, :, c] = qk[:, H:]
            st.values[i][:, :, c] = qkv[:, hq + hk :].view(rows, KV, D)
            s = torch.matmul(qk[:, :H].view(rows, KV, G, D), st.keys[i][:, :, : c + 1].transpose(-1, -2))
            s = s * self.scaling + st.mask[..., : c + 1]
            a = torch.matmul(torch.softmax(s, dim=-1, dtype=torch.float32).to(s.dtype), st.values[i][:, :, : c + 1])
            x = x + _linear(a.reshape(rows, hq), L.wo, L.bo)
            h = _rms(x, L.ln2, L.eps2)
            gate, up = _linear(h, L.wgu, L.bgu).chunk(2, dim=-1)
            x = x + _linear(F.silu(gate) * up, L.wd, L.bd)
        x = _rms(x, dec.norm.weight, dec.norm.variance_epsilon)
        head = model.get_output_embeddings()
        return _linear(x, head.weight.t(), head.bias)

    def decode(self, ids: Tensor, att: Tensor, *, max_new_tokens: int, temperature: float, top_p: float, pad: int,
               eos_ids: set[int], min_new_tokens: int = 0, keys: Tensor | None = None) -> Tensor:
        """New tokens ``[rows, <= max_new_tokens]`` of a left-padded batch, ``pad`` after each row's EOS
        (``keys``: per-row keys of keyed sampling, :func:`~dapo_exp.rollout.hf.static_decode.sample_next`)."""
        st, logits = self._prefill(ids, att, max_new_tokens)
        finished = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
        return sampling_loop(logits, lambda t, nxt: self._step(st, nxt), finished, max_new_tokens=max_new_tokens,
                             temperature=temperature, top_p=top_p, pad=pad, eos_ids=eos_ids,
                             min_new_tokens=min_new_tokens, keys=keys)

    def teacher_forced_logits(self, ids: Tensor, att: Tensor, tokens: Tensor) -> Tensor:
        """Logits ``[rows, T, vocab]`` that score each of ``tokens`` ``[rows, T]``, feeding the tokens
        one step at a time (what the tests compare with the model's forward)."""
        st, logits = self._prefill(ids, att, tokens.shape[1])
        out = [logits]
        for t in range(tokens.shape[1] - 1):
            out.append(self._step(st, tokens[:, t]))
        return torch.stack(out, 1)
