"""``chat_arith``: arithmetic and word problems for a real instruct model, as chat conversations.

The toy task (:mod:`dapo_exp.tasks.arith`) feeds a character-level policy a bare expression; a real
instruct model needs a conversation, and a small one needs to be shown the answer format: asked once, in
one message, SmolLM2-135M-Instruct writes "3 + 2 = 5" or "The answer is 5" and never the ``Answer:`` line
the paper's reward reads. So each problem is a message list (:attr:`Problem.messages`), rendered by the
model's own chat template:

- a system message (``task.system_prompt``; null = the chat template's own default),
- ``task.few_shot`` worked examples, each a user turn and an assistant turn that ends in ``Answer: N``
  (drawn once per task from their own seed, the same for every problem, never from the eval problems),
- the problem itself as the last user turn.

Difficulty is graded by ``task.level`` (:data:`LEVELS`): one-digit sums, two-digit sums, three two-digit
terms, a one-digit by two-digit product, and word problems of one and two steps. A response is scored by
the task's verifier from its ``Answer:`` line (``task.verifier=math_dapo``, the paper's rule) or also from a
``\\boxed{}`` answer (``task.verifier=answer_or_boxed``). The problems are generated from ``task.arith_seed``
alone: every run of a sweep sees the same train and held-out problems, and the held-out questions never
occur in training.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from dapo_exp.tasks.base import Problem, TaskData

# one problem: (question, answer, worked solution without the Answer line)
Generator = Callable[[random.Random], tuple[str, int, str]]

_NAMES = ("Tom", "Anna", "Sam", "Lily", "Ben", "Mia", "Omar", "Zoe")
_ITEMS = ("apples", "marbles", "books", "stickers", "pencils", "cards", "coins", "shells")


def _add(lo: int, hi: int, terms: int) -> Generator:
    def gen(rng: random.Random) -> tuple[str, int, str]:
        xs = [rng.randint(lo, hi) for _ in range(terms)]
        lines, acc = [], xs[0]
        for x in xs[1:]:
            lines.append(f"{acc} + {x} = {acc + x}")
            acc += x
        return f"What is {' + '.join(map(str, xs))}?", acc, "\n".join(lines)
    return gen


def _mul(rng: random.Random) -> tuple[str, int, str]:
    a, b = rng.randint(2, 9), rng.randint(11, 99)
    tens, ones = b - b % 10, b % 10
    work = f"{a} x {tens} = {a * tens}\n{a} x {ones} = {a * ones}\n{a * tens} + {a * ones} = {a * b}"
    return f"What is {a} x {b}?", a * b, work


def _word(lo: int, hi: int, two_step: bool) -> Generator:
    def gen(rng: random.Random) -> tuple[str, int, str]:
        name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        if not two_step:
            if rng.random() < 0.5:
                return (f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?", a + b,
                        f"{a} + {b} = {a + b}")
            a, b = max(a, b), min(a, b)
            return (f"{name} has {a} {item} and gives {b} away. How many {item} does {name} have left?", a - b,
                    f"{a} - {b} = {a - b}")
        c = rng.randint(lo, a + b)
        return (f"{name} has {a} {item}, gets {b} more, then gives {c} away. How many {item} does {name} have "
                f"left?", a + b - c, f"{a} + {b} = {a + b}\n{a + b} - {c} = {a + b - c}")
    return gen


# task.level -> the problem generator, easiest first
LEVELS: dict[str, Generator] = {
    "add1": _add(1, 9, 2),  # 3 + 5
    "add2": _add(10, 99, 2),  # 47 + 25
    "add3": _add(10, 99, 3),  # 47 + 25 + 13
    "mul": _mul,  # 7 x 23
    "word1": _word(2, 9, two_step=False),  # one step, one-digit numbers
    "word2": _word(10, 60, two_step=True),  # two steps, two-digit numbers
}
FEW_SHOT_SEED_OFFSET = 7_000_003  # the worked examples' own stream (never the train or eval problems')


def answer_text(solution: str, answer: int) -> str:
    """An assistant turn of a worked example: the working, then the answer line the reward reads."""
    return f"{solution}\nAnswer: {answer}"


def conversation(question: str, shots: list[tuple[str, int, str]], system: str | None) -> list[dict[str, str]]:
    """The message list of one problem: system (if any), the worked examples' turns, the question."""
    msgs = [{"role": "system", "content": system}] if system else []
    for q, a, work in shots:
        msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": answer_text(work, a)}]
    return msgs + [{"role": "user", "content": question}]


def _draw(gen: Generator, rng: random.Random, n: int, avoid: set[str], distinct: bool,
          what: str) -> list[tuple[str, int, str]]:
    out: list[tuple[str, int, str]] = []
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 50 * n + 1000:
            raise ValueError(f"task.level: cannot draw {n} {what} problems (too few distinct ones at this level)")
        q, a, w = gen(rng)
        if q in avoid:
            continue
        if distinct:
            avoid.add(q)
        out.append((q, a, w))
    return out


def load_chat_arith(task_cfg: Any) -> TaskData:
    """Held-out problems first (distinct), then the worked examples (distinct, not held out), then the training
    problems (never a held-out question or a worked example; repeats allowed where a level has few problems)."""
    level = task_cfg.level
    if level not in LEVELS:
        raise ValueError(f"task.level={level!r}: choose one of {', '.join(LEVELS)}")
    gen, seed = LEVELS[level], task_cfg.arith_seed
    held: set[str] = set()
    eval_rows = _draw(gen, random.Random(seed + 1_000_003), task_cfg.arith_n_eval, held, True, "held-out")
    shots = _draw(gen, random.Random(seed + FEW_SHOT_SEED_OFFSET), task_cfg.few_shot, held, True, "worked-example")
    train_rows = _draw(gen, random.Random(seed), task_cfg.arith_n_train, set(held), False, "training")
    system = task_cfg.system_prompt

    def problems(rows: list[tuple[str, int, str]], prefix: str) -> list[Problem]:
        return [Problem(id=f"{level}-{prefix}{i}", prompt=q, answer=str(a), meta={"solution": w, "level": level},
                        messages=conversation(q, shots, system)) for i, (q, a, w) in enumerate(rows)]

    return TaskData(name="chat_arith", train=problems(train_rows, "t"), eval=problems(eval_rows, "e"),
                    stats={"few_shot": len(shots)})
