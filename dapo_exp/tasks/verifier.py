"""The verifier interface shared by every task: response text -> correct or not.

``get_verifier(name, timeout_s)`` returns an object with ``verify(response, answer)``
and ``verify_batch(responses, answers)``, both giving :class:`VerifyResult`. The reward
of a response is +1 if correct, -1 otherwise (:func:`reward_of`, the paper's rule).

Three verifiers (``task.verifier``), which differ only in where they find the one final answer or
how they compare it:

- ``math_dapo`` (default, the paper's): the last ``Answer:`` match in the last 300
  characters of the response, Minerva-normalised, exact string match with the
  normalised ground truth. See :mod:`dapo_exp.tasks.math_dapo`.
- ``answer_or_boxed``: ``math_dapo``, and where a response has no ``Answer:`` line, its last
  ``\\boxed{}`` (braces matched) in the same tail, normalised and compared the same way.
- ``math_verify``: the same extracted answer, compared by symbolic equivalence with
  HF's ``math-verify`` (``1/2`` = ``\\frac{1}{2}`` = ``0.5``). Everything ``math_dapo``
  accepts it accepts too, a relational hedge aside (equal normalised strings short-cut to correct). A response
  without an ``Answer:`` line is wrong under both (the template asks for one). Only that
  one final answer is compared, never a number pulled out of the raw text, so hedges
  (``7 or 8``, ``8, no wait, 7``, ``7e100``, ``\\frac{1}{2} or 3``) are wrong under both; an answer holding a
  relation that keeps one side (``8 \\approx 7``, ``8 ≈ 7``, ``7 \\equiv 8``, ``7 \\to 8``: the whole family,
  :data:`_HEDGE_COMMANDS` and :data:`_HEDGE_CHARS`) is wrong under ``math_verify``, while ``math_dapo`` keeps
  verl's string rule.

Model output is untrusted. The verifier never raises on any response content (a
``bytes``, ``None`` or megabyte string included), never evaluates code, and each item
returns within ``timeout_s``; an overrun counts as wrong with ``timed_out=True``.
How that is achieved:

- Fast path, in-process: the ``math_dapo`` rule reads at most 300 characters of the
  response and only runs regexes without nested quantifiers over them, so its cost is
  bounded whatever the content (see :mod:`~dapo_exp.tasks.math_dapo`); the ground
  truth takes this path only when it is at most :data:`MAX_INPROCESS_ANSWER_CHARS`
  long (longer ones go to a worker). ``math_verify`` also decides here without sympy
  when the normalised strings are equal or are both plain integers.
- Everything else (all ``math-verify`` parsing, which can hang or blow up on input such
  as ``10^10^10^10``) runs in a :class:`~dapo_exp.tasks.verify_pool.WorkerPool`: a few
  long-lived worker *subprocesses* (``subprocess.Popen`` of ``python -m
  dapo_exp.tasks.verify_pool``) speaking JSON lines. The parent enforces the limit by
  waiting on the pipes with a deadline per task and SIGKILLs and replaces only the
  worker that overran. Chosen over ``ProcessPoolExecutor`` because that cannot cancel a
  running task (killing one means breaking the whole pool), and over ``multiprocessing``
  because it refuses to start children inside daemonic processes, and ``fork``/``spawn``/
  ``forkserver`` would copy or re-import the trainer (CUDA state, torch threads,
  ``__main__``); ``signal.alarm`` is out since it works only in the main thread. The
  workers also cap their memory (``RLIMIT_AS``). See the module docstring there.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dapo_exp.registry import Registry
from dapo_exp.tasks import math_dapo
from dapo_exp.tasks.math_dapo import TAIL_CHARS

log = logging.getLogger(__name__)

# Ground truths up to this many characters are normalised in-process (their regex cost
# is then bounded too); longer ones, which no real data set has, go to a worker.
MAX_INPROCESS_ANSWER_CHARS = 1000
_PLAIN_INT = re.compile(r"[+-]?[0-9]{1,1000}", re.ASCII)


@dataclass
class VerifyResult:
    correct: bool
    pred: str | None  # the extracted, normalised answer (None: no answer found); used by maj@k
    timed_out: bool = False


def reward_of(result: VerifyResult) -> float:
    """+1 if correct, -1 otherwise (DAPO's rule-based reward)."""
    return 1.0 if result.correct else -1.0


def extract_last_answer(text: str, tail_chars: int | None = TAIL_CHARS) -> str | None:
    """The content of the last ``Answer:`` line within the last ``tail_chars`` characters
    (None: the whole text), stripped but not normalised; None if there is none or it is blank."""
    raw = math_dapo.last_answer_text(_as_text(text), tail_chars)
    if raw is None:
        return None
    return raw.strip() or None


def default_workers() -> int:
    """Worker processes used when none is asked for: half the CPUs, between 1 and 8."""
    return max(1, min(8, (os.cpu_count() or 2) // 2))


# --------------------------------------------------------------------------- #
# Scorers: (response text, ground truth) -> (correct, pred). Run in-process on  #
# the fast path and inside the pool's workers (which look them up by name).     #
# --------------------------------------------------------------------------- #
def _as_text(x: Any) -> str:
    """Untrusted input as ``str``: bytes decoded leniently, None as "", anything else ``str(x)``."""
    if isinstance(x, str):
        return x
    if x is None:
        return ""
    if isinstance(x, (bytes, bytearray)):
        return bytes(x).decode("utf-8", errors="replace")
    try:
        return str(x)
    except Exception:
        return ""


@functools.lru_cache(maxsize=8192)
def _normalized_truth(answer: str) -> str:
    # ground truths repeat G times per step (and across steps): normalise each once
    return math_dapo.normalize_final_answer(answer)


def _score_math_dapo(response: str, answer: str) -> tuple[bool, str | None]:
    pred = math_dapo.extract_pred(response)
    return (pred is not None and pred == _normalized_truth(answer)), pred


# Relations that math-verify (or the normalisation's split at "=") resolves by keeping one side
# (``8 \\approx 7`` and ``8 ≈ 7`` parse as 8, ``7 := 8`` normalises to 8): an answer holding one is a hedge, not a
# value, and is wrong under math_verify. The family, whole: approximately, similar, congruent, proportional,
# identical, defined as, maps to or implies, each as a LaTeX command and as a Unicode character. math_dapo keeps
# verl's rule (the paper's reward, compared with verl's function on 200k strings): ``7 := 8`` and
# ``7 \\equiv 8`` normalise to ``8`` there too.
_HEDGE_COMMANDS = (
    "approx", "approxeq", "thickapprox", "lessapprox", "gtrapprox",  # approximately
    "sim", "simeq", "thicksim", "backsim", "backsimeq", "eqsim", "nsim", "lesssim", "gtrsim",  # similar
    "cong", "ncong", "propto", "varpropto", "equiv", "asymp", "bumpeq", "Bumpeq",  # congruent, proportional
    "doteq", "doteqdot", "Doteq", "fallingdotseq", "risingdotseq", "circeq", "eqcirc", "triangleq",  # dotted, defined
    "coloneqq", "Coloneqq", "coloneq", "eqqcolon", "eqcolon",  # defined as
    "to", "mapsto", "longmapsto", "rightarrow", "Rightarrow", "longrightarrow", "Longrightarrow", "implies",
    "leftarrow", "Leftarrow", "gets", "longleftarrow", "Longleftarrow", "impliedby",  # maps to, implies
    "leftrightarrow", "Leftrightarrow", "longleftrightarrow", "Longleftrightarrow", "iff",
)
_HEDGE_CHARS = (
    "\u221d"  # ∝ proportional to
    "\u223b-\u223d"  # ∻ ∼ ∽ homothetic, tilde, reversed tilde
    "\u2241-\u225f"  # ≁ ≂ ≃ ≄ ≅ ... ≈ ≉ ≊ ≋ ≌ ≍ ≎ ≏ ≐ ... ≔ ≕ ... ≟ (≠, U+2260, is not a hedge)
    "\u2261-\u2263"  # ≡ ≢ ≣ identical to
    "\u2272-\u2275"  # ≲ ≳ ≴ ≵ less or greater than or equivalent to
    "\u22cd"  # ⋍ reversed tilde equals
    "\u2a66-\u2a78"  # ⩦ ... ⩰ ... ⩸ equals and tilde variants, ⩴ ::=
    "\u2053\u301c\uff5e"  # ⁓ swung dash, 〜 wave dash, ～ fullwidth tilde
    "\u2190-\u21ff\u27f0-\u27ff\u2900-\u297f"  # the arrows: → ⇒ ↦ ⟶ ⟹ ...
)
_ONE_SIDED_RELATIONS = re.compile(
    r"\\(?:" + "|".join(_HEDGE_COMMANDS) + r")(?![A-Za-z])|:=|=:|[" + _HEDGE_CHARS + "]")


def _braces_balanced(text: str) -> bool:
    """True if the unescaped ``{``/``}`` of ``text`` nest properly (so that ``\\boxed{text}``
    is one box: ``7}{8`` or ``7}\\boxed{8`` would otherwise close it early)."""
    depth = 0
    for m in re.finditer(r"\\.|[{}]", text, re.DOTALL):
        tok = m.group(0)
        if tok == "{":
            depth += 1
        elif tok == "}":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


def _math_verify_pred_text(answer_text: str) -> str | None:
    """The one final answer that ``math_verify`` compares: the raw ``Answer:`` capture,
    normalised as ``math_dapo`` normalises it (units, ``x =``, ``$``, ``\\boxed{}`` stripped),
    less one sentence-ending ``.``; None when it is empty or not a single expression."""
    if _ONE_SIDED_RELATIONS.search(answer_text):  # before the normalisation keeps the right of "="
        return None
    norm = math_dapo.normalize_final_answer(answer_text)
    if norm.endswith(".") and not norm.endswith(".."):
        norm = norm[:-1].rstrip()
    if not norm or not _braces_balanced(norm):
        return None
    return norm


def _score_math_verify(answer_text: str, answer: str) -> tuple[bool, str | None]:
    """Symbolic equivalence of an extracted answer (raw ``Answer:`` capture) and the ground truth.

    Runs only inside a worker (``math-verify``'s own signal-based timeouts are off; the
    pool's deadline replaces them). The ground truth is parsed as ``\\boxed{gt}``; the
    answer only as ``\\boxed{<math_dapo-normalised answer>}`` with LaTeX extraction alone,
    i.e. as the single final answer ``math_dapo`` would compare. There is deliberately no
    fallback to parsing the raw text: ``math-verify``'s free-text extraction pulls a number
    out of a hedge (``7 or 8`` -> 8, ``8, no wait, 7`` -> 7, ``7e100`` -> 7), which would
    reward the hedge. Answers that are not one expression (unbalanced braces, ``\\approx``)
    are wrong.
    """
    from math_verify import LatexExtractionConfig, parse, verify

    gold = parse("\\boxed{" + answer + "}", parsing_timeout=None) or parse(answer, parsing_timeout=None)
    if not gold:
        return False, None
    norm = _math_verify_pred_text(answer_text)
    if norm is None:
        return False, None
    pred = parse("\\boxed{" + norm + "}", extraction_config=[LatexExtractionConfig()], parsing_timeout=None)
    return bool(pred and verify(gold, pred, timeout_seconds=None)), None


SCORERS: dict[str, Callable[[str, str], tuple[bool, str | None]]] = {
    "math_dapo": _score_math_dapo,
    "math_verify": _score_math_verify,
}


def preload_scorer(kind: str) -> None:
    """Import what scorer ``kind`` needs (workers call this before reporting ready)."""
    if kind == "math_verify":
        import logging as _logging

        import math_verify  # noqa: F401

        _logging.getLogger("math_verify").setLevel(_logging.ERROR)
        # warm sympy/antlr so that the first real task is not charged the first-call cost
        _score_math_verify("1/2", "\\frac{1}{2}")


# --------------------------------------------------------------------------- #
# Verifiers                                                                      #
# --------------------------------------------------------------------------- #
class _Verifier:
    """Shared plumbing: coercion, the worker pool (started lazily), batching."""

    name = ""
    _preload: tuple[str, ...] = ()

    def __init__(self, timeout_s: float = 5.0, workers: int | None = None) -> None:
        if not timeout_s > 0:
            raise ValueError(f"task.verifier_timeout_s must be > 0, got {timeout_s}")
        if workers is not None and workers < 1:
            raise ValueError(f"task.verifier_workers must be >= 1 or null (auto), got {workers}")
        self.timeout_s = float(timeout_s)
        self.workers = workers or default_workers()
        self._pool = None

    @property
    def pool(self):
        if self._pool is None:
            from dapo_exp.tasks.verify_pool import WorkerPool

            self._pool = WorkerPool(self.workers, preload=self._preload)
        return self._pool

    def warmup(self) -> None:
        """Start the worker processes now rather than on the first slow item."""
        self.pool.start()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def verify(self, response: Any, answer: Any) -> VerifyResult:
        """Score one response against one ground truth (never raises on content)."""
        return self.verify_batch([response], [answer])[0]

    def verify_batch(self, responses: Sequence[Any], answers: Sequence[Any]) -> list[VerifyResult]:
        """Score ``responses[i]`` against ``answers[i]``; one :class:`VerifyResult` each, in order.

        Raises only on caller error (lengths differ), never on content.
        """
        if len(responses) != len(answers):
            raise ValueError(f"verify_batch: {len(responses)} responses but {len(answers)} answers")
        out: list[VerifyResult | None] = [None] * len(responses)
        slow: list[tuple[int, tuple[str, str, str], str | None]] = []  # (index, task, pred)
        for i, (resp, ans) in enumerate(zip(responses, answers)):
            try:
                tail = _as_text(resp)[-TAIL_CHARS:]
                truth = _as_text(ans)
                res = self._fast(tail, truth)
                if isinstance(res, VerifyResult):
                    out[i] = res
                else:
                    task, pred = res
                    slow.append((i, task, pred))
            except Exception as exc:  # cannot happen on str input; belt and braces
                log.warning("verifier: item %d scored wrong after %s", i, type(exc).__name__)
                out[i] = VerifyResult(False, None)
        if slow:
            # identical (kind, answer, truth) tasks are scored once per batch
            unique: dict[tuple[str, str, str], int] = {}
            for _, task, _ in slow:
                unique.setdefault(task, len(unique))
            results = self.pool.run(list(unique), self.timeout_s)
            n_timeouts = 0
            for i, task, pred in slow:
                r = results[unique[task]]
                n_timeouts += r.timed_out
                out[i] = VerifyResult(bool(r.correct), pred if pred is not None else r.pred, bool(r.timed_out))
            if n_timeouts:
                log.warning("verifier %s: %d item(s) timed out after %.1f s (scored wrong)", self.name, n_timeouts,
                            self.timeout_s)
        return out  # type: ignore[return-value]

    def _fast(self, tail: str, truth: str) -> VerifyResult | tuple[tuple[str, str, str], str | None]:
        """A result when it can be decided in bounded time here, else (worker task, pred)."""
        raise NotImplementedError


class MathDapoVerifier(_Verifier):
    """The paper's ``math_dapo`` reward (see :mod:`dapo_exp.tasks.math_dapo`)."""

    name = "math_dapo"

    def _fast(self, tail, truth):
        if len(truth) <= MAX_INPROCESS_ANSWER_CHARS:
            return VerifyResult(*_score_math_dapo(tail, truth))
        return ("math_dapo", tail, truth), None


class MathVerifyVerifier(_Verifier):
    """The paper's answer extraction, compared by symbolic equivalence (``math-verify``)."""

    name = "math_verify"
    _preload = ("math_verify",)

    def __init__(self, timeout_s: float = 5.0, workers: int | None = None) -> None:
        import importlib.util

        if importlib.util.find_spec("math_verify") is None:
            raise ImportError(
                "task.verifier=math_verify needs the math-verify package: pip install 'math-verify>=0.7' "
                "(or pip install -e '.[math]'); or use task.verifier=math_dapo"
            )
        super().__init__(timeout_s, workers)

    def _fast(self, tail, truth):
        raw = math_dapo.last_answer_text(tail)
        if raw is None or _ONE_SIDED_RELATIONS.search(raw):  # a hedge: wrong, as _math_verify_pred_text says
            return VerifyResult(False, None)
        pred = math_dapo.normalize_final_answer(raw) or None
        if pred is None:
            return VerifyResult(False, None)
        if len(truth) <= MAX_INPROCESS_ANSWER_CHARS:
            gt = _normalized_truth(truth)
            if pred == gt:
                return VerifyResult(True, pred)
            if _PLAIN_INT.fullmatch(pred) and _PLAIN_INT.fullmatch(gt):
                return VerifyResult(int(pred) == int(gt), pred)
        return ("math_verify", raw, truth), pred


class AnswerOrBoxedVerifier(MathDapoVerifier):
    """``math_dapo``'s rule, and where a response has no ``Answer:`` line, its last ``\\boxed{}`` in the same
    tail, normalised and compared the same way (instruct models trained on MATH-style data box their answers)."""

    name = "answer_or_boxed"

    def _fast(self, tail, truth):
        if math_dapo.last_answer_text(tail) is None and (boxed := math_dapo.last_boxed_text(tail)) is not None:
            tail = f"Answer: {boxed}" if "\n" not in boxed else tail  # a box spanning lines is no answer line
        return super()._fast(tail, truth)


# task.verifier -> verifier class (a new one: subclass _Verifier, register it here)
VERIFIERS: Registry = Registry("verifier", "task.verifier")
VERIFIERS.register("math_dapo", MathDapoVerifier)
VERIFIERS.register("answer_or_boxed", AnswerOrBoxedVerifier)
VERIFIERS.register("math_verify", MathVerifyVerifier)


def get_verifier(name: str, timeout_s: float = 5.0, workers: int | None = None) -> _Verifier:
    """The verifier called ``name`` (``task.verifier``): ``math_dapo`` or ``math_verify``.

    ``timeout_s`` bounds each item that goes to a worker process (``task.verifier_timeout_s``);
    ``workers`` is the number of worker processes (``task.verifier_workers``; None: half
    the CPUs, 1 to 8), started on first need.
    """
    return VERIFIERS.pick(name)(timeout_s, workers)
