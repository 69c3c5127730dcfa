"""What a task is: problems (train and held-out eval), prompt rendering, and a verifier.

Every task, the toy ``arith`` and the real math sets alike, yields :class:`Problem`
rows and scores responses through the same :class:`~dapo_exp.tasks.verifier.Verifier`
interface (extract the answer, normalise, compare), with the paper's rewards
+1 (correct) / -1 (wrong).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Problem:
    id: str  # stable id (used to pair eval samples across runs)
    prompt: str  # the user-message text (already templated for math tasks)
    answer: str  # ground truth, as a string
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class TaskData:
    """A task's problems. ``stats`` counts rows skipped or deduplicated while loading."""

    name: str
    train: list[Problem]
    eval: list[Problem]
    stats: dict[str, int] = field(default_factory=dict)


def render_prompt(problem_text: str, tokenizer: Any, use_chat_template: bool) -> list[int]:
    """Token ids of a prompt: through the tokenizer's chat template when it has one
    and ``use_chat_template`` is set, else the raw text after the BOS token (if the
    tokenizer has one; the chat template adds its own)."""
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        out = tokenizer.apply_chat_template(
            [{"role": "user", "content": problem_text}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(out, dict) or hasattr(out, "input_ids"):  # BatchEncoding in newer transformers
            out = out["input_ids"]
        return list(out)
    ids = list(tokenizer(problem_text, add_special_tokens=False)["input_ids"])
    if tokenizer.bos_token_id is not None:
        ids = [tokenizer.bos_token_id] + ids
    return ids
