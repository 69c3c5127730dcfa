"""The same toy ablation on both engines: each arm compared across engines, the fix's effect on each.

    python sweeps/checks/cross_engine.py multirun/cross_engine_native multirun/cross_engine_verl OUT
    python sweeps/checks/cross_engine.py multirun/smollm2_clip multirun/smollm2_clip_verl OUT --arms grpo,clip \
        --title "GRPO vs + Clip-Higher on SmolLM2-135M-Instruct (experiment=smollm2_add2)"
    python sweeps/checks/cross_engine.py NATIVE/runs.csv VERL/runs.csv OUT --arms grpo,clip

With two committed results' ``runs.csv`` instead of two sweeps (each engine's half from the result that recorded
it: a sweep's ``table``'s runs, or a cross-engine result's rows of that engine), the endpoint tables and
``runs.csv`` are recomputed from the runs' recorded endpoints; ``timing.md`` and ``curves.png`` need the
per-step histories of the run directories and are not written.

Reads the two sweeps of ``sweeps/cross_engine.sh`` (the same study, one trained by dapo-exp's trainer,
one by verl's) through the analysis' own reader (:func:`dapo_exp.analysis.runs.load_runs`: a verl run's
metrics are verl's file-logger rows in our names) and writes to ``OUT``:

- ``arms.md``: per engine and arm, each endpoint's mean and sd over seeds;
- ``effects.md``: per engine, the fix's effect (fix on - off, paired by seed, 95% t interval), and the
  difference of the two engines' effects (Welch's t on the per-seed differences);
- ``engines.md``: per arm, verl - native (Welch's t: a seed of one engine is not the same random stream
  as the same seed of the other, so the engines are not paired);
- ``timing.md``: seconds per rollout step (median over steps and runs: the step, its generation, its
  update) and wall seconds per run, per engine;
- ``curves.png``: the per-step curves of both engines side by side (mean over seeds per arm);
- ``runs.csv``: one row per run with every endpoint, its commit and its base weights' identity (what
  ``tests/test_committed_results.py`` checks of a committed result).

An endpoint is a run's mean over its training steps (``avg/``) or its last held-out evaluation
(``final/eval/acc_avg``, in percent).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from dapo_exp.analysis.runs import BASE_WEIGHTS, load_runs  # noqa: E402
from dapo_exp.analysis.stats import paired_difference, welch_difference  # noqa: E402

OFF, ON = "grpo", "sop"  # the default arms: overlong_punishment=disabled / soft on fixes=grpo (--arms: others)
TITLE = "GRPO vs + Soft Overlong Punishment on toy_overlong"
ENDPOINTS = {  # column of the runs frame -> (shown name, scale)
    "avg/response_length/clip_ratio": ("truncated share (mechanism)", 1.0),
    "avg/response_length/mean": ("response length (tokens)", 1.0),
    "avg/actor/entropy": ("entropy (nats/token)", 1.0),
    "avg/reward/mean": ("reward (with the overlong term)", 1.0),
    "final/eval/acc_avg": ("held-out accuracy at the end (%, the runs' avg@k)", 100.0),
}
CLIPFRAC = "clip fraction (PPO range, both sides)"
CURVES = ["reward/mean", "response_length/clip_ratio", "response_length/mean", "actor/entropy", CLIPFRAC,
          "eval/acc_avg"]
# the share of tokens clipped at 1 - eps_low or 1 + eps_high: ours logs each side, verl their sum
# (verl's actor/pg_clipfrac_lower is the dual clip's share, another quantity)
CLIP_SOURCES = {"native": ("actor/pg_clipfrac_higher", "actor/pg_clipfrac_lower"), "verl": ("actor/pg_clipfrac",)}
TIMING = ["timing_s/step", "timing_s/gen", "timing_s/update_actor"]


def _ci(iv) -> str:
    return f"{iv.mean:+.4g} [{iv.lo:+.4g}, {iv.hi:+.4g}]" + (f" (p {iv.p:.2g})" if iv.p == iv.p else "")


def load(native: str, verl: str, arms: tuple[str, str] = (OFF, ON)):
    """Both sweeps: the runs of the two ``arms`` (one row per run, ``engine`` added) and the per-step history."""
    runs, hist = [], []
    for engine, path in (("native", native), ("verl", verl)):
        rs = load_runs(path)
        runs.append(rs.runs.assign(engine=engine))
        h = rs.history.assign(engine=engine)
        clip = h[h.metric.isin(CLIP_SOURCES[engine])].groupby(["run", "label", "seed", "step", "engine"],
                                                             as_index=False).value.sum()
        hist += [h, clip.assign(metric=CLIPFRAC)]
    runs = pd.concat(runs, ignore_index=True)
    runs = runs[runs.label.isin(arms)]
    return runs, pd.concat(hist, ignore_index=True)


def load_recorded(native_csv: str, verl_csv: str, arms: tuple[str, str] = (OFF, ON)) -> pd.DataFrame:
    """The runs of the two ``arms`` as two committed results recorded them (their ``runs.csv``: one row per run, its
    endpoints, commit and base identity), ``engine`` set per file; a cross-engine result's file (its ``engine``
    column naming the trainers, not a sweep's rollout engine) gives only its rows of that engine. A file with no run of an arm is refused (a wrong file, not an empty arm)."""
    parts = []
    for engine, path in (("native", native_csv), ("verl", verl_csv)):
        rs = pd.read_csv(path)
        if "engine" in rs and rs.engine.isin(["native", "verl"]).all():
            rs = rs[rs.engine == engine]
        rs = rs.assign(engine=engine)
        missing = [a for a in arms if not (rs.label == a).any()]
        if missing:
            raise SystemExit(f"error: {path} holds no {engine} run of the arm(s) {missing}")
        parts.append(rs)
    runs = pd.concat(parts, ignore_index=True)
    return runs[runs.label.isin(arms)]


