"""Benchmark: how long a misspelt key takes to be refused (the target: under 2 s on a quiet machine).

    python -m dapo_exp.benchmarks.config_refusal              # 5 runs of each command
    python -m dapo_exp.benchmarks.config_refusal --repeats 3

Times, as whole processes, ``python run.py algo.clip_hgih=0.3`` (an unknown key: refused before torch is
imported) and, as the baseline in the same block, ``python -c "import torch"`` (what a refusal after
the heavy imports would at least cost), and prints each one's minimum, median and maximum seconds with
the machine's load averages before and after. Checks that each refusal exits 2 with one line naming
``algo.eps_high``. The exit status is 1 when the median refusal takes :data:`TARGET_S` seconds or more,
0 otherwise; a 1-minute load above 1 at the start is said in a warning line (the target is for a quiet
machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGET_S = 2.0
REFUSED = [sys.executable, "run.py", "algo.clip_hgih=0.3"]
BASELINE = [sys.executable, "-c", "import torch"]


def _time(cmd: list[str], check: bool) -> float:
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    elapsed = time.perf_counter() - t0
    if check:
        lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
        if out.returncode != 2 or len(lines) != 1 or "algo.eps_high" not in lines[0]:
            raise SystemExit(f"the refusal is not one line naming algo.eps_high (exit {out.returncode}): {out.stderr}")
    return elapsed


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    before = os.getloadavg()[0]
    print(f"load average before: {_load()}")
    if before > 1:
        print(f"warning: the 1-minute load is {before:.2f}: the {TARGET_S:g} s target is for a quiet machine")
    rows = {}
    for name, cmd, check in (("refusal", REFUSED, True), ("import torch", BASELINE, False)):
        times = [_time(cmd, check) for _ in range(args.repeats)]
        rows[name] = times
        print(f"{name:>13}: min {min(times):.2f} s, median {statistics.median(times):.2f} s, max {max(times):.2f} s "
              f"({args.repeats} runs: {' '.join(shlex_join(cmd))})")
    ratio = statistics.median(rows["refusal"]) / statistics.median(rows["import torch"])
    print(f"refusal / import torch (medians): {ratio:.2f}")
    print(f"load average after: {_load()}")
    met = statistics.median(rows["refusal"]) < TARGET_S
    print(f"target (median refusal < {TARGET_S:g} s): {'met' if met else 'NOT met'}")
    return 0 if met else 1


def shlex_join(cmd: list[str]) -> list[str]:
    import shlex

    return [shlex.quote(c if i else Path(c).name) for i, c in enumerate(cmd)]


if __name__ == "__main__":
    sys.exit(main())
