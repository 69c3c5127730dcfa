"""Which fix mattered when the configurations are not a two-level design: rungs of a ladder, or all pairs.

The comparison table gives each configuration against the baseline. When the configurations form a
**ladder** (they can be ordered so that each one's set of enabled switches strictly contains the
previous one's: ``grpo < clip < clip_ds < full``, or the paper's ``paper_1_grpo`` ... ``paper_6_dapo``),
the question is rather what each added fix did given the ones below it: :func:`rung_contrasts`
gives every rung against the one below, the difference of the endpoint accuracy (the table's
``final_acc``, in pp) of rung k minus rung k-1 with its interval, test, MDE and verdict, computed
exactly as the table's difference to the baseline (:func:`dapo_exp.analysis.stats.difference`:
paired t by seed when the seeds match, else Welch; :func:`dapo_exp.analysis.verdicts.compare`).
Rows whose switches are the same (split by another config key, ``clip [train.steps=4]``) are never
rungs of one another: such a set is not a ladder.

A set that is neither a ladder nor a two-level design (a full factorial or a regular fraction,
:func:`dapo_exp.analysis.design.describe_design`, whose main effects and interactions
:mod:`dapo_exp.analysis.effects` estimates) gets :func:`pairwise_contrasts`: every pair, with the
p-values Holm-adjusted over the pairs (``statsmodels.stats.multitest.multipletests``) and the
verdict read from the adjusted p. A two-level design gets no contrasts here.

:func:`configuration_contrasts` picks the one that applies; :func:`write_contrasts` writes ``contrasts.md`` and
``contrasts.csv``; :func:`contrasts_text` is the block the report prints before the table; :func:`plot_contrasts`
is the forest the analysis draws as ``figures/effects_forest.png`` for a ladder or an irregular set (one row
per contrast with its interval: :func:`dapo_exp.analysis.effects.forest_figure`).
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from dapo_exp.analysis import verdicts
from dapo_exp.analysis.runs import RunSet, order_labels
from dapo_exp.analysis.stats import difference

LADDER_KIND = "ladder"
TWO_LEVEL = "two-level"
IRREGULAR = "irregular"
SINGLE = "one configuration"
NOT_MEASURED = "not measured (1 seed)"  # the table's verdict where an arm has one seed
TWO_LEVEL_KINDS = ("full factorial", "regular fraction")


def _inc(data: RunSet | pd.DataFrame) -> pd.DataFrame:
    """The included runs with an endpoint accuracy."""
    from dapo_exp.analysis.table import DIFF_KEY, TABLE_METRICS, _runs_frame

    runs = _runs_frame(data)
    if not len(runs):
        return runs
    src = next(m.source for m in TABLE_METRICS if m.key == DIFF_KEY)
    inc = runs[runs["included"].astype(bool)]
    return inc[inc[src].notna()] if src in inc else inc.iloc[:0]


def configuration_switches(data: RunSet | pd.DataFrame) -> dict[str, frozenset[str]]:
    """The enabled switches of each configuration (table row) with included runs, in the table's order."""
    from dapo_exp.fixes import FIXES

    inc = _inc(data)
    if not len(inc):
        return {}
    names = [n for n in FIXES if n in inc]
    out = {}
    for label in order_labels(inc["label"]):
        g = inc[inc["label"] == label]
        out[label] = frozenset(n for n in names if bool(g[n].fillna(False).astype(bool).any()))
    return out


def ladder(data: RunSet | pd.DataFrame) -> list[str] | None:
    """The configurations ordered as a ladder (each one's switch set strictly contains the previous
    one's), or None when they are not one (fewer than two, or two with the same switches)."""
    return ladder_order(configuration_switches(data))


def ladder_order(sets: dict[str, frozenset[str]]) -> list[str] | None:
    """The labels of ``sets`` (label -> enabled switches) ordered as a ladder, or None (:func:`ladder`)."""
    if len(sets) < 2:
        return None
    order = sorted(sets, key=lambda lbl: len(sets[lbl]))  # stable: the table's order among equal sizes
    if all(sets[a] < sets[b] for a, b in zip(order, order[1:])):
        return order
    return None


def contrast_kind(data: RunSet | pd.DataFrame) -> str:
    """``ladder``, ``two-level`` (a full factorial or regular fraction over the switches: the effects
    apply), ``irregular`` (anything else: all pairs) or ``one configuration``."""
    sets = configuration_switches(data)
    if len(sets) < 2:
        return SINGLE
    if ladder(data) is not None:
        return LADDER_KIND
    if len(set(sets.values())) == len(sets):  # distinct switch states: maybe a two-level design
        from dapo_exp.analysis.design import describe_design, switches_in

        switches = switches_in(_inc(data))
        points = pd.DataFrame([{s: s in on for s in switches} for on in sets.values()])
        if describe_design(points, switches).kind in TWO_LEVEL_KINDS:
            return TWO_LEVEL
    return IRREGULAR


