"""Training curves per configuration: mean over seeds with a band, against step or compute.

The band is by default the 95% Student-t interval of the mean over seeds at each point, the
same interval the table gives (``band="ci"``; clipped to the metric's range, none with one seed);
``minmax`` (min-max across seeds) and ``sd`` (± 1 sd) are there on request. Accuracy is drawn
in percent, as in the table; every y axis names its unit (:data:`CURVE_UNITS`).

Figures are plain :class:`matplotlib.figure.Figure` objects drawn with the Agg
canvas (no pyplot, no GUI backend), so they work the same in a notebook, a
script or a Hydra callback. Each configuration label keeps one colour in every
figure (:func:`label_color`).

x axes (:data:`X_AXES`):

- ``step``: the training step;
- ``rollouts``: rollouts generated so far (``compute/rollouts_total``);
- ``tokens``: response tokens generated so far (``compute/gen_tokens_total``).

The compute axes compare configurations at equal generation cost (dynamic
sampling generates more per step). An eval point at step s is placed at the
compute of the last training step <= s (0 before the first step). On a compute
axis the seeds of a configuration are interpolated onto a common grid, over the
range that every seed covers, before the mean and the band are taken.
"""

from __future__ import annotations

import colorsys
import hashlib
import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from scipy import stats

from dapo_exp import rundir
from dapo_exp.analysis.runs import RunSet
from dapo_exp.analysis.table import LADDER, order_labels

X_AXES = {"step": None, "rollouts": rundir.CUM_ROLLOUTS, "tokens": rundir.CUM_TOKENS}
X_LABELS = {
    "step": "training step",
    "rollouts": "rollouts generated (compute/rollouts_total)",
    "tokens": "response tokens generated (compute/gen_tokens_total)",
}
CURVE_METRICS: tuple[str, ...] = (
    rundir.EVAL_ACC,
    rundir.ENTROPY,
    rundir.RESP_LEN,
    rundir.TRUNC,
    rundir.CLIP_HIGH,
    rundir.CLIP_LOW,
    rundir.ZERO_VAR,
    rundir.GEN_ROUNDS,
)
BANDS = {
    "ci": "band: 95% t-interval of the mean over seeds (as the table)",
    "minmax": "band: min–max across seeds",
    "sd": "band: mean ± 1 sd across seeds",
}
DEFAULT_BAND = "ci"
# a panel's title: what the metric is, in words (the logged key stays on the y axis's unit line)
PANEL_TITLES: dict[str, str] = {
    rundir.EVAL_ACC: "held-out accuracy",
    rundir.EVAL_PASS: "held-out pass@k",
    rundir.EVAL_MAJ: "held-out majority vote",
    rundir.ENTROPY: "policy entropy",
    rundir.RESP_LEN: "response length",
    rundir.TRUNC: "truncated responses (at the cap)",
    rundir.CLIP_HIGH: "tokens clipped above (Clip-Higher's side)",
    rundir.CLIP_LOW: "tokens clipped below",
    rundir.ZERO_VAR: "groups with equal rewards (Dynamic Sampling's target)",
    rundir.GEN_ROUNDS: "generation rounds per step (Dynamic Sampling)",
}
# line styles cycled over the configurations: curves that overlap stay apart by style as well as colour
LINE_STYLES = ("-", "--", "-.", ":")
# y axis of each metric: (scale from the logged value, label with unit, range in logged units or None)
CURVE_UNITS: dict[str, tuple[float, str, tuple[float, float] | None]] = {
    rundir.EVAL_ACC: (100.0, "avg@k accuracy (%)", (0.0, 1.0)),
    rundir.EVAL_PASS: (100.0, "pass@k (%)", (0.0, 1.0)),
    rundir.EVAL_MAJ: (100.0, "maj@k (%)", (0.0, 1.0)),
    rundir.ENTROPY: (1.0, "entropy (nats / token)", (0.0, math.inf)),
    rundir.RESP_LEN: (1.0, "response length (tokens)", (0.0, math.inf)),
    rundir.TRUNC: (1.0, "truncated (fraction of responses)", (0.0, 1.0)),
    rundir.CLIP_HIGH: (1.0, "clipped high (fraction of tokens)", (0.0, 1.0)),
    rundir.CLIP_LOW: (1.0, "clipped low (fraction of tokens)", (0.0, 1.0)),
    rundir.ZERO_VAR: (1.0, "zero-variance groups (fraction)", (0.0, 1.0)),
    rundir.GEN_ROUNDS: (1.0, "generation rounds per step", (1.0, math.inf)),
}