def _values(runs: pd.DataFrame, engine: str, label: str, col: str) -> pd.Series:
    sel = runs[(runs.engine == engine) & (runs.label == label)].set_index("seed")
    return sel[col].astype(float) * ENDPOINTS[col][1] if col in sel else pd.Series(dtype=float)


def arms_table(runs: pd.DataFrame, arms: tuple[str, str] = (OFF, ON)) -> str:
    lines = ["| endpoint | engine | " + " | ".join(f"{a} (mean ± sd, n)" for a in arms) + " |",
             "|---|---|---|---|"]
    for col, (name, _) in ENDPOINTS.items():
        for engine in ("native", "verl"):
            cells = []
            for arm in arms:
                v = _values(runs, engine, arm, col).dropna()
                cells.append(f"{v.mean():.4g} ± {v.std(ddof=1):.2g} ({len(v)})" if len(v) else "-")
            lines.append(f"| {name} | {engine} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def effects_table(runs: pd.DataFrame, arms: tuple[str, str] = (OFF, ON)) -> str:
    off_arm, on_arm = arms
    lines = [f"| endpoint | native: {on_arm} - {off_arm} [95% CI] | verl: {on_arm} - {off_arm} [95% CI] | verl effect - "
             "native effect |",
             "|---|---|---|---|"]
    for col, (name, _) in ENDPOINTS.items():
        diffs, cells = {}, []
        for engine in ("native", "verl"):
            on, off = _values(runs, engine, on_arm, col), _values(runs, engine, off_arm, col)
            diffs[engine] = (on - off.reindex(on.index)).dropna()
            cells.append(_ci(paired_difference(on, off)) + f", n {len(diffs[engine])}")
        cells.append(_ci(welch_difference(diffs["verl"], diffs["native"])))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def engines_table(runs: pd.DataFrame, arms: tuple[str, str] = (OFF, ON)) -> str:
    lines = ["| endpoint | arm | native | verl | verl - native [95% CI, Welch] |", "|---|---|---|---|---|"]
    for col, (name, _) in ENDPOINTS.items():
        for arm in arms:
            a, b = _values(runs, "verl", arm, col), _values(runs, "native", arm, col)
            lines.append(f"| {name} | {arm} | {b.mean():.4g} | {a.mean():.4g} | {_ci(welch_difference(a, b))} |")
    return "\n".join(lines)


def timing_table(runs: pd.DataFrame, hist: pd.DataFrame) -> str:
    lines = ["| engine | " + " | ".join(f"{k} (median s)" for k in TIMING) + " | wall s per run (median) | runs |",
             "|---|---|---|---|---|---|"]
    for engine in ("native", "verl"):
        h = hist[(hist.engine == engine) & (hist.step > 0)]
        med = [h[h.metric == k].value.median() for k in TIMING]
        wall = runs[runs.engine == engine].get("wall_time_s", pd.Series(dtype=float)).median()
        lines.append(f"| {engine} | " + " | ".join(f"{m:.2f}" for m in med) + f" | {wall:.0f} |"
                     f" {(runs.engine == engine).sum()} |")
    return "\n".join(lines)


def curves(hist: pd.DataFrame, path: Path, arms: tuple[str, str] = (OFF, ON), title: str = TITLE) -> None:
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    styles = {("native", arms[0]): ("C0", "-"), ("native", arms[1]): ("C1", "-"),
              ("verl", arms[0]): ("C0", "--"), ("verl", arms[1]): ("C1", "--")}
    for ax, metric in zip(axes.flat, CURVES):
        for (engine, arm), (color, ls) in styles.items():
            h = hist[(hist.engine == engine) & (hist.label == arm) & (hist.metric == metric)]
            if h.empty:
                continue
            m = h.groupby("step").value.mean()
            ax.plot(m.index, m.values, color=color, ls=ls, marker="o" if metric.startswith("eval/") else None,
                    label=f"{engine} {arm} (n {h.run.nunique()})")
        ax.set_title(metric)
        ax.set_xlabel("rollout step")
    # the legend on the first panel that drew a line (an arm may lack the first panel's metric: an empty legend
    # there was matplotlib's "No artists with labels" warning)
    if (drawn := next((ax for ax in axes.flat if ax.get_legend_handles_labels()[0]), None)) is not None:
        drawn.legend(fontsize=8)
    fig.suptitle(f"{title}: dapo-exp (solid) and verl 0.9.1 (dashed), mean over seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("native")
    ap.add_argument("verl")
    ap.add_argument("out", type=Path)
    ap.add_argument("--arms", default=f"{OFF},{ON}", help="the two arms' labels, fix off first")
    ap.add_argument("--title", default=TITLE, help="the curves' title")
    args = ap.parse_args(argv)
    arms = tuple(args.arms.split(","))
    if len(arms) != 2:
        ap.error("--arms takes two labels, fix off first")
    out = args.out
    os.makedirs(out, exist_ok=True)
    recorded = args.native.endswith(".csv") and args.verl.endswith(".csv")
    runs, hist = (load_recorded(args.native, args.verl, arms), None) if recorded else load(args.native, args.verl, arms)
    cols = ["engine", "label", "seed", *[c for c in ENDPOINTS if c in runs], "wall_time_s", "git_commit", BASE_WEIGHTS,
            "run"]
    runs[[c for c in cols if c in runs]].sort_values(["engine", "label", "seed"]).to_csv(out / "runs.csv", index=False)
    parts = {"arms.md": arms_table(runs, arms), "effects.md": effects_table(runs, arms),
             "engines.md": engines_table(runs, arms)}
    if hist is not None:
        parts["timing.md"] = timing_table(runs, hist)
    for name, text in parts.items():
        (out / name).write_text(text + "\n")
        print(f"## {name}\n{text}\n")
    if hist is None:
        print("(recorded runs: timing.md and curves.png need the run directories' per-step histories: not written)")
    else:
        curves(hist, out / "curves.png", arms, args.title)
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
