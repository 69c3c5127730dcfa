"""Each rung of the paper's ladder against the one below, on the fixes' mechanism metrics.

    python sweeps/checks/ladder_mechanisms.py multirun/toy_dapo_ladder
    python sweeps/checks/ladder_mechanisms.py multirun/smollm2_clip --rungs grpo,clip --last 3 \
        --metrics actor/entropy,actor/pg_clipfrac_higher,actor/pg_clipfrac_lower,response_length/mean,eval/acc_avg

For every run of the sweep: the mean over its training steps of each mechanism metric (the testbed's
diagnostics, docs/explanation/testbed.md) and the mean of its held-out evaluations; then, per rung, the
mean over seeds, and each rung minus the one below, paired by seed, with its 95% t interval (``*``: the
interval excludes 0). The analysis' own rung contrasts are on the endpoint accuracy; this adds the
metrics that say whether each fix did its job. Written for sweeps/results/2026-11-27-toy_dapo_ladder/;
``--rungs`` and ``--metrics`` name another sweep's labels (in ladder order) and metrics, ``--last K`` takes
each run's mean over its last K training steps instead of all of them (a collapse shows at the end).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

RUNGS = ["paper_1_grpo", "paper_2_of", "paper_3_clip", "paper_4_sop", "paper_5_tl", "paper_6_dapo"]
METRICS = ["diag/style_step", "diag/trunc_on_path", "diag/degenerate", "actor/effective_batch_frac",
           "response_length/clip_ratio", "response_length/mean", "actor/entropy", "eval/acc_avg"]


def per_run(sweep: Path, metrics: list[str] = METRICS, last: int | None = None) -> pd.DataFrame:
    """One row per run: label, seed, and each metric's mean over its training steps (the last ``last`` of
    them when given; evaluations: all of them)."""
    rows = []
    for summary in sorted(sweep.glob("*/summary.json")):
        s = json.loads(summary.read_text())
        lines = (summary.parent / "metrics.jsonl").read_text().splitlines()
        logged = [json.loads(line) for line in lines if line.strip()]
        train = pd.DataFrame([r for r in logged if "reward/mean" in r])
        train = train.tail(last) if last else train
        evals = pd.DataFrame([r for r in logged if "eval/acc_avg" in r])
        row = {"label": s["label"], "seed": s["seed"]}
        for k in metrics:
            src = evals if k.startswith("eval/") else train
            row[k] = float(src[k].mean()) if k in src else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


def paired(df: pd.DataFrame, a: str, b: str, metric: str) -> str:
    """``metric`` of rung ``a`` minus rung ``b``, paired by seed: mean [95% t interval]."""
    d = (df[df.label == a].set_index("seed")[metric] - df[df.label == b].set_index("seed")[metric]).dropna()
    if len(d) < 2 or d.std() == 0:
        return f"{metric.split('/')[-1]} {d.mean():+.3f}"
    h = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
    flag = "*" if abs(d.mean()) > h else ""
    return f"{metric.split('/')[-1]} {d.mean():+.3f} [{d.mean() - h:+.3f}, {d.mean() + h:+.3f}]{flag}"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", type=Path)
    ap.add_argument("--rungs", default=",".join(RUNGS), help="the runs' labels, in ladder order")
    ap.add_argument("--metrics", default=",".join(METRICS))
    ap.add_argument("--last", type=int, default=None, help="each run's mean over its last K training steps")
    args = ap.parse_args(argv)
    rungs, metrics = args.rungs.split(","), args.metrics.split(",")
    df = per_run(args.sweep, metrics, args.last)
    window = f"its last {args.last} steps" if args.last else "all its steps"
    print(f"per-rung mean over seeds of each run's mean over {window} (eval/acc_avg: over its evaluations)")
    print(df.groupby("label")[metrics].mean().reindex(rungs).round(3).to_string())
    print("\nrung contrasts (k minus k-1), paired by seed: mean [95% t interval]")
    for a, b in zip(rungs[1:], rungs[:-1]):
        print(f"{a} - {b}:\n   " + "\n   ".join(paired(df, a, b, k) for k in metrics))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