def y_unit(metric: str) -> tuple[float, str, tuple[float, float] | None]:
    """(scale, y label, range) of a metric; unknown metrics: unscaled, labelled with their name."""
    return CURVE_UNITS.get(metric, (1.0, metric, None))

# Fixed colours for the named presets; the ladder runs along a sequential map
# (dark = naive GRPO, bright = DAPO). Any other label gets a colour from a hash
# of its name: the same label has the same colour in every figure and session.
PRESET_COLORS = {
    "grpo": "#7f7f7f",
    "clip": "#1f77b4",
    "clip_ds": "#2ca02c",
    "full": "#d62728",
    "full_no_clip": "#9467bd",
    "full_no_ds": "#8c564b",
    "full_no_tl": "#e377c2",
    "full_no_sop": "#bcbd22",
}
_LADDER_COLORS = ("#440154", "#414487", "#2a788e", "#22a884", "#7ad151", "#fde725")
PRESET_COLORS.update(dict(zip(LADDER, _LADDER_COLORS)))


def label_color(label: str) -> str:
    """The colour of a configuration label (stable across figures, runs and sessions)."""
    if label in PRESET_COLORS:
        return PRESET_COLORS[label]
    h = int(hashlib.md5(label.encode()).hexdigest()[:8], 16)
    hue = (h % 3600) / 3600.0
    light = 0.38 + 0.14 * ((h >> 12) % 3) / 2
    r, g, b = colorsys.hls_to_rgb(hue, light, 0.75)
    return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"


def label_colors(labels) -> dict[str, str]:
    return {label: label_color(label) for label in labels}


def _history(data: RunSet | pd.DataFrame, included_only: bool = True) -> pd.DataFrame:
    if isinstance(data, RunSet):
        h = data.history
        if included_only and len(data.runs):
            h = h[h["run"].isin(data.included["run"])]
        return h
    return data


def xy_frame(history: RunSet | pd.DataFrame, metric: str, x: str = "step") -> pd.DataFrame:
    """One metric against an x axis, per run: columns run, label, seed, x, y (sorted by run, x).

    ``history``: a :class:`RunSet` (its included runs) or a history frame (all its rows).
    """
    history = _history(history)
    if x not in X_AXES:
        raise ValueError(f"x={x!r}: choose one of {', '.join(X_AXES)}")
    y = history[history["metric"] == metric][["run", "label", "seed", "step", "value"]].rename(columns={"value": "y"})
    if x == "step":
        out = y.assign(x=y["step"].astype(float))
    else:
        c = history[history["metric"] == X_AXES[x]][["run", "step", "value"]].rename(columns={"value": "x"})
        parts = []
        for run, g in y.groupby("run", sort=False):
            cx = c[c["run"] == run].sort_values("step")
            g = g.sort_values("step")
            if not len(cx):
                continue
            m = pd.merge_asof(g, cx[["step", "x"]], on="step", direction="backward")
            m["x"] = m["x"].fillna(0.0)
            parts.append(m)
        out = pd.concat(parts, ignore_index=True) if parts else y.assign(x=np.nan).iloc[:0]
    return out[["run", "label", "seed", "x", "y"]].sort_values(["run", "x"]).reset_index(drop=True)


