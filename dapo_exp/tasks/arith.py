"""The embedded toy task ``arith``: integer arithmetic with a difficulty mix.

Problems are chains of ``task.arith_ops`` (default ``+``) over 2 to
``arith_n_operands_max`` operands in ``[0, arith_max_operand]``, evaluated left to
right, e.g. ``7+8+3``. Difficulty comes from the number of steps: ``3+4`` is
usually solved by the tiny warm-started policy, ``9+8+7+6`` less often, so a
training batch holds all-correct, all-wrong and mixed groups (the situation
Dynamic Sampling is about).

The prompt is the expression and a newline (the tiny model has no chat template);
a reference solution writes one step per line and ends with ``Answer: N``::

    7+8+3
    7+8=15
    15+3=18
    Answer: 18

Responses are scored by the same verifier interface as the real math tasks
(last ``Answer:`` line, normalised, compared), reward +1 / -1. The problem set
is generated from ``task.arith_seed`` alone, so every run of a sweep sees the
same train and held-out eval problems (the toy's "AIME").
"""

from __future__ import annotations

import random
import re
from typing import Any

from dapo_exp.tasks.base import Problem, TaskData


def _make_problem(
    rng: random.Random, max_operand: int, n_operands_max: int, ops_allowed: str = "+"
) -> tuple[str, int, list[str]]:
    """One problem: (expression, answer, solution step lines).

    Difficulty grows with the number of operands (each step is one more chance
    of an arithmetic slip for the tiny policy).
    """
    n_ops = rng.randint(2, max(2, n_operands_max))
    operands = [rng.randint(0, max_operand) for _ in range(n_ops)]
    ops = [rng.choice(ops_allowed) for _ in range(n_ops - 1)]
    expr = str(operands[0])
    value = operands[0]
    steps = []
    for op, x in zip(ops, operands[1:]):
        expr += f"{op}{x}"
        new = value + x if op == "+" else value - x
        steps.append(f"{value}{op}{x}={new}")
        value = new
    return expr, value, steps


def solution_text(steps: list[str], answer: int | str) -> str:
    """A reference solution: one step per line, then the ``Answer:`` line."""
    return "\n".join([*steps, f"Answer: {answer}"])


def generate_problems(
    seed: int, n: int, max_operand: int, n_operands_max: int, prefix: str, ops_allowed: str = "+"
) -> list[Problem]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        expr, ans, steps = _make_problem(rng, max_operand, n_operands_max, ops_allowed)
        out.append(Problem(id=f"{prefix}{i}", prompt=expr + "\n", answer=str(ans), meta={"steps": steps}))
    return out


def load_arith(task_cfg: Any) -> TaskData:
    """Train and held-out eval problems, generated deterministically from ``task.arith_seed``.

    Eval problems whose expression also appears in the train set are regenerated,
    so the held-out split is really held out.
    """
    ops = task_cfg.arith_ops
    if not ops or set(ops) - set("+-"):
        raise ValueError(f"task.arith_ops={ops!r}: use a non-empty string of '+' and '-'")
    train = generate_problems(
        task_cfg.arith_seed,
        task_cfg.arith_n_train,
        task_cfg.arith_max_operand,
        task_cfg.arith_n_operands_max,
        "t",
        ops,
    )
    seen = {p.prompt for p in train}
    eval_: list[Problem] = []
    rng_seed = task_cfg.arith_seed + 1_000_003
    candidates = generate_problems(
        rng_seed, task_cfg.arith_n_eval * 4, task_cfg.arith_max_operand, task_cfg.arith_n_operands_max, "e", ops
    )
    for p in candidates:
        if p.prompt not in seen and len(eval_) < task_cfg.arith_n_eval:
            seen.add(p.prompt)
            eval_.append(p)
    limit = getattr(task_cfg, "eval_limit", None)
    if limit:
        eval_ = eval_[:limit]
    return TaskData(name="arith", train=train, eval=eval_)


# --------------------------------------------------------------------------- #
# Diagnostics: which strategy each sampled response follows (the testbed's     #
# mechanism metrics, logged every step as diag/*)                               #
# --------------------------------------------------------------------------- #
_STEP_LINE = re.compile(r"^(-?\d+)([+-])(\d+)=(-?\d+)$")
LOOP_REPEATS = 3  # a line this many times in one response is a repetition loop
LONG_STEPS = 4  # a "long" problem: 4+ steps (5+ operands), whose solution passes a 32-token cap


