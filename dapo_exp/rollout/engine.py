"""The rollout engine interface: prompts in, sampled responses out.

Engines (``hf``: transformers ``generate``; ``vllm``: vLLM's offline ``LLM``)
only *sample*. The log-probabilities the loss uses (the "old policy" ones) are
always recomputed by the trainer's forward pass (``dapo_exp.logprobs``), so both
engines feed the loss the same numbers. An engine may also return the
log-probabilities it sampled with (``sampled_logprobs``); the trainer uses them
only to measure the rollout-vs-trainer mismatch (and, optionally, truncated
importance sampling).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch


@dataclass
class SamplingSpec:
    """Sampling settings; the same config keys drive every engine."""

    n: int  # responses per prompt (the group size G)
    max_new_tokens: int  # L_max, the generation cap
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0  # base seed of this call; engines derive per-sequence seeds from it
    # keyed randomness (train.randomness=keyed, dapo_exp.keyed): one key per prompt; sample j of
    # prompt i draws from the key derive(SAMPLE, keys[i], j) alone (HF: per token; vLLM: a per-request
    # seed). None: the engine's seeded stream from ``seed``
    keys: list[int] | None = None
    # greedy decoding (argmax at every token; temperature, top-p, seed and keys are not read): ReMax's baseline
    # response (dapo_exp.fixes.remax)
    greedy: bool = False


@dataclass
class Generations:
    """``len(prompts) * n`` responses, group-major: response ``j`` of prompt ``i`` is row ``i * n + j``."""

    response_ids: list[list[int]]  # sampled tokens, EOS included when emitted, no padding
    truncated: list[bool]  # True when the cap was hit without EOS
    sampled_logprobs: list[list[float]] | None = None  # engine's log-prob of each sampled token
    stats: dict[str, float] = field(default_factory=dict)  # e.g. gen tokens/s

    @property
    def lengths(self) -> list[int]:
        return [len(r) for r in self.response_ids]


class RolloutEngine(Protocol):
    """What the trainer needs of an engine."""

    def generate(self, prompt_ids: list[list[int]], spec: SamplingSpec) -> Generations:
        """Sample ``spec.n`` responses for each prompt (token ids, no padding)."""
        ...

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Make the engine sample from ``model``'s current weights (after each optimizer step)."""
        ...

    def sleep(self) -> None:
        """Free accelerator memory during training (no-op where not applicable)."""
        ...

    def wake(self) -> None:
        """Undo :meth:`sleep` before generating."""
        ...

    def close(self) -> None:
        """Release the engine's memory (end of a run; the next job of a sweep may share the process)."""
        ...
