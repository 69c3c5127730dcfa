"""Benchmark: one training step of dapo-exp, TRL's GRPOTrainer and verl's trainer at identical work, in one run.

Runs :mod:`dapo_exp.benchmarks.vs_trl` (TRL and dapo-exp in ABBA blocks, one process) and then
:mod:`dapo_exp.benchmarks.vs_verl` (dapo-exp, verl's run through ``run.py backend=verl``, dapo-exp again) on
the same work, one after another, so that each ratio has dapo-exp's own time measured in the same minutes
beside it. Each benchmark runs in a process of its own (TRL's and dapo-exp's models held by the first would
leave verl's workers too little memory: Ray's memory monitor killed verl's vLLM server when both ran in one
process on a 24 GB machine). Each benchmark's full output is written to ``--out`` (``vs_trl.txt``,
``vs_verl.txt``) as it runs, and the summary (``summary.txt``): the three medians, the two ratios to dapo-exp,
the load averages.

    python -m dapo_exp.benchmarks.three_engines --out sweeps/results/<date>-real-model-bench

The default work is the real model's (``--experiment smollm2_add2``: 2 prompts x 8 responses of exactly 24
new tokens, one update over micro-batches of 8, one torch thread per process). Needs TRL in this environment
(the ``bench`` extra) and verl's (``.venv-verl``). About half an hour on a quiet 2-core CPU; run nothing
beside it (timing figures are only worth reporting from a quiet machine).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import multiprocessing
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO


class _Tee(io.TextIOBase):
    """Writes to several text streams at once (the terminal and a file)."""

    def __init__(self, *streams: TextIO) -> None:
        self.streams = streams

    def write(self, s: str) -> int:
        for stream in self.streams:
            stream.write(s)
            stream.flush()
        return len(s)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m dapo_exp.benchmarks.three_engines", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for vs_trl.txt, vs_verl.txt and summary.txt")
    ap.add_argument("--experiment", default="smollm2_add2", help="the model and task (an experiment preset)")
    ap.add_argument("--prompts", type=int, default=2, help="prompts per step")
    ap.add_argument("--responses", type=int, default=8, help="responses per prompt (the group size)")
    ap.add_argument("--tokens", type=int, default=24, help="new tokens per response, exactly")
    ap.add_argument("--micro-batch", type=int, default=8, help="responses per forward/backward pass")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of every process")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first, of each system")
    ap.add_argument("--trl-blocks", type=int, default=3, help="vs_trl's blocks of one timed step each (ABBA)")
    ap.add_argument("--verl-steps", type=int, default=2, help="vs_verl's timed steps per block")
    return ap.parse_args(argv)


def work_args(args: argparse.Namespace) -> list[str]:
    """The work both benchmarks are given, as their own command-line arguments."""
    return ["--experiment", args.experiment, "--prompts", str(args.prompts), "--responses", str(args.responses),
            "--tokens", str(args.tokens), "--micro-batch", str(args.micro_batch), "--threads", str(args.threads),
            "--warmup", str(args.warmup)]


def _load(avg: tuple[float, ...]) -> str:
    return " ".join(f"{x:.2f}" for x in avg)


def summary(trl: dict[str, Any], verl: dict[str, Any]) -> str:
    """The three systems' medians and each ratio to dapo-exp's time from the same benchmark."""
    return "\n".join([
        f"TRL       {trl['trl_median_s']:.2f} s/step; dapo-exp beside it {trl['dapo_median_s']:.2f} s/step; "
        f"dapo-exp / TRL {trl['ratio']:.3f}",
        f"verl      {verl['verl_median_s']:.2f} s/step; dapo-exp beside it {verl['dapo_median_s']:.2f} s/step; "
        f"verl / dapo-exp {verl['ratio']:.3f}",
        f"load average (1, 5, 15 min): vs_trl {_load(trl['load_before'])} -> {_load(trl['load_after'])}; "
        f"vs_verl {_load(verl['load_before'])} -> {_load(verl['load_after'])}",
    ]) + "\n"


def _target(target: str, argv: list[str], path: str, results: Any) -> None:
    try:
        results.put(("ok", _in_this_process(target, argv, Path(path))))
    except BaseException as e:  # the parent waits on the queue: it must hear of a failure too
        results.put(("error", f"{type(e).__name__}: {e}"))
        raise


def in_child(target: str, argv: list[str], path: Path) -> Any:
    """``module:function`` called with ``argv`` in a fresh process (spawned: nothing of this one's memory),
    its standard output also written to ``path``; its return value, or a RuntimeError naming its failure."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    proc = ctx.Process(target=_target, args=(target, argv, str(path), results))
    proc.start()
    try:
        kind, got = results.get()  # before join: a large result would otherwise block the child's exit
    except BaseException:
        proc.kill()
        raise
    proc.join()
    if kind == "error":
        raise RuntimeError(f"{target} failed in its process: {got} (its output so far: {path})")
    return got


def _in_this_process(target: str, argv: list[str], path: Path) -> Any:
    """:func:`in_child`'s contract in this process (tests)."""
    module, func = target.split(":")
    with open(path, "w") as f, contextlib.redirect_stdout(_Tee(sys.stdout, f)):
        return getattr(importlib.import_module(module), func)(argv)


def main(argv: list[str] | None = None, run: Callable[[str, list[str], Path], Any] = in_child) -> str:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the children's and verl's processes take theirs from it
    results = {}
    for name, extra in (("vs_trl", ["--blocks", str(args.trl_blocks), "--steps", "1"]),
                        ("vs_verl", ["--steps", str(args.verl_steps)])):
        results[name] = run(f"dapo_exp.benchmarks.{name}:main", [*work_args(args), *extra], out / f"{name}.txt")
    text = summary(results["vs_trl"], results["vs_verl"])
    (out / "summary.txt").write_text(text)
    print(text, end="")
    return text


def _child_probe(argv: list[str]) -> dict[str, Any]:
    """What :func:`in_child`'s test spawns: prints its arguments, returns them with its process id."""
    print("child says", *argv)
    return {"args": argv, "pid": os.getpid()}


if __name__ == "__main__":
    main()
