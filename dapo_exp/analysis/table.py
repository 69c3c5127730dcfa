"""The comparison table in the form of Table 1 of the DAPO paper, one row per configuration.

Each cell is the mean over seeds with the half-width of its 95% Student-t
confidence interval (``mean ± t_{0.975, n-1} s / sqrt(n)``; "n/a" when n = 1).
Only runs with status ``finished`` count; failed and killed runs are reported
(``table.attrs["excluded"]``) and left out. The last columns give the
difference of final accuracy to the baseline row (``paper_1_grpo`` when the
ladder is present, else ``grpo``) with its own 95% CI: a paired t interval over
per-seed differences when both rows have the same seeds, Welch's t otherwise
(column ``Δ test``). The paper's AIME 2024 avg@32 of Qwen2.5-32B (Table 1's ladder and
the verl re-runs of the released recipe) stands in its own captioned block under the table
(:func:`paper_block`), never in a row beside our numbers: another model and another task. The
frame keeps ``paper_aime24`` / ``paper_row`` for the rows that have a counterpart there.

Small samples are shown as what they are: an interval is clipped to the metric's range where it
has one (accuracy in [0, 100], fractions in [0, 1]) and then printed as ``mean [lo, hi]``; a
difference whose per-seed values are identical has no interval ("n/a (identical per seed)", not
± 0.0); a warning line stands above a table with a row of fewer than 3 seeds.

``ci="bootstrap"``: the final accuracy and its difference to the baseline get the hierarchical
bootstrap interval over seeds, problems and samples (:mod:`dapo_exp.analysis.bootstrap`) instead
of the seed-only t interval; the other columns have no per-problem samples and keep theirs.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dapo_exp import rundir
from dapo_exp.analysis import verdicts
from dapo_exp.analysis.runs import RunSet, order_labels  # noqa: F401  (order_labels: part of this module's API)
from dapo_exp.analysis.stats import IDENTICAL_PAIRED, difference, t_interval
from dapo_exp.fixes import BASELINE, LADDER


@dataclass(frozen=True)
class TableMetric:
    """A column of the table: ``source`` (a runs-frame column) times ``scale``, shown with ``digits``.

    ``bounds``: the range of the metric in the table's unit (intervals are clipped to it), or None.
    """

    key: str
    header: str
    source: str
    scale: float = 1.0
    digits: int = 3
    bounds: tuple[float, float] | None = None


# The columns. "end": the training metric's last logged value (mean of the last
# `end_window` values, see load_runs); "avg": its mean over all logged steps.
TABLE_METRICS: tuple[TableMetric, ...] = (
    # the declared endpoint (eval.endpoint: the last evaluation, or the mean of the last k, as the
    # caption's first sentence says)
    TableMetric("final_acc", "final acc (%)", f"endpoint/{rundir.EVAL_ACC}", 100.0, 1, (0.0, 100.0)),
    TableMetric("best_acc", "best acc (%)", f"best/{rundir.EVAL_ACC}", 100.0, 1, (0.0, 100.0)),
    TableMetric("entropy", "entropy (end)", f"end/{rundir.ENTROPY}", 1.0, 3, (0.0, math.inf)),
    TableMetric("resp_len", "response length (end)", f"end/{rundir.RESP_LEN}", 1.0, 1, (0.0, math.inf)),
    TableMetric("truncated", "truncated frac (end)", f"end/{rundir.TRUNC}", 1.0, 3, (0.0, 1.0)),
    TableMetric("clip_high", "clipfrac higher (avg)", f"avg/{rundir.CLIP_HIGH}", 1.0, 4, (0.0, 1.0)),
    TableMetric("clip_low", "clipfrac lower (avg)", f"avg/{rundir.CLIP_LOW}", 1.0, 4, (0.0, 1.0)),
    TableMetric("zero_var", "zero-var groups (avg)", f"avg/{rundir.ZERO_VAR}", 1.0, 3, (0.0, 1.0)),
    TableMetric(
        "rollouts_per_trained", "rollouts / trained (avg)", f"avg/{rundir.ROLLOUTS_PER_TRAINED}", 1.0, 2,
        (1.0, math.inf),
    ),
)
# (wall time is not a column: it measures the machine's load as much as the configuration; runs.csv has
# each run's wall_time_s beside the load average at its start and end)
DIFF_KEY = "final_acc"
CIS = ("t", "bootstrap")
MIN_SEEDS = 3  # a row with fewer seeds gets the warning line

PAPER_HEADER = "paper AIME24 avg@32 (Qwen2.5-32B)"
# Table 1 of arXiv 2503.14476 (AIME 2024 avg@32, Qwen2.5-32B base) and the verl
# re-runs of the released recipe, keyed by our configuration label.
PAPER_AIME24: dict[str, tuple[float, str]] = {
    "paper_1_grpo": (30.0, "Table 1: naive GRPO"),
    "paper_2_of": (36.0, "Table 1: + overlong filtering"),
    "paper_3_clip": (38.0, "Table 1: + clip-higher"),
    "paper_4_sop": (41.0, "Table 1: + soft overlong punishment"),
    "paper_5_tl": (42.0, "Table 1: + token-level loss"),
    "paper_6_dapo": (50.0, "Table 1: + dynamic sampling (DAPO)"),
    "grpo": (30.0, "Table 1: naive GRPO"),
    "full": (52.0, "verl re-run: DAPO (released recipe)"),
    "full_no_ds": (50.0, "verl re-run: DAPO w/o dynamic sampling"),
    # switches clip_higher + overlong_punishment (dapo_exp.fixes.label: "clip+sop")
    "clip+sop": (44.0, "verl re-run: DAPO w/o token-level loss and dynamic sampling"),
}


def baseline_label(labels) -> str | None:
    """``paper_1_grpo`` when the ladder is present, else ``grpo``; None when neither is."""
    labels = set(labels)
    if LADDER[0] in labels:
        return LADDER[0]
    return BASELINE if BASELINE in labels else None


def acc_name(runs: pd.DataFrame) -> str:
    """The name of the accuracy column for these runs' declared endpoint (``eval.endpoint``): ``final
    acc`` (the last evaluation), ``acc last-<k> mean`` (every run declares ``last_k_mean`` and averages
    k evaluations: ``eval.endpoint_k``, or fewer in runs shorter than that), else ``endpoint acc`` (the
    caption names each run's)."""
    col = "config.eval.endpoint"
    if not len(runs) or col not in runs:
        return "final acc"
    names = set(runs[col].fillna("final"))
    if names == {"final"}:
        return "final acc"
    from dapo_exp.evaluation import endpoint_evals

    ks = set(endpoint_evals(runs))  # the evaluations each run's value averages (fewer than k in a short run)
    if ks == {1}:
        return "final acc"  # a "mean" of the last evaluation alone (eval.every=0) is the final evaluation
    if names == {"last_k_mean"} and len(ks) == 1:
        return f"acc last-{ks.pop()} mean"
    return "endpoint acc"


def base_weights_notes(runs: pd.DataFrame) -> list[str]:
    """A note when the runs start from more than one base policy (``config.model.base_sha256``, from
    ``summary.json``'s ``base_model``): rows of one label are split already, but differences between
    rows and the effects then compare runs from different base weights."""
    from dapo_exp.analysis.runs import BASE_WEIGHTS

    if not len(runs) or BASE_WEIGHTS not in runs or runs[BASE_WEIGHTS].dropna().nunique() < 2:
        return []
    by = runs.dropna(subset=[BASE_WEIGHTS]).groupby(BASE_WEIGHTS)["label"].unique()
    parts = "; ".join(f"{sha}: {', '.join(sorted(map(str, labels)))}" for sha, labels in by.items())
    return [f"the runs start from {len(by)} different base weights (model.base_sha256 {parts}): differences "
            f"between rows from different base weights mix the base policy into the fix's effect"]


def bootstrap_endpoint_check(runs: pd.DataFrame) -> None:
    """The hierarchical bootstrap resamples the final evaluation's samples: refuse runs whose declared
    endpoint is another (``eval.endpoint=last_k_mean``), whose table would otherwise mix the two."""
    name = acc_name(runs)
    if name != "final acc":
        raise ValueError(f"--ci bootstrap resamples the final evaluation's samples (eval_samples.jsonl), but these "
                         f"runs report {name} (eval.endpoint): use --ci t, or runs with eval.endpoint=final")


def _runs_frame(data: RunSet | pd.DataFrame) -> pd.DataFrame:
    from dapo_exp.analysis.runs import with_endpoint

    return with_endpoint(data.runs if isinstance(data, RunSet) else data)


def _per_seed(inc: pd.DataFrame, label: str, m: TableMetric) -> pd.Series:
    """The metric's value of each included run of ``label``, indexed by seed."""
    g = inc[inc["label"] == label]
    if m.source not in g:
        return pd.Series(dtype=float)
    return pd.Series(g[m.source].to_numpy(dtype=float) * m.scale, index=g["seed"].to_numpy()).dropna()


def _anytime_columns(row: dict[str, object], a: pd.Series, b: pd.Series, record: dict) -> None:
    """A sequential sweep's Δ: its anytime-valid interval and the verdict read from it (the fixed-sample MDE,
    TOST and p are not valid after a data-dependent stop: left out)."""
    from dapo_exp.analysis import sequential as seq
    from dapo_exp.analysis.sequential import anytime

    d = f"d_{DIFF_KEY}"
    iv = anytime(a, b, record)
    lo, hi = (x if np.isfinite(x) else np.nan for x in (iv.lo, iv.hi))
    row.update({d: iv.mean, f"{d}_lo": lo, f"{d}_hi": hi, f"{d}_n": iv.n, f"{d}_p": np.nan, f"{d}_mde": np.nan,
                f"{d}_tost_p": np.nan, "d_test": f"{seq.LABEL} (sequential)",
                "d_margin": float((record.get("rule") or {}).get("margin", np.nan))})  # the rule the sweep used
    row["d_equivalence"] = (f"equivalent within ±{row['d_margin']:g} pp ({seq.LABEL})" if iv.state == seq.EQUIVALENT
                            else "")
    row["d_verdict"] = {seq.DIFFERENT: "difference shown", seq.EQUIVALENT: "no difference shown"}.get(
        iv.state, "undecided" if iv.n >= 2 else "not measured (1 seed)")


def _row(label: str, runs: pd.DataFrame, inc: pd.DataFrame, metrics: tuple[TableMetric, ...], confidence: float,
         diff: TableMetric | None, baseline: str | None, margin: float = verdicts.DEFAULT_MARGIN,
         sequential: dict | None = None) -> tuple[dict[str, object], list[str]]:
    """One row of :func:`comparison_table` and its notes."""
    notes = []
    g = inc[inc["label"] == label]
    dup = sorted({str(s) for s in g["seed"][g["seed"].duplicated()]})
    if dup:
        notes.append(
            f"{label}: seed(s) {', '.join(dup)} appear in more than one run (another sweep, or another "
            "setting of a knob that is not a switch); each run counts as a sample and the difference is Welch's"
        )
    row: dict[str, object] = {
        "config": label,
        "n": int(len(g)),
        "seeds": ",".join(str(s) for s in sorted(g["seed"].tolist(), key=str)),
        "excluded": int(((runs["label"] == label) & ~runs["included"]).sum()),
    }
    for m in metrics:
        vals = _per_seed(inc, label, m)
        iv = t_interval(vals, confidence)
        lo, hi = _clip(iv.lo, iv.hi, m.bounds)
        sd = float(vals.std(ddof=1)) if len(vals) > 1 else np.nan
        row.update({m.key: iv.mean, f"{m.key}_lo": lo, f"{m.key}_hi": hi, f"{m.key}_n": iv.n, f"{m.key}_sd": sd})
    d = f"d_{DIFF_KEY}"
    row.update({d: np.nan, f"{d}_lo": np.nan, f"{d}_hi": np.nan, f"{d}_n": 0, f"{d}_p": np.nan, f"{d}_sd": np.nan,
                "d_test": "", "d_note": "", f"{d}_r": np.nan, f"{d}_mde": np.nan, f"{d}_tost_p": np.nan,
                "d_margin": np.nan, "d_equivalence": "", "d_verdict": ""})
    if diff is not None and baseline is not None and label != baseline and baseline in set(inc["label"]):
        a, b = _per_seed(inc, label, diff), _per_seed(inc, baseline, diff)
        iv = difference(a, b, confidence)
        row.update({d: iv.mean, f"{d}_lo": iv.lo, f"{d}_hi": iv.hi, f"{d}_n": iv.n, f"{d}_p": iv.p})
        row["d_test"], row["d_note"] = iv.test, iv.note
        if iv.test == "paired t" and iv.n > 1:
            row[f"{d}_sd"] = float((a - b.reindex(a.index)).dropna().std(ddof=1))
        v = verdicts.compare(a, b, margin if diff.scale == 100.0 else None)
        row.update({f"{d}_r": v["r"], f"{d}_mde": v["mde"], f"{d}_tost_p": v["tost_p"], "d_margin": v["margin"],
                    "d_equivalence": v["equivalence"]})
        row["d_verdict"] = ("not measured (1 seed)" if min(len(a), len(b)) < 2
                            else verdicts.verdict_word(iv.lo, iv.hi, iv.n))
        if sequential is not None:
            _anytime_columns(row, a, b, sequential)
    elif label == baseline:
        row["d_test"] = "baseline"
    paper = PAPER_AIME24.get(label)
    row["paper_aime24"] = paper[0] if paper else np.nan
    row["paper_row"] = paper[1] if paper else ""
    return row, notes


def comparison_table(
    data: RunSet | pd.DataFrame,
    *,
    baseline: str | None = None,
    metrics: tuple[TableMetric, ...] = TABLE_METRICS,
    confidence: float = 0.95,
    ci: str = "t",
    bootstrap: dict | None = None,
    margin: float = verdicts.DEFAULT_MARGIN,
) -> pd.DataFrame:
    """The comparison table, numeric: one row per configuration label (index ``config``).

    For each metric ``m`` of ``metrics``: ``m`` (mean over seeds), ``m_lo``/``m_hi``
    (Student-t ``confidence`` interval, clipped to the metric's ``bounds``; NaN when n = 1),
    ``m_n`` and ``m_sd`` (sd across seeds). ``ci="bootstrap"``: final accuracy and its difference
    from the hierarchical bootstrap (``bootstrap``: keyword arguments of
    :func:`dapo_exp.analysis.bootstrap.config_intervals`: B, seed, levels, kind). Then
    ``d_final_acc`` (+ ``_lo``, ``_hi``, ``_n``, ``_p``) and ``d_test``: final accuracy
    minus the baseline's, in percentage points, paired t by seed when the seeds match,
    Welch's t otherwise; ``paper_aime24`` and ``paper_row`` (NaN / "" where the
    configuration is not a row of the paper). ``n``: included runs; ``seeds``;
    ``excluded``: runs of that configuration left out (failed, killed, running).

    ``d_note``: why a difference has no interval although n >= 2 ("identical per seed").
    What a difference rules out (:mod:`dapo_exp.analysis.verdicts`): ``d_verdict`` ("difference
    shown", "no difference shown", "not measured (1 seed)"), ``d_final_acc_mde`` (the minimum
    detectable effect at power 0.8, alpha 0.05, at the observed spread and n, in pp),
    ``d_final_acc_tost_p`` and ``d_equivalence`` (two one-sided tests against ``±margin`` pp,
    ``d_margin``), ``d_final_acc_r`` (Pearson r of the two rows' per-seed values, paired only).
    ``attrs["one_seed"]``: the first line of a table whose every configuration has one seed.

    ``attrs``: ``baseline``, ``confidence``, ``ci``, ``n_excluded``, ``excluded`` (the excluded
    runs as records: run, label, seed, status, exclude_reason), ``notes`` (warnings, e.g. a seed
    that occurs twice in one configuration) and ``caption``.

    Runs are grouped by ``label`` alone (the switch states): runs that differ in
    another knob (model, lr, task) land in one row; analyse such sweeps separately.
    """
    if ci not in CIS:
        raise ValueError(f"ci={ci!r}: choose one of {', '.join(CIS)}")
    runs = _runs_frame(data)
    labels = order_labels(runs["label"]) if len(runs) else []
    inc = runs[runs["included"]] if len(runs) else runs
    if ci == "bootstrap":  # it resamples the final evaluation
        bootstrap_endpoint_check(inc)
    if baseline is None:
        baseline = baseline_label(inc["label"]) if len(inc) else None
    diff = next((m for m in metrics if m.key == DIFF_KEY), None)
    rows, notes = [], list(runs.attrs.get("notes", [])) + base_weights_notes(inc)  # split by config, base weights
    sequential = data.sequential if isinstance(data, RunSet) and ci == "t" else None  # its anytime-valid Δ
    for label in labels:
        row, note = _row(label, runs, inc, metrics, confidence, diff, baseline, margin, sequential)
        rows.append(row)
        notes += note
    table = pd.DataFrame(rows).set_index("config") if rows else pd.DataFrame(index=pd.Index([], name="config"))
    if ci == "bootstrap" and diff is not None and len(table):
        _bootstrap_columns(table, inc, diff, baseline, confidence, bootstrap or {})
    table.attrs.update({"sequential": sequential} if sequential is not None else {})
    return _finish(table, runs, inc, baseline=baseline, confidence=confidence, ci=ci, metrics=metrics, margin=margin,
                   notes=notes)


def _finish(table: pd.DataFrame, runs: pd.DataFrame, inc: pd.DataFrame, *, baseline, confidence, ci, metrics, margin,
            notes) -> pd.DataFrame:
    """The table's attrs (see :func:`comparison_table`), the one-seed line and the caption last."""
    excluded = runs[~runs["included"]] if len(runs) else runs
    table.attrs["baseline"] = baseline
    table.attrs["confidence"] = confidence
    table.attrs["ci"] = ci
    table.attrs["n_excluded"] = int(len(excluded))
    # plain records, not a DataFrame: pandas compares attrs when it concatenates frames
    table.attrs["excluded"] = (
        excluded[["run", "label", "seed", "status", "exclude_reason"]].to_dict("records") if len(excluded) else []
    )
    table.attrs["metrics"] = [m.key for m in metrics]
    table.attrs["margin"] = margin
    table.attrs["one_seed"] = verdicts.one_seed_line(table, inc, margin) if len(table) else ""
    table.attrs["notes"] = notes + table.attrs.get("notes", [])
    from dapo_exp.evaluation import endpoint_line

    table.attrs["endpoint"] = endpoint_line(inc)
    table.attrs["acc_name"] = acc_name(inc)
    table.attrs["caption"] = caption(table)
    return table


def _clip(lo: float, hi: float, bounds: tuple[float, float] | None) -> tuple[float, float]:
    if bounds is None or math.isnan(lo) or math.isnan(hi):
        return lo, hi
    return max(lo, bounds[0]), min(hi, bounds[1])


def _bootstrap_columns(table, inc, diff: TableMetric, baseline, confidence, kw) -> None:
    """Replace the final-accuracy interval and its difference by the hierarchical bootstrap's (in place)."""
    from dapo_exp.analysis import bootstrap as boot

    cube = boot.eval_cube(inc)
    kw = {"confidence": confidence, **kw}
    b = boot.config_intervals(cube, baseline=baseline, **kw)
    d = f"d_{DIFF_KEY}"
    for label in b.index:
        r = b.loc[label]
        lo, hi = _clip(r["acc_lo"], r["acc_hi"], diff.bounds)
        table.loc[label, [f"{DIFF_KEY}_lo", f"{DIFF_KEY}_hi"]] = [lo, hi]
        if "d_acc" in b and np.isfinite(r.get("d_acc", np.nan)):
            table.loc[label, [d, f"{d}_lo", f"{d}_hi", f"{d}_p"]] = [r["d_acc"], r["d_acc_lo"], r["d_acc_hi"],
                                                                   r["d_acc_p"]]
            table.loc[label, "d_test"] = r["d_test"]
            table.loc[label, "d_note"] = "" if np.isfinite(r["d_acc_lo"]) or r["d_acc_se"] != 0 else IDENTICAL_PAIRED
    for label in table.index:  # the verdict follows the interval shown
        if table.loc[label, "d_verdict"] in (verdicts.DIFFERENCE, verdicts.NO_DIFFERENCE):
            table.loc[label, "d_verdict"] = verdicts.verdict_word(
                table.loc[label, f"{d}_lo"], table.loc[label, f"{d}_hi"], int(table.loc[label, f"{d}_n"]))
    # the bootstrap's avg@k comes from the samples: it must be the summary's final accuracy
    gap = float((b["acc"] - table.loc[b.index, DIFF_KEY]).abs().max())
    table.attrs["bootstrap"] = {**b.attrs, "max_gap_to_summary_pp": gap}
    if gap > 0.05:
        table.attrs.setdefault("notes", []).append(
            f"the avg@k recomputed from eval_samples.jsonl differs from summary.json's final accuracy by up to "
            f"{gap:.2f} pp; the bootstrap intervals are centred on the samples' value"
        )


def warning_line(table: pd.DataFrame) -> str:
    """"**Warning: ...**" when a row has fewer than 3 seeds, else ""."""
    if not len(table) or "n" not in table:
        return ""
    few = [f"{l} (n={int(n)})" for l, n in table["n"].items() if n < MIN_SEEDS]
    if not few:
        return ""
    return (
        f"**Warning: fewer than {MIN_SEEDS} seeds in {', '.join(few)}.** With n = 2 the 95% t interval is "
        "12.7 standard errors wide on each side (t_{0.975,1}); with n = 1 it is undefined. Read such rows as "
        "'not yet measured'."
    )


def caption(table: pd.DataFrame) -> str:
    """The table's caption: what the cells are, how the intervals are computed, what is excluded."""
    conf = int(round(100 * table.attrs.get("confidence", 0.95)))
    base = table.attrs.get("baseline")
    n_ex = table.attrs.get("n_excluded", 0)
    parts = [p for p in [table.attrs.get("endpoint", "")] if p] + [
        f"Mean over seeds ± half-width of the {conf}% Student-t confidence interval "
        f"(t_{{{(1 + conf / 100) / 2:.3f}, n-1}} · s / √n); n/a where n = 1 (undefined); "
        "(n=k) marks a cell with fewer values than the row's n; mean [lo, hi]: the interval clipped to the "
        "metric's range (accuracy 0-100, fractions 0-1, lengths, entropy and times >= 0).",
        "end: last logged value of the training metric; avg: mean over the logged training steps.",
        "best acc: the highest held-out accuracy among the evaluations of the trained policy (the periodic "
        "ones, eval.problems problems x eval.k samples, and the final one, eval.final_problems x "
        "eval.final_samples); a maximum over noisy evaluations of different sizes, biased upward: for "
        "orientation, the comparison is final acc.",
    ]
    if base and table.attrs.get("sequential"):  # its intervals, verdict and margin: the sequential sentence below
        parts.append(f"Δ {table.attrs.get('acc_name', 'final acc')}: difference to {base} in percentage points.")
    elif base:
        parts.append(
            f"Δ {table.attrs.get('acc_name', 'final acc')}: difference to {base} in percentage points with its {conf}% CI — "
            "paired t on per-seed differences when the seeds match, Welch's t otherwise (column Δ test); "
            "n/a (identical per seed): the per-seed differences are all equal, so their spread is unknown. "
            "Δ verdict: 'difference shown' when the CI excludes 0; 'no difference shown' comes with what it ruled "
            "out: MDE, the difference the same test would detect with power 0.8 at alpha 0.05 at the observed "
            "spread and n (t test, also under --ci bootstrap), and equivalence by two one-sided t tests (TOST, "
            f"alpha 0.05) within ±{table.attrs.get('margin', verdicts.DEFAULT_MARGIN):g} pp (--margin); "
            f"r (arms): Pearson correlation of the two rows' per-seed {table.attrs.get('acc_name', 'final acc')} "
            "(paired, n >= 3)."
        )
    bs = table.attrs.get("bootstrap")
    if table.attrs.get("ci") == "bootstrap" and bs:
        parts.append(
            f"final acc and Δ: hierarchical bootstrap instead ({bs.get('B')} replicates, seed {bs.get('seed')}, "
            f"resampling {' > '.join(bs.get('levels', ()))} over {bs.get('problems')} problems; "
            "estimate ± t_{0.975, S-1} · se* · √(S/(S-1)), S seeds; dapo_exp.analysis.bootstrap)."
        )
    if table.attrs.get("sequential"):
        from dapo_exp.analysis.sequential import caption as sequential_caption

        parts.append(sequential_caption(table.attrs["sequential"]))
    parts.append("The paper's values are not in this table: another model and task (the block below it).")
    parts.append(f"Excluded runs (failed, killed or without summary): {n_ex}.")
    return " ".join(parts)


# --------------------------------------------------------------------------- #
# Formatting and writing                                                        #
# --------------------------------------------------------------------------- #
def _fmt(x: float, digits: int) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _cell(
    mean: float,
    lo: float,
    hi: float,
    n: int,
    row_n: int | None,
    digits: int,
    signed: bool = False,
    note: str = "",
) -> str:
    """``mean ± half-width``, or ``mean [lo, hi]`` when the interval is not symmetric (clipped to
    the metric's range); "n/a" (with ``note``) for an undefined interval; ``(n=k)`` when k differs from ``row_n``."""
    if n == 0 or math.isnan(mean):
        return ""
    m = f"{mean:+.{digits}f}" if signed else f"{mean:.{digits}f}"
    if math.isnan(lo) or math.isnan(hi):
        s = f"{m} ± n/a" + (f" ({note})" if note else "")
    elif abs((hi - mean) - (mean - lo)) > 0.5 * 10**-digits:
        s = f"{m} [{lo:.{digits}f}, {hi:.{digits}f}]"
    else:
        s = f"{m} ± {(hi - lo) / 2:.{digits}f}"
    if row_n is not None and n != row_n:
        s += f" (n={n})"
    return s


def _verdict_cell(r) -> str:
    """The Δ verdict column: the verdict, and for "no difference shown" what it ruled out."""
    word = r.get("d_verdict", "")
    if not isinstance(word, str):
        return ""
    d = f"d_{DIFF_KEY}"
    if word == verdicts.NO_DIFFERENCE:
        eq = r.get("d_equivalence", "")
        return f"{word}; " + verdicts.ruled_out(r.get(f"{d}_mde", np.nan), eq if isinstance(eq, str) else "",
                                               unit="pp")
    return word


def format_table(table: pd.DataFrame, metrics: tuple[TableMetric, ...] = TABLE_METRICS) -> pd.DataFrame:
    """The table as strings, one column per quantity, ready for Markdown / LaTeX."""
    keys = table.attrs.get("metrics", [m.key for m in metrics])
    metrics = tuple(m for m in metrics if m.key in keys)
    base = table.attrs.get("baseline") or "baseline"
    acc = table.attrs.get("acc_name", "final acc")
    digits = {m.key: m.digits for m in metrics}
    d = f"d_{DIFF_KEY}"
    out = []
    for label, r in table.iterrows():
        row = {"config": label, "n": int(r["n"])}
        for m in metrics:
            lo, hi, n = r[f"{m.key}_lo"], r[f"{m.key}_hi"], int(r[f"{m.key}_n"])
            row[f"{acc} (%)" if m.key == DIFF_KEY else m.header] = _cell(r[m.key], lo, hi, n, row["n"], m.digits)
        if d in table:
            row[f"Δ {acc} vs {base} (pp)"] = (
                "—"
                if r["d_test"] == "baseline"
                else _cell(r[d], r[f"{d}_lo"], r[f"{d}_hi"], int(r[f"{d}_n"]), None, digits.get(DIFF_KEY, 1), True,
                           r.get("d_note", "") if isinstance(r.get("d_note", ""), str) else "")
            )
            row["Δ test"] = r["d_test"]
            row["Δ verdict"] = "—" if r["d_test"] == "baseline" else _verdict_cell(r)
            row["r (arms)"] = "" if not np.isfinite(r.get(f"{d}_r", np.nan)) else f"{r[f'{d}_r']:+.2f}"
        out.append(row)
    return pd.DataFrame(out)


# the verl re-runs of the released recipe (PAPER_AIME24's keys beside Table 1's ladder, dapo_exp.fixes.LADDER)
PAPER_RERUNS = ("full", "full_no_ds", "clip+sop")


def paper_block(table: pd.DataFrame) -> str:
    """The paper's values, captioned, apart from the table (another model and task: never in a row beside
    our numbers): Table 1's ladder, the verl re-runs of the released recipe, and which rows of this table
    have a counterpart there."""
    ladder = ", ".join(f"{PAPER_AIME24[k][1].removeprefix('Table 1: ')} {PAPER_AIME24[k][0]:.0f}"
                       for k in LADDER)
    reruns = "; ".join(f"{PAPER_AIME24[k][1].removeprefix('verl re-run: ')} {PAPER_AIME24[k][0]:.0f}"
                       for k in PAPER_RERUNS)
    here = [f"{label} ↔ {PAPER_AIME24[label][1]} ({PAPER_AIME24[label][0]:.0f})"
            for label in table.index if label in PAPER_AIME24]
    lines = [f"**The paper, for orientation ({PAPER_HEADER}; another model and task, not comparable with the "
             "table above).**", "",
             f"- Table 1 of arXiv 2503.14476: {ladder}.",
             f"- verl's re-runs of the released recipe: {reruns}."]
    if here:
        lines.append(f"- Rows of this table with a counterpart there: {'; '.join(here)}.")
    return "\n".join(lines) + "\n"


def table_markdown(table: pd.DataFrame) -> str:
    """Caption, the table in Markdown, and the list of excluded runs."""
    one = table.attrs.get("one_seed", "")
    warn = warning_line(table)
    lines = [one, ""] if one else []
    lines += [warn, ""] if warn else []
    lines += [f"**Comparison table.** {table.attrs.get('caption', caption(table))}", ""]
    if len(table):
        lines.append(format_table(table).to_markdown(index=False))
    else:
        lines.append("(no runs)")
    for note in table.attrs.get("notes", []):
        lines += ["", f"Note: {note}."]
    ex = table.attrs.get("excluded") or []
    if ex:
        lines += ["", f"Excluded runs ({len(ex)}):", ""]
        lines += [f"- {r['run']} ({r['label']}, seed {r['seed']}): {r['status']} — {r['exclude_reason']}" for r in ex]
    lines += ["", paper_block(table).rstrip("\n")]
    return "\n".join(lines) + "\n"


def table_latex(table: pd.DataFrame) -> str:
    """The table as a LaTeX ``table`` environment (booktabs) with its caption."""
    f = format_table(table)
    cap = table.attrs.get("caption", caption(table))
    warn = warning_line(table).replace("**", "")
    cap = f"{warn} {cap}" if warn else cap
    one = table.attrs.get("one_seed", "").replace("**", "").replace("`", "")
    cap = f"{one} {cap}" if one else cap
    tex = f.to_latex(index=False, escape=True, caption=_latex_escape(cap), label="tab:dapo-ablation")
    return tex.replace("±", r"$\pm$").replace("Δ", r"$\Delta$").replace("—", "--")


_LATEX = {
    "\\": r"\textbackslash{}",
    "%": r"\%",
    "_": r"\_",
    "&": r"\&",
    "#": r"\#",
    "{": r"\{",
    "}": r"\}",
    "$": r"\$",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "±": r"$\pm$",
    "Δ": r"$\Delta$",
    "√": r"$\surd$",
    "·": r"$\cdot$",
    "—": "--",
}


def _latex_escape(s: str) -> str:
    return "".join(_LATEX.get(c, c) for c in s)


# --------------------------------------------------------------------------- #
# The terminal's table: what fits in TERMINAL_WIDTH columns                      #
# --------------------------------------------------------------------------- #
TERMINAL_WIDTH = 120
# column of format_table -> short header; in the order the columns are added while they fit
_TERMINAL_COLUMNS = {
    "config": "config", "n": "n", "final acc (%)": "final acc %", "Δ": "Δ final acc (pp)", "Δ verdict": "Δ verdict",
    "best acc (%)": "best acc %", "entropy (end)": "entropy", "response length (end)": "resp len",
    "truncated frac (end)": "truncated", "clipfrac higher (avg)": "clip high", "clipfrac lower (avg)": "clip low",
    "zero-var groups (avg)": "zero-var", "rollouts / trained (avg)": "rollouts/trained",
}


def wrap_text(text: str, width: int = TERMINAL_WIDTH) -> list[str]:
    """A paragraph as lines of at most ``width`` characters; a command in backticks longer than a
    few words stands on a line of its own, unbroken (so that it can be copied)."""
    import re
    import textwrap

    out: list[str] = []
    buf = ""
    for i, part in enumerate(re.split(r"(`[^`]+`)", text.replace("**", ""))):
        if i % 2 and len(part) > 40:  # a command: flush the text before it, then the command alone
            out += textwrap.wrap(buf.strip(), width=width, break_long_words=False, break_on_hyphens=False)
            out.append(part.strip("`"))
            buf = ""
        else:
            buf += part
    out += textwrap.wrap(buf.strip(), width=width, break_long_words=False, break_on_hyphens=False)
    return out


def _short_label(label: str, most: int) -> str:
    return label if len(label) <= most else label[: most - 12] + "…" + label[-11:]


def _short_verdict(r) -> str:
    word = r.get("d_verdict", "")
    if r.get("d_test") == "baseline":
        return "—"
    if not isinstance(word, str):
        return ""
    mde = r.get(f"d_{DIFF_KEY}_mde", np.nan)
    if word == verdicts.NO_DIFFERENCE and np.isfinite(mde):
        return f"{word} (MDE {mde:.3g})"
    return word


def _terminal_names(acc: str) -> dict[str, str]:
    """:data:`_TERMINAL_COLUMNS` (its order) with the accuracy column named for the endpoint (``acc``,
    :func:`acc_name`), as :func:`format_table` names it, and the difference's short header."""
    short = {"final acc (%)": (f"{acc} (%)", f"{acc} %"), "Δ": ("Δ", f"Δ {acc} (pp)")}
    return dict(short.get(k, (k, v)) for k, v in _TERMINAL_COLUMNS.items())


def _fit_columns(f: pd.DataFrame, width: int, names: dict[str, str] = _TERMINAL_COLUMNS) -> tuple[list[str], list[str]]:
    """The columns of ``f`` (in :data:`_TERMINAL_COLUMNS`' order) whose table fits ``width``, and the
    display names (``names``) of those left out."""
    from tabulate import tabulate

    chosen: list[str] = []
    left_out: list[str] = []
    for col in names:
        if col not in f:
            continue
        trial = tabulate(f[chosen + [col]].rename(columns=names), headers="keys", tablefmt="simple",
                         showindex=False, disable_numparse=True)
        if max(len(ln) for ln in trial.splitlines()) <= width:
            chosen.append(col)
        else:
            left_out.append(names[col])
    return chosen, left_out


def table_text(table: pd.DataFrame, width: int = TERMINAL_WIDTH) -> str:
    """The comparison table for a terminal: every line at most ``width`` characters.

    The columns are added in order (configuration, n, final accuracy, its difference to the
    baseline and the verdict, then the other metrics) while the table fits; long configuration
    labels are shortened in the middle. The caption is shortened too; ``table.md`` and
    ``table.csv`` (:func:`write_table`) hold every column, the full labels and the caption.
    """
    from tabulate import tabulate

    lines: list[str] = []
    for para in (table.attrs.get("one_seed", ""), warning_line(table)):
        if para:
            lines += wrap_text(para, width) + [""]
    if not len(table):
        return "\n".join(lines + ["(no runs)"]) + "\n"
    f = format_table(table)
    acc = table.attrs.get("acc_name", "final acc")
    f = f.rename(columns={c: "Δ" for c in f.columns if c.startswith(f"Δ {acc} vs")})
    if "Δ" in f:
        f["Δ verdict"] = [_short_verdict(r) for _, r in table.iterrows()]
    labels = [str(c) for c in f["config"]]
    most = max(16, width // 4)
    while len({_short_label(c, most) for c in labels}) < len(set(labels)):  # never two rows with one label
        most += 4
    f["config"] = [_short_label(c, most) for c in labels]
    names = _terminal_names(acc)
    chosen, left_out = _fit_columns(f, width, names)
    conf = int(round(100 * table.attrs.get("confidence", 0.95)))
    base = table.attrs.get("baseline")
    endpoint = table.attrs.get("endpoint", "")
    cap = ((endpoint.rstrip(".") + ". " if endpoint else "")
           + f"Comparison table: mean over seeds ± half-width of the {conf}% t interval (n/a: one seed; "
           "[lo, hi]: clipped to the metric's range)")
    if base and "Δ" in chosen:
        cap += (f"; Δ: {acc} minus {base}'s, paired t by seed when the seeds match, else Welch; "
                "MDE: the difference this test would detect (power 0.8)")
    lines += wrap_text(cap + ".", width)
    lines.append(tabulate(f[chosen].rename(columns=names), headers="keys", tablefmt="simple",
                          showindex=False, disable_numparse=True))
    more = []
    if left_out:
        more.append(f"Not shown at {width} columns: {', '.join(left_out)}.")
    if any(len(str(c)) > most for c in table.index):
        more.append("Long configuration labels are shortened (…).")
    more.append("table.md has every column, the full labels and the caption; table.csv the numbers.")
    lines += wrap_text(" ".join(more), width)
    for note in table.attrs.get("notes", []):
        lines += wrap_text(f"Note: {note}.", width)
    ex = table.attrs.get("excluded") or []
    if ex:
        lines.append(f"Excluded runs ({len(ex)}):")
        for r in ex:
            lines += wrap_text(f"- {r['run']} ({r['label']}, seed {r['seed']}): {r['status']} — {r['exclude_reason']}",
                               width)
    return "\n".join(lines) + "\n"


def write_table(table: pd.DataFrame, out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write ``table.md`` (caption + table + excluded runs), ``table.csv`` (numeric) and ``table.tex``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"md": out / "table.md", "csv": out / "table.csv", "tex": out / "table.tex"}
    paths["md"].write_text(table_markdown(table), encoding="utf-8")
    # the endpoint's name in every row (plan reads a table.csv's accuracy under it); the paper's values are
    # not in our rows (paper_block, in table.md)
    table.drop(columns=["paper_aime24", "paper_row"], errors="ignore").assign(
        endpoint=table.attrs.get("acc_name", "final acc")).to_csv(paths["csv"])
    paths["tex"].write_text(table_latex(table), encoding="utf-8")
    return paths
