"""Random-weight Qwen2 checkpoints (model + tokenizer) written to a directory, for engine tests and benchmarks.

vLLM loads models from an HF-format directory, tokenizer included; these are
built in code, so tests and benchmarks need no download. The tokenizer is the
tiny model's character vocabulary in the byte-level form that ``AutoTokenizer``
(vLLM, verl) rebuilds for a ``qwen2`` checkpoint
(:func:`dapo_exp.models.build_qwen_char_tokenizer`), padded with filler tokens up
to ``vocab_size``: id 0 is the pad ``<|endoftext|>``, id 3 the EOS ``<|im_end|>``,
characters start at :data:`FIRST_CHAR_ID` (a newline is one token), and the first
filler is ``<|im_start|>``, so Qwen's ChatML template (:data:`CHAT_TEMPLATE`) and
verl's Qwen turn handling work on them.

vLLM's CPU attention needs ``hidden_size / num_heads`` in {32, 64, 80, 96, 112, 128, ...}.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from dapo_exp.models import CHAR_SPECIALS, build_qwen_char_tokenizer

# the ids of dapo_exp.models.build_char_tokenizer (the tiny model's tokenizer, padded with fillers)
PAD_ID, EOS_ID = CHAR_SPECIALS.index("<pad>"), CHAR_SPECIALS.index("<eos>")
FIRST_CHAR_ID = len(CHAR_SPECIALS)


@dataclass(frozen=True)
class Qwen2Size:
    """Shape of a random Qwen2; ``head_dim = hidden_size // num_heads``."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False


# ~0.4M and ~21M parameters (head_dim 32 and 64: both run on vLLM's CPU kernels)
SIZES = {
    "0.4M": Qwen2Size(
        hidden_size=96, num_layers=2, num_heads=3, num_kv_heads=1, intermediate_size=256, vocab_size=1024
    ),
    "21M": Qwen2Size(
        hidden_size=512, num_layers=6, num_heads=8, num_kv_heads=2, intermediate_size=1376, vocab_size=4096
    ),
    # Qwen2.5-0.5B's shape (494M parameters with its tied embeddings), for GPU runs of the native trainer
    "0.5B": Qwen2Size(
        hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, intermediate_size=4864, vocab_size=151936,
        tie_word_embeddings=True,
    ),
}


# Qwen's ChatML template (its turns, without the system prompt), for engines that always render prompts as chat (verl)
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def save_random_qwen2(out_dir: str, size: Qwen2Size, seed: int = 0, dtype: str = "float32",
                      chat_template: bool = False):
    """Write a random ``Qwen2ForCausalLM`` and its tokenizer to ``out_dir``; return the model (eval mode).
    ``chat_template``: give the tokenizer :data:`CHAT_TEMPLATE`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=size.vocab_size,
        hidden_size=size.hidden_size,
        intermediate_size=size.intermediate_size,
        num_hidden_layers=size.num_layers,
        num_attention_heads=size.num_heads,
        num_key_value_heads=size.num_kv_heads,
        max_position_embeddings=1024,
        bos_token_id=None,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        tie_word_embeddings=size.tie_word_embeddings,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg).to(getattr(torch, dtype)).eval()
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    tok = build_qwen_char_tokenizer(size.vocab_size, CHAT_TEMPLATE if chat_template else None)
    tok.save_pretrained(out_dir)
    return model


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def main(argv: list[str] | None = None) -> None:
    """``python -m dapo_exp.benchmarks.random_models --out DIR [--size 21M] [--chat-template]``: a local
    model directory (no hub), e.g. for a two-step ``backend=verl`` check on a GPU (docs: explanation/verl-backend.md)."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", choices=sorted(SIZES), default="21M")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--chat-template", action="store_true")
    args = ap.parse_args(argv)
    model = save_random_qwen2(args.out, SIZES[args.size], dtype=args.dtype, chat_template=args.chat_template)
    print(f"wrote {args.out}: random Qwen2, {n_params(model) / 1e6:.1f}M parameters")


if __name__ == "__main__":
    main()