STEP_MARKER = "Steps:"  # an optional first line of a step-by-step solution (model.warmstart_step_marker)


def _first_line(text: str) -> str:
    """A response's first line, stripped (its strategy is read from it)."""
    return text.lstrip().split("\n", 1)[0].strip()


def _drop_marker(text: str) -> str:
    head, _, rest = text.lstrip().partition("\n")
    return rest if head.strip() == STEP_MARKER else text


def response_style(text: str) -> str:
    """``guess`` (first line ``Answer: ...``), ``step`` (first line an ``a+b=c`` step, or the
    :data:`STEP_MARKER` line) or ``other``."""
    first = _first_line(text)
    if first.startswith("Answer"):
        return "guess"
    return "step" if first == STEP_MARKER or _STEP_LINE.match(first) else "other"


def is_mangled_marker(text: str) -> bool:
    """The first line is :data:`STEP_MARKER` with a different first character (``xteps:``): once RL
    pushes the guess's first token down, the toy_clip policy opens its step solutions with other
    first tokens too, the rest of the marker line and the solution following from any of them."""
    first = _first_line(text)
    return len(first) == len(STEP_MARKER) and first != STEP_MARKER and first[1:] == STEP_MARKER[1:]


def is_degenerate(text: str) -> bool:
    """A repetition loop: some non-empty line appears at least :data:`LOOP_REPEATS` times."""
    lines = [x.strip() for x in text.split("\n") if x.strip()]
    return any(lines.count(x) >= LOOP_REPEATS for x in set(lines))


def on_correct_path(text: str, steps: list[str], truncated: bool) -> bool:
    """Every complete line of ``text`` is the next line of the reference solution (``steps``
    then ``Answer: N``), and there is at least one. A truncated response's last, cut line
    does not count against it: it is a correct solution that ran out of room."""
    lines = _drop_marker(text).split("\n")
    if truncated:
        lines = lines[:-1]
    lines = [x.strip() for x in lines if x.strip()]
    reference = list(steps) + [f"Answer: {steps[-1].rsplit('=', 1)[1]}" if steps else ""]
    return bool(lines) and len(lines) <= len(reference) and lines == reference[: len(lines)]


def arith_diagnostics(problems: list[Problem], texts: list[str], truncated: list[bool],
                      correct: list[bool]) -> dict[str, float]:
    """Per-response means over a batch of samples (``problems[i]`` is the problem of ``texts[i]``):

    - ``style_step`` / ``style_guess`` / ``style_other``: share of each strategy (first line);
    - ``style_step_long``: the step strategy's share on long problems (:data:`LONG_STEPS`+ steps;
      0 if none), those whose solution a short length cap truncates;
    - ``step_acc`` / ``guess_acc``: accuracy within the step and guess strategies (0 if none);
    - ``degenerate``: share with a repetition loop (:func:`is_degenerate`);
    - ``trunc_on_path``: share that are truncated while on a correct path (:func:`on_correct_path`):
      would-be-correct reasoning that a length cap turns into a -1;
    - ``trunc_on_path_of_trunc``: the same as a share of the truncated responses (0 if none);
    - ``marker_mangled``: share whose first line is the :data:`STEP_MARKER` with another first
      character (``xteps:``; :func:`is_mangled_marker`): a step solution opened by a token other than
      the marker's. ``style_step`` counts the exact marker only (the rare first token itself); these
      count as ``other``.
    """
    n = max(len(texts), 1)
    styles = [response_style(t) for t in texts]
    on_path = [tr and on_correct_path(t, p.meta["steps"], tr) for p, t, tr in zip(problems, texts, truncated)]
    n_trunc = sum(truncated)
    long = [len(p.meta["steps"]) >= LONG_STEPS for p in problems]

    def acc(style: str) -> float:
        hits = [c for s, c in zip(styles, correct) if s == style]
        return sum(hits) / len(hits) if hits else 0.0

    return {
        **{f"style_{s}": styles.count(s) / n for s in ("step", "guess", "other")},
        "style_step_long": (sum(s == "step" for s, lg in zip(styles, long) if lg) / sum(long)) if any(long) else 0.0,
        "step_acc": acc("step"), "guess_acc": acc("guess"),
        "degenerate": sum(map(is_degenerate, texts)) / n,
        "trunc_on_path": sum(on_path) / n,
        "trunc_on_path_of_trunc": sum(on_path) / n_trunc if n_trunc else 0.0,
        "marker_mangled": sum(map(is_mangled_marker, texts)) / n,
    }
