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
