"""What a run prints while it works: one line of key figures per step, rate-limited.

Beside the TTY progress bar (tqdm, off when stderr is not a terminal) a run prints a
plain line to stdout, so a log file, ``nohup``, SLURM or CI shows progress too::

    [dapo-exp] full s0 step 5/30 | reward -0.21 acc 0.40 ent 0.312 len 25.1 trunc 0.02 | 0.71 s/step, eta 18 s

At most one line every ``every_s`` seconds (``logger.progress_every_s``), and always
the first and the last step and each step that evaluated. And :func:`shell_word`, a command line's word as the
shell must pass it (the rerun lines of a sweep and of the analysis). Imports nothing of the project.
"""

from __future__ import annotations

import math
import re
import sys
import time
from typing import Any, TextIO


def _fmt(x: Any, spec: str) -> str:
    return format(x, spec) if isinstance(x, (int, float)) and not math.isnan(x) else "-"


class ProgressLines:
    """Prints rate-limited progress lines for a loop of ``total`` steps named ``name``."""

    def __init__(self, name: str, total: int, every_s: float = 10.0, stream: TextIO | None = None,
                 enabled: bool = True) -> None:
        self.name, self.total, self.every_s, self.enabled = name, total, every_s, enabled
        self.stream = stream or sys.stdout
        self._last = -math.inf
        self._t0 = time.perf_counter()
        self._done = 0

    def due(self, step: int, force: bool = False) -> bool:
        return force or step in (1, self.total) or time.perf_counter() - self._last >= self.every_s

    def emit(self, text: str) -> None:
        if not self.enabled:
            return
        self._last = time.perf_counter()
        print(f"[dapo-exp] {self.name} {text}", file=self.stream, flush=True)

    def step(self, step: int, m: dict[str, float], ev: dict[str, float] | None = None) -> None:
        """The line of a training step (``m``: its metrics; ``ev``: its evaluation, if any)."""
        self._done += 1
        if not self.due(step, force=bool(ev)):
            return
        per_step = (time.perf_counter() - self._t0) / self._done
        eta = per_step * (self.total - step)
        parts = [f"step {step}/{self.total}",
                 f"reward {_fmt(m.get('reward/mean'), '.2f')} acc {_fmt(m.get('reward/acc_mean'), '.2f')} "
                 f"ent {_fmt(m.get('actor/entropy'), '.3f')} len {_fmt(m.get('response_length/mean'), '.1f')} "
                 f"trunc {_fmt(m.get('response_length/clip_ratio'), '.2f')}"]
        if ev:
            parts.append(f"eval acc {_fmt(ev.get('eval/acc_avg'), '.3f')}")
        parts.append(f"{per_step:.2f} s/step, eta {eta:.0f} s")
        self.emit(" | ".join(parts))

    def count(self, i: int, text: str = "") -> None:
        """A line for item ``i`` of ``total`` of a plain loop (the warm start)."""
        if self.due(i):
            elapsed = time.perf_counter() - self._t0
            eta = elapsed / max(i, 1) * (self.total - i)
            self.emit(f"{i}/{self.total} {text} ({elapsed:.0f} s, eta {eta:.0f} s)".replace("  ", " "))


_SHELL_SAFE = re.compile(r"(?!~)[\w@%+=:,./~-]+")


def shell_word(arg: str) -> str:
    """``arg`` written for a POSIX shell so that the program receives it unchanged: as it is when it holds
    no character the shell treats specially, else in double quotes when those suffice (a Hydra override
    quoted for Hydra, ``"sweep='fixes=grpo,clip'"``), else :func:`shlex.quote`."""
    import shlex

    if _SHELL_SAFE.fullmatch(arg):
        return arg
    if not re.search(r'["$`\\!]', arg):
        return f'"{arg}"'
    return shlex.quote(arg)
