"""Sequential sweeps against the fixed 5-seed design on the same seeds.

    python sweeps/checks/sequential_toy.py SWEEP [SWEEP ...] --fixed RUNS_CSV --out OUT

Reads each sequential sweep of ``sweeps/sequential_toy.sh`` (its ``sequential.json``: the rounds, the
seeds spent and the last anytime-valid interval of its one comparison) and the fixed design's runs (a
committed ``runs.csv`` of the same configurations, seeds 0-4: the toy_dapo ladder). For the seeds both
hold it checks that the runs agree (the training is deterministic given the seed, so the sequential
sweep's seeds 0-4 are the ladder's runs); the fixed design's verdict is the paired t on seeds 0-4, with
the table's MDE and TOST (:func:`dapo_exp.analysis.verdicts.compare`). Writes ``OUT/sequential_toy.md``
and ``.csv``: per comparison, the sequential design's seeds per arm, runs, rounds, interval and state,
and the fixed design's runs, interval and verdict.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from dapo_exp.analysis import verdicts
from dapo_exp.analysis.runs import load_runs, with_endpoint
from dapo_exp.analysis.sequential import record_of
from dapo_exp.analysis.stats import paired_difference

FIXED_SEEDS = [0, 1, 2, 3, 4]


def _values(runs: pd.DataFrame, label: str, col: str) -> pd.Series:
    g = runs[(runs["label"] == label) & runs["included"].astype(bool)]
    return pd.Series(g[col].to_numpy(dtype=float) * 100.0, index=g["seed"].astype(int).to_numpy()).sort_index()


def one(sweep: Path, fixed: pd.DataFrame, col: str) -> dict:
    rec = record_of(sweep)
    if rec is None:
        raise SystemExit(f"{sweep}: no sequential.json (not a sequential sweep)")
    last = rec["rounds"][-1]
    c = last["comparisons"][0]
    a, b = c["label_a"], c["label_b"]
    runs = with_endpoint(load_runs(sweep).runs)
    seq_a, seq_b = _values(runs, a, col), _values(runs, b, col)
    fa, fb = _values(fixed, a, col).loc[FIXED_SEEDS], _values(fixed, b, col).loc[FIXED_SEEDS]
    both = [s for s in FIXED_SEEDS if s in seq_a.index and s in seq_b.index]
    agree = max([abs(seq_a[s] - fa[s]) for s in both] + [abs(seq_b[s] - fb[s]) for s in both] + [0.0])
    iv = paired_difference(fa, fb)
    common = sorted(set(seq_a.index) & set(seq_b.index))
    same = paired_difference(seq_a.loc[common], seq_b.loc[common])  # for reference only: not valid after its stop
    v = verdicts.compare(fa, fb, verdicts.DEFAULT_MARGIN)
    spent = {name: len(seeds) for name, seeds in last["seeds"].items()}
    return {"comparison": f"{a} vs {b}", "rounds": len(rec["rounds"]), "seeds per arm": "/".join(map(str, spent.values())),
            "runs (sequential)": sum(spent.values()), "seq diff": c["mean"], "seq lo": c["lo"], "seq hi": c["hi"],
            "seq state": c["state"], "runs (fixed)": 2 * len(FIXED_SEEDS), "fixed diff": iv.mean,
            "fixed lo": iv.lo, "fixed hi": iv.hi, "fixed verdict": verdicts.verdict_word(iv.lo, iv.hi, iv.n),
            "fixed equivalence": v["equivalence"], "seeds checked": len(both), "max |run difference| (pp)": agree,
            "t on its seeds lo": same.lo, "t on its seeds hi": same.hi}


def _cell(lo, hi) -> str:
    f = (lambda x: "-inf" if x is None or not np.isfinite(x) and x < 0 else
         "+inf" if x is None or not np.isfinite(x) else f"{x:+.1f}")
    return f"[{f(lo)}, {f(hi)}]"


def markdown(df: pd.DataFrame) -> str:
    rows = ["| comparison | sequential: rounds, seeds per arm, runs | anytime-valid 95% | state | fixed 5 seeds: runs "
            "| paired t 95% | verdict | equivalence (TOST ±5) | same runs (seeds, max diff pp) | t interval on the "
            "sequential seeds (reference: not valid after its stop) |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for _, r in df.iterrows():
        rows.append(f"| {r['comparison']} | {r['rounds']}, {r['seeds per arm']}, {r['runs (sequential)']} | "
                    f"{r['seq diff']:+.1f} {_cell(r['seq lo'], r['seq hi'])} | {r['seq state']} | {r['runs (fixed)']} | "
                    f"{r['fixed diff']:+.1f} {_cell(r['fixed lo'], r['fixed hi'])} | {r['fixed verdict']} | "
                    f"{r['fixed equivalence']} | {r['seeds checked']}, {r['max |run difference| (pp)']:.2g} | "
                    f"{_cell(r['t on its seeds lo'], r['t on its seeds hi'])} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    from dapo_exp.analysis.table import DIFF_KEY, TABLE_METRICS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweeps", nargs="+", type=Path)
    ap.add_argument("--fixed", type=Path, required=True, help="runs.csv of the fixed design (seeds 0-4)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    col = next(m.source for m in TABLE_METRICS if m.key == DIFF_KEY)
    fixed = with_endpoint(pd.read_csv(args.fixed))
    df = pd.DataFrame([one(s, fixed, col) for s in args.sweeps])
    args.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out / "sequential_toy.csv", index=False)
    text = markdown(df)
    (args.out / "sequential_toy.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