def curve_frame(
    history: RunSet | pd.DataFrame,
    metric: str,
    x: str = "step",
    band: str = DEFAULT_BAND,
    confidence: float = 0.95,
    bounds: tuple[float, float] | None = None,
) -> pd.DataFrame:
    """Per configuration and x: ``mean`` over seeds, band ``lo``/``hi`` and ``n`` seeds (logged units).

    ``band="ci"``: the Student-t ``confidence`` interval of the mean (NaN for one seed), clipped
    to ``bounds`` (default: the metric's range, :data:`CURVE_UNITS`); ``"minmax"``: min and max
    across seeds; ``"sd"``: mean ± 1 sample sd (0 for one seed).
    On the step axis the seeds are aligned by step; on a compute axis they are
    linearly interpolated onto the union of their x values within the range all
    seeds cover.
    """
    if band not in BANDS:
        raise ValueError(f"band={band!r}: choose one of {', '.join(BANDS)}")
    xy = xy_frame(history, metric, x)
    frames = []
    for label, g in xy.groupby("label", sort=False):
        if x == "step":
            wide = g.pivot_table(index="x", columns="run", values="y", aggfunc="last")
        else:
            runs = [r.drop_duplicates("x", keep="last") for _, r in g.groupby("run")]
            lo_x = max(r["x"].min() for r in runs)
            hi_x = min(r["x"].max() for r in runs)
            grid = np.unique(np.concatenate([r["x"].to_numpy() for r in runs]))
            grid = grid[(grid >= lo_x) & (grid <= hi_x)]
            wide = pd.DataFrame(
                {name: np.interp(grid, r["x"], r["y"]) for name, r in zip([r["run"].iloc[0] for r in runs], runs)},
                index=pd.Index(grid, name="x"),
            )
        n = wide.notna().sum(axis=1)
        mean = wide.mean(axis=1)
        if band == "ci":
            sem = wide.std(axis=1, ddof=1) / np.sqrt(n)
            q = pd.Series(stats.t.ppf((1 + confidence) / 2, np.maximum(n - 1, 1)), index=n.index).where(n > 1)
            lo, hi = mean - q * sem, mean + q * sem
            rng = bounds if bounds is not None else y_unit(metric)[2]
            if rng is not None:
                lo, hi = lo.clip(lower=rng[0]), hi.clip(upper=rng[1])
        elif band == "minmax":
            lo, hi = wide.min(axis=1), wide.max(axis=1)
        else:
            sd = wide.std(axis=1, ddof=1).fillna(0.0)
            lo, hi = mean - sd, mean + sd
        frames.append(pd.DataFrame({"label": label, "x": wide.index.to_numpy(), "mean": mean.to_numpy(),
                                    "lo": lo.to_numpy(), "hi": hi.to_numpy(), "n": n.to_numpy()}))
    if not frames:
        return pd.DataFrame(columns=["label", "x", "mean", "lo", "hi", "n"])
    return pd.concat(frames, ignore_index=True)


