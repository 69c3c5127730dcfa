"""Each rung of the paper's ladder against the one below, on the fixes' mechanism metrics.

    python sweeps/checks/ladder_mechanisms.py multirun/toy_dapo_ladder

For every run of the sweep: the mean over its training steps of each mechanism metric (the testbed's
diagnostics, docs/explanation/testbed.md) and the mean of its held-out evaluations; then, per rung, the
mean over seeds, and each rung minus the one below, paired by seed, with its 95% t interval (``*``: the
interval excludes 0). The analysis' own rung contrasts are on the endpoint accuracy; this adds the
metrics that say whether each fix did its job. Written for sweeps/results/2026-11-27-toy_dapo_ladder/.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

RUNGS = ["paper_1_grpo", "paper_2_of", "paper_3_clip", "paper_4_sop", "paper_5_tl", "paper_6_dapo"]
METRICS = ["diag/style_step", "diag/trunc_on_path", "diag/degenerate", "actor/effective_batch_frac",
           "response_length/clip_ratio", "response_length/mean", "actor/entropy", "eval/acc_avg"]


def per_run(sweep: Path) -> pd.DataFrame:
    """One row per run: label, seed, and each metric's mean over its training steps (evaluations)."""
    rows = []
    for summary in sorted(sweep.glob("*/summary.json")):
        s = json.loads(summary.read_text())
        lines = (summary.parent / "metrics.jsonl").read_text().splitlines()
        logged = [json.loads(line) for line in lines if line.strip()]
        train = pd.DataFrame([r for r in logged if "reward/mean" in r])
        evals = pd.DataFrame([r for r in logged if "eval/acc_avg" in r])
        row = {"label": s["label"], "seed": s["seed"]}
        for k in METRICS:
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
    df = per_run(Path(argv[0]))
    print("per-rung mean over seeds of each run's mean over its 30 steps (eval/acc_avg: over its evaluations)")
    print(df.groupby("label")[METRICS].mean().reindex(RUNGS).round(3).to_string())
    print("\nrung contrasts (k minus k-1), paired by seed: mean [95% t interval]")
    for a, b in zip(RUNGS[1:], RUNGS[:-1]):
        print(f"{a} - {b}:\n   " + "\n   ".join(paired(df, a, b, k) for k in METRICS))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