def _names(switches, field: str = "title") -> str:
    from dapo_exp.fixes import FIXES

    ordered = [n for n in FIXES if n in switches]
    return (" + " if field == "title" else "+").join(getattr(FIXES[n], field) for n in ordered)


def _compare(inc: pd.DataFrame, label: str, vs: str, confidence: float, margin: float | None,
             sequential: dict | None = None) -> dict[str, object]:
    """``label`` minus ``vs`` on the endpoint accuracy, as the table's difference to the baseline (a sequential
    sweep's: its anytime-valid interval, :func:`dapo_exp.analysis.table._anytime_columns`)."""
    from dapo_exp.analysis.table import DIFF_KEY, TABLE_METRICS, _anytime_columns, _per_seed

    m = next(m for m in TABLE_METRICS if m.key == DIFF_KEY)
    a, b = _per_seed(inc, label, m), _per_seed(inc, vs, m)
    iv = difference(a, b, confidence)
    v = verdicts.compare(a, b, margin if m.scale == 100.0 else None)
    verdict = (NOT_MEASURED if min(len(a), len(b)) < 2 else verdicts.verdict_word(iv.lo, iv.hi, iv.n))
    out = {"diff": iv.mean, "lo": iv.lo, "hi": iv.hi, "n": iv.n, "test": iv.test, "p": iv.p, "note": iv.note,
           "mde": v["mde"], "r": v["r"], "tost_p": v["tost_p"], "equivalence": v["equivalence"], "verdict": verdict}
    if sequential is not None:
        d = f"d_{DIFF_KEY}"
        row: dict[str, object] = {"d_margin": margin if margin is not None else np.nan}
        _anytime_columns(row, a, b, sequential)
        out.update({"diff": row[d], "lo": row[f"{d}_lo"], "hi": row[f"{d}_hi"], "n": row[f"{d}_n"],
                    "test": row["d_test"], "p": np.nan, "mde": np.nan, "tost_p": np.nan,
                    "equivalence": row["d_equivalence"], "verdict": row["d_verdict"]})
    return out


_RUNG_COLUMNS = ["step", "rung", "vs", "added", "added_short", "diff", "lo", "hi", "n", "test", "p", "note", "mde",
                 "r", "tost_p", "equivalence", "verdict"]
_PAIR_COLUMNS = ["config", "vs", "added", "removed", "diff", "lo", "hi", "n", "test", "p", "p_holm", "note", "mde",
                 "r", "tost_p", "equivalence", "verdict"]


def _attrs(df: pd.DataFrame, data, kind: str, confidence: float, margin: float | None) -> pd.DataFrame:
    from dapo_exp.analysis.table import acc_name

    df.attrs.update({"kind": kind, "confidence": confidence, "margin": margin,
                     "acc_name": acc_name(_inc(data))})
    return df


def rung_contrasts(data: RunSet | pd.DataFrame, *, confidence: float = 0.95,
                   margin: float | None = verdicts.DEFAULT_MARGIN) -> pd.DataFrame:
    """Each rung of the ladder against the one below (empty when the configurations are not a ladder).

    One row per rung k > 0: ``step`` (k), ``rung``, ``vs`` (rung k-1), ``added`` (the titles of the fixes
    rung k adds, joined by " + ") and ``added_short`` (their short names, "tl+sop"); ``diff``, ``lo``,
    ``hi`` (the ``confidence`` interval), ``n``, ``test`` and ``p``: endpoint accuracy of rung k minus
    rung k-1 in pp, paired t by seed when the seeds match, else Welch (``note``: "identical per seed"
    when the interval is undefined for that reason); ``mde``, ``r``, ``tost_p``, ``equivalence`` and
    ``verdict`` as the comparison table's (:mod:`dapo_exp.analysis.verdicts`). ``attrs["kind"]``.
    """
    order = ladder(data)
    if order is None:
        return _attrs(pd.DataFrame(columns=_RUNG_COLUMNS), data, contrast_kind(data), confidence, margin)
    inc = _inc(data)
    sets = configuration_switches(data)
    rows = []
    for k in range(1, len(order)):
        lo, hi = order[k - 1], order[k]
        added = sets[hi] - sets[lo]
        rows.append({"step": k, "rung": hi, "vs": lo, "added": _names(added), "added_short": _names(added, "short"),
                     **_compare(inc, hi, lo, confidence, margin, getattr(data, "sequential", None))})
    df = _attrs(pd.DataFrame(rows, columns=_RUNG_COLUMNS), data, LADDER_KIND, confidence, margin)
    if getattr(data, "sequential", None):
        df.attrs["sequential"] = data.sequential
    return df


