"""Each configuration of a sweep against one baseline, Holm-adjusted over those comparisons only.

    python sweeps/checks/vs_baseline.py RUNS OUT [--baseline grpo]

``RUNS``: a sweep directory or its ``analysis/runs.csv`` (a committed result's ``runs.csv``). The analysis' own
contrasts of a set that is neither a ladder nor a two-level design compare every pair (78 for 13 arms) and adjust
over all of them; a family of recipes asks one question per arm, "does it change the endpoint against the
baseline?", so this adjusts over those k comparisons. Each row is the analysis' own pairwise contrast
(:func:`dapo_exp.analysis.contrasts.pairwise_contrasts`: the difference of the endpoint accuracy in pp, paired t
by seed, its 95% interval, MDE, TOST within +-5 pp), with ``p_holm`` recomputed over the k comparisons and the
verdict read from it. Writes ``OUT.md`` and ``OUT.csv``; ``tests/test_committed_results.py`` recomputes a
committed one from its ``runs.csv``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from dapo_exp.analysis import verdicts
from dapo_exp.analysis.contrasts import holm, pairwise_contrasts

COLUMNS = ["config", "added", "diff", "lo", "hi", "n", "p", "p_holm", "mde", "r", "equivalence", "verdict"]


def vs_baseline(runs: pd.DataFrame, baseline: str = "grpo") -> pd.DataFrame:
    """One row per configuration other than ``baseline``: its pairwise contrast against it, Holm over these rows."""
    pairs = pairwise_contrasts(runs)
    rows = pairs[pairs["vs"] == baseline].copy()
    flipped = pairs[pairs["config"] == baseline]
    if len(flipped):  # the baseline is not the first configuration of the table: not expected here
        raise SystemExit(f"error: {baseline} is not the first configuration of the runs ({len(flipped)} contrasts "
                         "have it as config); order the runs with the baseline first")
    if rows.empty:
        raise SystemExit(f"error: no configuration to compare with {baseline!r}")
    rows["p_holm"] = holm(rows["p"].to_numpy(dtype=float))
    for i, r in rows.iterrows():
        if np.isfinite(r["p_holm"]) and r["verdict"] in (verdicts.DIFFERENCE, verdicts.NO_DIFFERENCE):
            rows.at[i, "verdict"] = verdicts.DIFFERENCE if r["p_holm"] < verdicts.ALPHA else verdicts.NO_DIFFERENCE
    return rows[COLUMNS].reset_index(drop=True)


def markdown(df: pd.DataFrame, baseline: str) -> str:
    out = [f"**Each configuration against {baseline}** (difference of the endpoint accuracy in pp, paired t by seed, "
           f"95% interval; p_holm: Holm over these {len(df)} comparisons; MDE at power 0.8; r: the correlation of the "
           "two arms' per-seed values; equivalence: TOST within ±5 pp)", "",
           "| config | vs | Δ (pp) [95% CI] | n | p | p_holm | MDE | r | verdict | equivalence |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in df.itertuples():
        out.append(f"| {r.config} | {baseline} | {r.diff:+.1f} [{r.lo:+.1f}, {r.hi:+.1f}] | {r.n} | {r.p:.3g} | "
                   f"{r.p_holm:.3g} | {r.mde:.1f} | {r.r:.2f} | {r.verdict} | {r.equivalence} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", help="a sweep directory or a runs.csv")
    ap.add_argument("out", help="output path without suffix (OUT.md, OUT.csv)")
    ap.add_argument("--baseline", default="grpo")
    a = ap.parse_args(argv)
    src = Path(a.runs)
    if src.is_dir():
        src = src / "analysis" / "runs.csv"
    if not src.is_file():
        print(f"error: no runs.csv at {src}", file=sys.stderr)
        return 2
    df = vs_baseline(pd.read_csv(src), a.baseline)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(markdown(df, a.baseline))
    df.to_csv(out.with_suffix(".csv"), index=False)
    print(markdown(df, a.baseline))
    return 0


if __name__ == "__main__":
    sys.exit(main())
