"""Benchmark: the default run (``python run.py``) end to end on this machine.

Measures the wall time of the whole command from an empty warm-start cache (the default run
starts from the warm start shipped with the package, so nothing is built; ``toy_clip``,
``toy_overlong`` and ``toy_degeneration`` build their own) and then with the cache in place for each seed, and splits a rollout step into generation / training / evaluation
from the run's own ``metrics.jsonl``. Prints a table and the command that made it.

    python -m dapo_exp.benchmarks.toy_run                      # defaults: fixes=full, seeds 0,1,2
    python -m dapo_exp.benchmarks.toy_run --seeds 0 fixes=grpo train.steps=10

It also checks the testbed's promise for the default run: from a cold cache within
:data:`BUDGET_S` seconds, and held-out accuracy up by at least :data:`MIN_GAIN_PP` points over the
base policy on every seed; the exit status is 1 when either fails (with overrides, 0: the
promises are the default run's).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def run_once(out_dir: Path, cache_dir: Path, overrides: list[str]) -> float:
    cmd = [sys.executable, "run.py", f"hydra.run.dir={out_dir}", f"model.cache_dir={cache_dir}", "logger=none",
           *overrides]
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


BUDGET_S = 180.0  # the default run, cold cache, warm start included
MIN_GAIN_PP = 15.0  # held-out accuracy gain over the base policy on every seed


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str]) -> int:
    """``--seeds 0,1,2`` (first argument, optional): the first seed runs from a cold cache (warm
    start included), every seed then from the warm cache; the others are Hydra overrides."""
    seeds = [0, 1, 2]
    if argv[:1] == ["--seeds"]:
        seeds, argv = [int(x) for x in argv[1].split(",")], argv[2:]
    load_before = _load()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cold = run_once(tmp / "cold", tmp / "cache", [*argv, f"seed={seeds[0]}"])
        warm, gains = [], []
        for seed in seeds:
            warm.append(run_once(tmp / f"warm{seed}", tmp / "cache", [*argv, f"seed={seed}"]))
            summary = json.loads((tmp / f"warm{seed}" / "summary.json").read_text())
            base = (summary.get("base") or {}).get("eval/acc_avg", float("nan"))
            final = summary["final"]["eval/acc_avg"]
            gains.append((seed, base, final))
        built = next((tmp / "cache").glob("tiny-*/warmstart.json"), None)  # none: the shipped warm start
        ws = json.loads(built.read_text()) if built else None
        rows = [json.loads(x) for x in (tmp / f"warm{seeds[0]}" / "metrics.jsonl").read_text().splitlines()]
    _report(argv, seeds, cold, warm, ws, rows, gains, load_before)
    if argv:  # the budget and the gain are promises of the default run only
        return 0
    ok = cold <= BUDGET_S and all(100 * (f - b) >= MIN_GAIN_PP for _, b, f in gains)
    return 0 if ok else 1


def _report(argv, seeds, cold, warm, ws, rows, gains, load_before) -> None:
    steps = [r for r in rows if "timing_s/step" in r]
    evals = [r for r in rows if "timing_s/eval" in r]

    def med(key: str, src=steps) -> float:
        return float(np.median([r[key] for r in src])) if src else float("nan")

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    print(f"# toy benchmark, {datetime.datetime.now():%Y-%m-%d %H:%M}, commit {commit.stdout.strip()}, "
          f"{platform.node()}, {os.cpu_count()} CPUs, torch threads {os.environ.get('OMP_NUM_THREADS', 'default')}, "
          f"load average {load_before} before, {_load()} after")
    print(f"# command: python -m dapo_exp.benchmarks.toy_run --seeds {','.join(map(str, seeds))} {' '.join(argv)}")
    print("| measure | value |")
    print("|---|---|")
    print(f"| `python run.py`, cold cache (incl. warm start), seed {seeds[0]} | {cold:.1f} s "
          f"({'within' if cold <= BUDGET_S else 'OVER'} the {BUDGET_S:.0f} s budget) |")
    print(f"| `python run.py`, warm cache, per seed | {', '.join(f'{w:.1f}' for w in warm)} s |")
    print(f"| warm start alone | {ws['warmstart/seconds']:.1f} s ({ws['warmstart/steps']} steps) |" if ws else
          "| warm start alone | none built: the package's shipped warm start |")
    print(f"| rollout steps | {len(steps)} |")
    print(f"| per step, median: generation | {med('timing_s/gen'):.2f} s |")
    print(f"| per step, median: training (old logp + updates) | {med('timing_s/update_actor'):.2f} s |")
    print(f"| per step, median: total | {med('timing_s/step'):.2f} s |")
    print(f"| per eval, median | {med('timing_s/eval', evals):.2f} s ({len(evals)} evals) |")
    print(f"| generation tokens/s, median | {med('perf/gen_tokens_per_s'):.0f} |")
    print(f"| training tokens/s, median | {med('perf/train_tokens_per_s'):.0f} |")
    print(f"| dynamic sampling rounds per step, mean | {np.mean([r['dynamic_sampling/gen_rounds'] for r in steps]):.2f} |")
    for seed, base, final in gains:
        gain = 100 * (final - base)
        print(f"| held-out avg@k, seed {seed}: base -> final | {100 * base:.1f} -> {100 * final:.1f} % "
              f"({gain:+.1f} pp; {'meets' if gain >= MIN_GAIN_PP else 'BELOW'} +{MIN_GAIN_PP:.0f}) |")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