def holm(p) -> np.ndarray:
    """Holm's step-down adjustment of the p-values ``p``; NaN stays NaN and is not counted."""
    p = np.asarray(p, dtype=float)
    out = np.full(p.shape, np.nan)
    ok = np.isfinite(p)
    if ok.any():
        from statsmodels.stats.multitest import multipletests

        out[ok] = multipletests(p[ok], method="holm")[1]
    return out


def pairwise_contrasts(data: RunSet | pd.DataFrame, *, confidence: float = 0.95,
                       margin: float | None = verdicts.DEFAULT_MARGIN, alpha: float = verdicts.ALPHA) -> pd.DataFrame:
    """Every pair of configurations: ``config`` minus ``vs`` (``vs`` the earlier in the table's order).

    Columns as :func:`rung_contrasts` (``added`` and ``removed``: the fixes ``config`` has and ``vs``
    lacks, and the reverse) plus ``p_holm``: ``p`` Holm-adjusted over the pairs with a p-value. The
    verdict reads the adjusted p: "difference shown" when ``p_holm < alpha``; the interval is the
    unadjusted one.
    """
    sets = configuration_switches(data)
    labels = list(sets)
    inc = _inc(data)
    rows = []
    for i, vs in enumerate(labels):
        for label in labels[i + 1:]:
            rows.append({"config": label, "vs": vs, "added": _names(sets[label] - sets[vs]),
                         "removed": _names(sets[vs] - sets[label]),
                         **_compare(inc, label, vs, confidence, margin, getattr(data, "sequential", None))})
    df = pd.DataFrame(rows, columns=_PAIR_COLUMNS)
    if len(df):
        df["p_holm"] = holm(df["p"].to_numpy(dtype=float))
        for i, r in df.iterrows():
            if np.isfinite(r["p_holm"]) and r["verdict"] in (verdicts.DIFFERENCE, verdicts.NO_DIFFERENCE):
                df.at[i, "verdict"] = verdicts.DIFFERENCE if r["p_holm"] < alpha else verdicts.NO_DIFFERENCE
    df = _attrs(df, data, contrast_kind(data) if len(sets) > 1 else SINGLE, confidence, margin)
    if getattr(data, "sequential", None):  # its anytime-valid intervals: no p, so no Holm
        df.attrs["sequential"] = data.sequential
    return df


def configuration_contrasts(data: RunSet | pd.DataFrame, **kw) -> pd.DataFrame:
    """The contrasts that apply: the rungs of a ladder, all pairs of an irregular set, else an empty frame
    (a two-level design: :func:`dapo_exp.analysis.effects.fit_effects`; one configuration: nothing)."""
    kind = contrast_kind(data)
    if kind == LADDER_KIND:
        return rung_contrasts(data, **kw)
    if kind == IRREGULAR:
        return pairwise_contrasts(data, **kw)
    return _attrs(pd.DataFrame(), data, kind, kw.get("confidence", 0.95), kw.get("margin", verdicts.DEFAULT_MARGIN))


# --------------------------------------------------------------------------- #
# Formatting and writing                                                        #
# --------------------------------------------------------------------------- #
def _delta(r) -> str:
    if not np.isfinite(r["diff"]):
        return "Δ n/a"
    if np.isfinite(r["lo"]) and np.isfinite(r["hi"]):
        return f"Δ {r['diff']:+.1f} ± {(r['hi'] - r['lo']) / 2:.1f} pp"
    note = r["note"] if isinstance(r["note"], str) and r["note"] else ""
    return f"Δ {r['diff']:+.1f} ± n/a pp" + (f" ({note})" if note else "")


def _mde(r) -> str:
    return f"MDE {r['mde']:.1f}" if np.isfinite(r["mde"]) else "MDE n/a"


def _caption(df: pd.DataFrame) -> str:
    conf = int(round(100 * df.attrs.get("confidence", 0.95)))
    acc = df.attrs.get("acc_name", "final acc")
    how = (f"difference of {acc} in pp with its {conf}% t interval: paired t by seed when the seeds match, else "
           "Welch's t (as the table's Δ); MDE: the difference the same test would detect with power 0.8 at "
           "alpha 0.05 (pp)")
    if df.attrs.get("sequential"):
        from dapo_exp.analysis.sequential import caption

        what = ("Rungs (each against the one below: the effect of the fixes added, given those below)."
                if df.attrs.get("kind") == LADDER_KIND else "Pairwise contrasts (every pair).")
        return f"{what} {caption(df.attrs['sequential'])}"
    if df.attrs.get("kind") == LADDER_KIND:
        return (f"Rungs (each against the one below: the effect of the fixes added, given those below; {how}; "
                "p unadjusted).")
    return (f"Pairwise contrasts (the configurations are neither a ladder nor a two-level design: every pair; {how}; "
            "p_holm: Holm-adjusted over the pairs; the verdict reads p_holm).")


