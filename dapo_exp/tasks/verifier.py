"""The verifier interface shared by every task: response text -> correct or not.

``get_verifier(name, timeout_s)`` returns an object with
``verify_batch(responses, answers) -> list[VerifyResult]``. The reward of a
response is +1 if correct, -1 otherwise (the paper's).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass
class VerifyResult:
    correct: bool
    pred: str | None  # the extracted, normalised answer (None: no answer found); used by maj@k
    timed_out: bool = False


def reward_of(result: VerifyResult) -> float:
    """+1 if correct, -1 otherwise (DAPO's rule-based reward)."""
    return 1.0 if result.correct else -1.0


_ANSWER = re.compile(r"Answer\s*:\s*([^\n]*)", re.IGNORECASE)


def extract_last_answer(text: str) -> str | None:
    """The content of the last ``Answer:`` line, stripped, or None."""
    found = _ANSWER.findall(text)
    if not found:
        return None
    ans = found[-1].strip()
    return ans or None


class SimpleVerifier:
    """Last ``Answer:`` line, whitespace-stripped, exact string match."""

    def __init__(self, timeout_s: float = 5.0) -> None:
        self.timeout_s = timeout_s

    def verify(self, response: str, answer: str) -> VerifyResult:
        pred = extract_last_answer(response)
        return VerifyResult(correct=pred is not None and pred == answer.strip(), pred=pred)

    def verify_batch(self, responses: list[str], answers: list[str]) -> list[VerifyResult]:
        return [self.verify(r, a) for r, a in zip(responses, answers)]


def get_verifier(name: str, timeout_s: float = 5.0):
    """Return the verifier called ``name``."""
    if name in ("math_dapo", "simple"):
        return SimpleVerifier(timeout_s)
    raise ValueError(f"unknown verifier {name!r}; valid: math_dapo, math_verify")
