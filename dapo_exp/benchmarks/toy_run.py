"""Benchmark: the default run (``python run.py``) end to end on this machine.

Measures the wall time of the whole command from a cold warm-start cache (the
first run on a machine builds the warm-started tiny policy) and then with the
cache warm, and splits a rollout step into generation / training / evaluation
from the run's own ``metrics.jsonl``. Prints a table and the command that made it.

    python -m dapo_exp.benchmarks.toy_run            # defaults: fixes=full task=arith model=tiny
    python -m dapo_exp.benchmarks.toy_run fixes=grpo train.steps=10
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


def main(argv: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cold = run_once(tmp / "cold", tmp / "cache", argv)
        warm = run_once(tmp / "warm", tmp / "cache", argv)
        ws = json.loads(next((tmp / "cache").glob("tiny-*/warmstart.json")).read_text())
        rows = [json.loads(x) for x in (tmp / "warm" / "metrics.jsonl").read_text().splitlines()]
        summary = json.loads((tmp / "warm" / "summary.json").read_text())
    steps = [r for r in rows if "timing_s/step" in r]
    evals = [r for r in rows if "timing_s/eval" in r]

    def med(key: str, src=steps) -> float:
        return float(np.median([r[key] for r in src])) if src else float("nan")

    print(f"# toy benchmark, {datetime.date.today()}, {platform.node()}, {os.cpu_count()} CPUs, "
          f"torch threads {os.environ.get('OMP_NUM_THREADS', 'default')}")
    print(f"# command: python -m dapo_exp.benchmarks.toy_run {' '.join(argv)}")
    print("| measure | value |")
    print("|---|---|")
    print(f"| `python run.py`, cold cache (incl. warm start) | {cold:.1f} s |")
    print(f"| `python run.py`, warm cache | {warm:.1f} s |")
    print(f"| warm start alone | {ws['warmstart/seconds']:.1f} s ({ws['warmstart/steps']} steps) |")
    print(f"| rollout steps | {len(steps)} |")
    print(f"| per step, median: generation | {med('timing_s/gen'):.2f} s |")
    print(f"| per step, median: training (old logp + updates) | {med('timing_s/update_actor'):.2f} s |")
    print(f"| per step, median: total | {med('timing_s/step'):.2f} s |")
    print(f"| per eval, median | {med('timing_s/eval', evals):.2f} s ({len(evals)} evals) |")
    print(f"| generation tokens/s, median | {med('perf/gen_tokens_per_s'):.0f} |")
    print(f"| training tokens/s, median | {med('perf/train_tokens_per_s'):.0f} |")
    print(f"| dynamic sampling rounds per step, mean | {np.mean([r['dynamic_sampling/gen_rounds'] for r in steps]):.2f} |")
    base, final = summary.get("base", {}), summary["final"]
    print(f"| eval avg@k base -> final | {base.get('eval/acc_avg', float('nan')):.3f} -> {final['eval/acc_avg']:.3f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