def contrasts_text(df: pd.DataFrame, width: int = 120) -> str:
    """The block the report prints before the table: one line per rung,
    ``clip vs grpo (+Clip-Higher): Δ +5.0 ± 2.4 pp, paired t, n=3, MDE 3.3: no difference shown``.
    "" for anything but a ladder (pairs are in ``contrasts.md``), and for a ladder none of whose rungs is
    measured (one seed: the table's first line says so and what to run)."""
    if df.attrs.get("kind") != LADDER_KIND or not len(df) or (df["verdict"] == NOT_MEASURED).all():
        return ""
    conf = int(round(100 * df.attrs.get("confidence", 0.95)))
    lines = textwrap.wrap(f"Rungs (each against the one below; Δ {df.attrs.get('acc_name', 'final acc')}, "
                          f"{conf}% CI; MDE at power 0.8):", width)
    for _, r in df.iterrows():
        line = (f"{r['rung']} vs {r['vs']} (+{r['added']}): {_delta(r)}, {r['test']}, n={int(r['n'])}, {_mde(r)}: "
                f"{r['verdict']}")
        lines += textwrap.wrap(line, width, initial_indent="  ", subsequent_indent="    ", break_long_words=False,
                               break_on_hyphens=False)
    return "\n".join(lines) + "\n"


def format_contrasts(df: pd.DataFrame) -> pd.DataFrame:
    """The contrasts as strings (rungs or pairs), for Markdown."""
    ladder_ = df.attrs.get("kind") == LADDER_KIND
    out = []
    for _, r in df.iterrows():
        row = ({"rung": r["rung"], "vs": r["vs"], "added": r["added"]} if ladder_
               else {"config": r["config"], "vs": r["vs"], "added": r["added"], "removed": r["removed"]})
        row.update({"Δ (pp)": _delta(r).removeprefix("Δ ").removesuffix(" pp").replace(" pp (", " ("),
                    "test": r["test"], "n": int(r["n"]),
                    "p": "" if not np.isfinite(r["p"]) else f"{r['p']:.3g}"})
        if not ladder_:
            row["p_holm"] = "" if not np.isfinite(r["p_holm"]) else f"{r['p_holm']:.3g}"
        row["MDE (pp)"] = "" if not np.isfinite(r["mde"]) else f"{r['mde']:.1f}"
        row["verdict"] = r["verdict"]
        row["equivalence"] = r["equivalence"]
        out.append(row)
    return pd.DataFrame(out)


def contrasts_markdown(df: pd.DataFrame) -> str:
    """Caption and table of :func:`configuration_contrasts` (rungs or pairs)."""
    body = format_contrasts(df).to_markdown(index=False) if len(df) else "(no contrasts)"
    return f"**{_caption(df)}**\n\n{body}\n"


def write_contrasts(df: pd.DataFrame, out_dir: str | os.PathLike) -> dict[str, Path]:
    """``contrasts.md`` and ``contrasts.csv`` (numeric) when there are contrasts, else nothing."""
    if not len(df):
        return {}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"md": out / "contrasts.md", "csv": out / "contrasts.csv"}
    paths["md"].write_text(contrasts_markdown(df), encoding="utf-8")
    df.assign(kind=df.attrs.get("kind", "")).to_csv(paths["csv"], index=False)
    return paths


# --------------------------------------------------------------------------- #
# The forest figure                                                             #
# --------------------------------------------------------------------------- #
def _row_label(r, ladder_: bool, width: int = 46) -> str:
    """``clip_ds − clip (+ Dynamic Sampling)``; a pair names what each side has that the other lacks,
    ``full_no_tl − full_no_ds (+ Dynamic Sampling; − Token-level Policy Gradient Loss)``; wrapped."""
    if ladder_:
        head, what = f"{r['rung']} − {r['vs']}", [f"+ {r['added']}"]
    else:
        head = f"{r['config']} − {r['vs']}"
        what = [f"{sign} {r[col]}" for sign, col in (("+", "added"), ("−", "removed")) if r[col]]
    text = f"{head} ({'; '.join(what)})" if what else head
    return textwrap.fill(text, width, break_long_words=False, break_on_hyphens=False)


