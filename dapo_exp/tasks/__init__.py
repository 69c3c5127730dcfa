"""Tasks: problems (train and held-out eval), the prompt template, and the verifiers.

``load_task(task_cfg)`` picks the loader of ``task.name`` from :data:`TASKS`:

- ``arith``: the embedded toy (``dapo_exp.tasks.arith.load_arith``), generated in code;
- ``chat_arith``: arithmetic and word problems at graded levels as chat conversations with few-shot
  turns, for a real instruct model (``dapo_exp.tasks.chat_arith``);
- ``dapo_math``: DAPO-Math-17k for training, AIME 2024 for evaluation (the paper's);
- ``gsm8k``: GSM8K train / test;
- ``math500``: DAPO-Math-17k for training, MATH-500 for evaluation.

A new task is one loader ``fn(task_cfg) -> TaskData`` registered here (or from your own
code: ``TASKS.register("name", fn)``) plus ``conf/task/<name>.yaml``.

``task.train_source`` / ``task.eval_source`` replace the defaults with a known name, an
HF id or a local file (see :mod:`dapo_exp.tasks.math_data`); ``task.eval_limit`` keeps
the first N eval problems. :func:`check_task_sources` runs the cheap checks (files exist,
names known) so that the trainer can fail before spending compute.

This package's ``__init__`` stays import-light (the verifier worker processes import it):
the data modules are imported inside the functions.
"""

from __future__ import annotations

import logging
from typing import Any

from dapo_exp.registry import Registry
from dapo_exp.tasks.base import Problem, TaskData

__all__ = ["Problem", "TaskData", "TASKS", "DIAGNOSTICS", "load_task", "check_task_sources"]

log = logging.getLogger(__name__)


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    return cfg.get(key, default) if isinstance(cfg, dict) else getattr(cfg, key, default)


def check_task_sources(task_cfg: Any) -> None:
    """Raise :class:`~dapo_exp.tasks.math_data.TaskSourceError` naming the field and path/id if the
    task's data cannot be loaded (missing file, unknown data set, bad ``eval_limit``). No network."""
    from dapo_exp.tasks.math_data import check_task_sources as _check

    _check(task_cfg)


def _arith(task_cfg: Any) -> TaskData:
    from dapo_exp.tasks.arith import load_arith

    return load_arith(task_cfg)


def _math(task_cfg: Any) -> TaskData:
    from dapo_exp.tasks.math_data import load_math_task

    return load_math_task(task_cfg)


def _chat_arith(task_cfg: Any) -> TaskData:
    from dapo_exp.tasks.chat_arith import load_chat_arith

    return load_chat_arith(task_cfg)


TASKS: Registry = Registry("task", "task.name")
TASKS.register("arith", _arith)
TASKS.register("chat_arith", _chat_arith)
for _name in ("dapo_math", "gsm8k", "math500"):
    TASKS.register(_name, _math)


def _arith_diagnostics(problems: list, texts: list[str], truncated: list[bool], correct: list[bool]) -> dict:
    from dapo_exp.tasks.arith import arith_diagnostics

    return arith_diagnostics(problems, texts, truncated, correct)


# A task's mechanism diagnostics: ``fn(problems, texts, truncated, correct) -> {name: mean}``
# over a batch of samples, logged every step as ``diag/<name>`` (training samples) and
# ``eval/diag_<name>`` (held-out samples). Optional: a task without one logs none.
DIAGNOSTICS: Registry = Registry("task diagnostics", "task.name")
DIAGNOSTICS.register("arith", _arith_diagnostics)


def load_task(task_cfg: Any) -> TaskData:
    """The :class:`TaskData` of ``task_cfg.name`` (a key of :data:`TASKS`), eval set truncated
    to ``task_cfg.eval_limit`` problems when that is set.

    ``stats`` holds the loading counts (rows, duplicates dropped, malformed skipped, per split)
    and ``eval_limit_dropped``.
    """
    name = _get(task_cfg, "name")
    loader = TASKS.pick(name)
    check_task_sources(task_cfg)
    data = loader(task_cfg)
    system = _get(task_cfg, "system_prompt")
    if system:  # a system message before every problem that has no conversation of its own
        for p in data.train + data.eval:
            if not p.messages:
                p.messages = [{"role": "system", "content": system}, {"role": "user", "content": p.prompt}]
    limit = _get(task_cfg, "eval_limit")
    if limit is not None and len(data.eval) > limit:
        data.stats["eval_limit_dropped"] = len(data.eval) - limit
        data.eval = data.eval[:limit]
        log.info("task %s: eval set truncated to task.eval_limit=%d problems", name, limit)
    return data
