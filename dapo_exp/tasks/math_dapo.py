"""The DAPO paper's rule-based reward, ``math_dapo``: last ``Answer:`` line, normalised, exact match.

Reproduces the semantics of the reward published with the paper's code, verl's
``verl/utils/reward_score/math_dapo.py`` (``compute_score`` with the default
``strict_box_verify=False``, i.e. its ``is_correct_minerva`` path), which adapts the
Minerva answer normalisation of lm-evaluation-harness (``hendrycks_math/utils.py``).
This is an independent re-implementation of that behaviour, not a copy:

1. Only the last :data:`TAIL_CHARS` = 300 characters of the response are read (verl:
   "the longest answer in MATH-500 has 159 characters"). This also bounds the work.
2. The answer is the capture of the *last* match of ``(?i)Answer\\s*:\\s*([^\\n]+)`` in that
   tail (case-insensitive; ``\\s*`` may cross a newline, the capture stops at one).
   No match: no answer (verl scores its placeholder ``"[INVALID]"``, which is wrong).
3. Both the answer and the ground truth go through :func:`normalize_final_answer`.
4. Correct iff the two normalised strings are equal; reward +1 if correct, else -1.

Deviation (on purpose, documented): an answer that normalises to the empty string is
"no answer" here and never correct (verl would match it against an empty ground
truth; the loaders in :mod:`dapo_exp.tasks.math_data` never produce one).

Cost bound (why this runs in-process, see :mod:`dapo_exp.tasks.verifier`): every regex
below is applied to at most ``TAIL_CHARS`` characters of model output (and to the ground
truth, whose length the verifier caps before taking this path). None of them nests
quantifiers, so the worst case is quadratic in the input length: about 10^5 regex steps
for 300 characters, i.e. well under a millisecond, for any content. The substitutions
never more than double the string. Nothing here evaluates or parses mathematics.
"""

from __future__ import annotations

import re

# Characters of the response the reward reads, counted from its end (verl: 300).
TAIL_CHARS = 300

# The answer pattern of the paper's template ("The last line of your response should be
# of the form Answer: $Answer"), case-insensitive.
ANSWER_PATTERN = re.compile(r"Answer\s*:\s*([^\n]+)", re.IGNORECASE)

# Literal replacements, applied in this order (the order matters: "an " before "a ",
# spaces are gone before ",\text{and}" is looked for). Same list as the reference.
_REPLACEMENTS: tuple[tuple[str, str], ...] = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)

# Literal substrings deleted, in this order: units and filler words, empty or unit
# \text{} groups, degree signs, TeX spacing and thousands separators, dots, quotes.
_DELETIONS: tuple[str, ...] = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    '"',
    "\\dots",
)

# A line holding two or more `$` becomes `$<text between its first two $>$`
# (text before the first and after the second `$` on that line is dropped).
_FIRST_INLINE_MATH = re.compile(r"[^\n]*?\$([^\n]*?)\$[^\n]*")
# Unwrap \text{x}, \textbf{x}, \overline{x} (up to the first `}`), then \boxed{x} (up
# to the last `}` of the line), in this order.
_UNWRAP_LAZY = tuple(re.compile(r"\\" + cmd + r"\{([^\n]*?)\}") for cmd in ("text", "textbf", "overline"))
_UNWRAP_BOXED = re.compile(r"\\boxed\{([^\n]*)\}")
# Shorthand TeX: \frac12 -> \frac{1}{2}, \fracab c -> ..., \sqrt2 -> \sqrt{2}.
_FRAC_SHORTHAND = re.compile(r"frac([^{])([^\n])")
_SQRT_SHORTHAND = re.compile(r"sqrt([^{])")


def normalize_final_answer(final_answer: str) -> str:
    """Minerva-style normalisation of a final answer, as the DAPO reward applies it.

    In order: keep the text after the last ``=`` (so ``x = 5`` -> ``5``); literal
    replacements (articles, ``\\$``, all spaces, ``mbox`` -> ``text``, ``\\text{and}`` -> ``,``);
    deletion of units and filler (``dollars``, ``cm``, ``degrees``, ``^\\circ``, ``{,}``, ...);
    keep the first ``$...$`` span of each line; unwrap ``\\text{}``, ``\\textbf{}``,
    ``\\overline{}``, ``\\boxed{}``; expand ``\\frac12``/``\\sqrt2`` shorthand; drop ``$``;
    drop thousands commas when only digits remain (``1,000`` -> ``1000``); strip.

    Examples: ``"$\\boxed{1,000}$ dollars"`` -> ``"1000"``; ``"x = \\frac12"`` ->
    ``"\\frac{1}{2}"``; ``"90^\\circ"`` -> ``"90"``; ``"\\text{(B)}"`` -> ``"(B)"``.
    """
    s = final_answer.split("=")[-1]
    for old, new in _REPLACEMENTS:
        s = s.replace(old, new)
    for gone in _DELETIONS:
        s = s.replace(gone, "")
    s = _FIRST_INLINE_MATH.sub(r"$\1$", s)
    for pattern in _UNWRAP_LAZY:
        s = pattern.sub(r"\1", s)
    s = _UNWRAP_BOXED.sub(r"\1", s)
    s = _FRAC_SHORTHAND.sub(r"frac{\1}{\2}", s)
    s = _SQRT_SHORTHAND.sub(r"sqrt{\1}", s)
    s = s.replace("$", "")
    if s.replace(",", "").isdigit():
        s = s.replace(",", "")
    return s.strip()


def last_answer_text(response: str, tail_chars: int | None = TAIL_CHARS) -> str | None:
    """The raw capture of the last ``Answer: ...`` match in the response's tail, or None.

    ``tail_chars``: how many characters from the end are searched (None: all of it).
    """
    tail = response if tail_chars is None else response[-tail_chars:]
    matches = list(ANSWER_PATTERN.finditer(tail))
    return matches[-1].group(1) if matches else None


def last_boxed_text(response: str, tail_chars: int | None = TAIL_CHARS) -> str | None:
    """The content of the last ``\\boxed{...}`` in the response's tail, its braces matched (one pass, so the
    cost is linear in ``tail_chars``), or None: none, or one left open."""
    tail = response if tail_chars is None else response[-tail_chars:]
    start = tail.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(tail)):
        depth += {"{": 1, "}": -1}.get(tail[j], 0)
        if depth == 0:
            return tail[i:j]
    return None


def extract_pred(response: str) -> str | None:
    """The normalised prediction of a response under the paper's rule, or None (no answer)."""
    raw = last_answer_text(response)
    if raw is None:
        return None
    pred = normalize_final_answer(raw)
    return pred or None


def score(response: str, ground_truth: str) -> tuple[bool, str | None]:
    """``(correct, normalised prediction)`` of one response under the paper's ``math_dapo`` rule.

    Pure string work, no evaluation. Inputs must be ``str``; :mod:`~dapo_exp.tasks.verifier`
    coerces untrusted inputs and bounds their size before calling this.
    """
    pred = extract_pred(response)
    return (pred is not None and pred == normalize_final_answer(ground_truth)), pred