def _has_ci(r) -> bool:
    return bool(np.isfinite(r["lo"]) and np.isfinite(r["hi"]))


def _why_no_ci(r) -> str:
    if r["verdict"] == NOT_MEASURED:
        return "1 seed"
    return r["note"] if isinstance(r["note"], str) and r["note"] else "undefined"


def _row_note(r, ladder_: bool) -> str:
    """What the right axis says beside a row: the rung's MDE, the pair's Holm-adjusted p, or why the row
    has no interval."""
    if not _has_ci(r):
        return f"no CI: {_why_no_ci(r)}"
    if ladder_:
        return f"MDE {r['mde']:.1f}" if np.isfinite(r["mde"]) else "MDE n/a"
    return f"Holm p {r['p_holm']:.2g}" if np.isfinite(r["p_holm"]) else "Holm p n/a"


def _contrast_xlabel(df: pd.DataFrame, ladder_: bool) -> str:
    acc = df.attrs.get("acc_name", "final acc")
    conf = int(round(100 * df.attrs.get("confidence", 0.95)))
    with_ci = df[[_has_ci(r) for _, r in df.iterrows()]]
    if not len(with_ci):
        whys = sorted({_why_no_ci(r) for _, r in df.iterrows()})
        return f"difference of {acc} (pp): estimate only (no interval: {', '.join(whys)})"
    tests = " / ".join(sorted(set(with_ci["test"])))
    adj = "" if ladder_ else ", unadjusted"
    return f"difference of {acc} (pp): estimate and {conf}% CI ({tests}{adj})"


def _contrast_title(df: pd.DataFrame, ladder_: bool) -> str:
    if ladder_:
        head = f"Ladder, {len(df)} rungs: each rung against the one below (the fixes it adds, given those below)"
        key = "filled: difference shown (CI excludes 0); right: MDE (pp, power 0.8)"
    else:
        head = f"Pairwise contrasts, {len(df)} pairs (neither a ladder nor a two-level design)"
        key = "filled: difference shown (Holm p < 0.05, Holm over the pairs); right: Holm-adjusted p"
    return "\n".join(textwrap.wrap(head, 95, break_on_hyphens=False) + textwrap.wrap(key, 95, break_on_hyphens=False))


def plot_contrasts(df: pd.DataFrame):
    """Forest plot of :func:`configuration_contrasts` (a ladder's rungs or an irregular set's pairs): one
    row per contrast, top first, labelled with what it adds (and removes); the difference in pp with its
    interval (the same numbers as ``contrasts.md``), a zero line; the marker filled where the verdict is
    "difference shown" (a pair's verdict reads its Holm-adjusted p); on the right, each rung's MDE or
    each pair's Holm-adjusted p, or why a row has no interval (one seed). No row, no number: never text
    standing in for one."""
    from matplotlib.figure import Figure

    if not len(df):
        raise ValueError("no contrasts to draw (a two-level design: plot_effects; one configuration: nothing)")
    ladder_ = df.attrs.get("kind") == LADDER_KIND
    labels = [_row_label(r, ladder_) for _, r in df.iterrows()]
    n_lines = sum(lbl.count("\n") + 1 for lbl in labels)
    fig = Figure(figsize=(9.5, max(0.24 * n_lines + 0.16 * len(df) + 2.2, 2.8)), layout="constrained")
    ax = fig.subplots()
    ys = np.arange(len(df))[::-1]
    color = "#1f77b4"
    for y, (_, r) in zip(ys, df.iterrows()):
        xerr = [[r["diff"] - r["lo"]], [r["hi"] - r["diff"]]] if _has_ci(r) else None
        face = color if r["verdict"] == verdicts.DIFFERENCE else "white"
        ax.errorbar([r["diff"]], [y], xerr=xerr, fmt="o", color=color, mfc=face, ms=6, lw=2, capsize=3)
    ax.axvline(0.0, color="k", lw=0.8)
    ax.set_yticks(ys, labels, fontsize=8)
    ax.set_ylim(-0.7, len(df) - 0.3)
    ax.margins(x=0.15)
    ax.grid(axis="x", alpha=0.3)
    ax.set_xlabel(_contrast_xlabel(df, ladder_), fontsize=9)
    ax.set_title(_contrast_title(df, ladder_), fontsize=9)
    right = ax.twinx()
    right.set_ylim(ax.get_ylim())
    right.set_yticks(ys, [_row_note(r, ladder_) for _, r in df.iterrows()], fontsize=8)
    right.tick_params(axis="y", length=0)
    return fig