def plot_curves(
    data: RunSet | pd.DataFrame,
    *,
    metrics: Sequence[str] = CURVE_METRICS,
    x: str = "step",
    band: str = DEFAULT_BAND,
    labels: Sequence[str] | None = None,
    ncols: int = 4,
) -> Figure:
    """A grid of panels, one per metric: mean over seeds (line) and the band, per configuration.

    y values are scaled to the table's unit (accuracy in %) and the axis names the unit.

    ``data``: a :class:`RunSet` (its included runs) or a history frame. A metric
    that no run logged gets an empty panel saying so.
    """
    hist = _history(data)
    present = order_labels(hist["label"].unique()) if len(hist) else []
    labels = [l for l in (labels or present) if l in present]
    nrows = max(1, int(np.ceil(len(metrics) / ncols)))
    fig = Figure(figsize=(4.2 * ncols, 3.2 * nrows + 0.9), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    n_seeds = hist.groupby("label")["run"].nunique().to_dict() if len(hist) else {}
    styles = {label: LINE_STYLES[i % len(LINE_STYLES)] for i, label in enumerate(labels)}
    for ax, metric in zip(axes, metrics):
        cf = curve_frame(hist, metric, x, band) if len(hist) else pd.DataFrame()
        scale, ylabel, _ = y_unit(metric)
        ax.set_title(PANEL_TITLES.get(metric, metric), fontsize=10)
        ax.set_xlabel(X_LABELS[x], fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(alpha=0.3)
        if not len(cf):
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="0.5")
            continue
        for label in labels:
            c = cf[cf["label"] == label]
            if not len(c):
                continue
            color = label_color(label)
            marker = "o" if metric.startswith("eval/") else None
            ax.plot(c["x"], c["mean"] * scale, color=color, ls=styles[label], lw=1.6, marker=marker, ms=3,
                    label=label)
            if (c["n"] > 1).any():
                ax.fill_between(c["x"], c["lo"] * scale, c["hi"] * scale, color=color, alpha=0.18, lw=0)
    for ax in axes[len(metrics) :]:
        ax.set_visible(False)
    handles = [
        _line(label_color(l), f"{l} (n={n_seeds.get(l, 0)})", styles[l]) for l in labels
    ]
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 6), fontsize=8, frameon=False)
    ran = what_ran(data)
    fig.suptitle((f"{ran}\n" if ran else "") + curves_title(x, band, [n_seeds.get(l, 0) for l in labels]),
                 fontsize=11)
    return fig


def what_ran(data: RunSet | pd.DataFrame) -> str:
    """What the figure shows runs of: sweep, task, model and engine of the included runs ("" for a bare
    history frame, which does not say)."""
    if not isinstance(data, RunSet) or not len(data.runs):
        return ""
    runs = data.included if len(data.included) else data.runs
    parts = []
    for col, name in (("sweep", "sweep"), ("task", "task"), ("model", "model"), ("engine", "rollout")):
        if col in runs:
            vals = sorted({str(v) for v in runs[col].dropna()})
            if vals:
                parts.append(f"{name} {'/'.join(vals)}")
    return " · ".join(parts)


def curves_title(x: str, band: str, seeds: Sequence[int]) -> str:
    """The figure's title: the x axis, what the line is and the band, as far as the seeds allow one
    (``seeds``: the number of runs of each configuration drawn)."""
    if seeds and max(seeds) <= 1:
        return f"vs {X_LABELS[x]}: one run per configuration (one seed), so no band"
    if seeds and min(seeds) <= 1:
        return f"vs {X_LABELS[x]} — line: mean over seeds; {BANDS[band]} (configurations with 2+ seeds)"
    return f"vs {X_LABELS[x]} — line: mean over seeds; {BANDS[band]}"


def _line(color: str, text: str, ls: str = "-"):
    from matplotlib.lines import Line2D

    return Line2D([], [], color=color, ls=ls, lw=2, label=text)


def write_figures(
    data: RunSet | pd.DataFrame,
    out_dir: str | os.PathLike,
    *,
    axes: Sequence[str] = tuple(X_AXES),
    band: str = DEFAULT_BAND,
    metrics: Sequence[str] = CURVE_METRICS,
    formats: Sequence[str] = ("png", "svg"),
) -> list[Path]:
    """Write ``curves_vs_<axis>.{png,svg}`` for each x axis; returns the files written.

    A compute axis that no run logged is skipped.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hist = _history(data)
    written = []
    for x in axes:
        if X_AXES[x] is not None and not (hist["metric"] == X_AXES[x]).any():
            continue
        fig = plot_curves(data, metrics=metrics, x=x, band=band)
        for fmt in formats:
            p = out / f"curves_vs_{x}.{fmt}"
            fig.savefig(p, dpi=130)
            written.append(p)
    return written
