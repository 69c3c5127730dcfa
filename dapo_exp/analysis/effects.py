"""Which fix mattered: main effects and two-way interactions of the switches on a final metric.

**Model.** Ordinary least squares (statsmodels ``OLS``) of the per-run final metric on the
switch indicators coded -1 (off) / +1 (on): an intercept, the seed as a *fixed block factor*
(one dummy per seed but the first), the main effect of every switch that varies and, with
``model="two-way"`` (the default), every two-way interaction among them::

    y_run = mu + block_seed + sum_j b_j x_j + sum_{j<k} b_jk x_j x_k + e_run

Why OLS with a fixed seed block rather than a mixed model with a random seed intercept: runs
that share a seed share its data order and sampling stream, so the seed is a block; with 2-5
seeds (all a sweep can afford) a random-effect variance estimated from 2-5 levels is unstable and
often on the boundary (zero), while in a balanced factorial the block is orthogonal to the switch
columns, so the effect estimates are the same either way and the fixed block only costs S - 1
residual degrees of freedom. The CIs are exact t intervals under normal, equal-variance errors;
the residual pools the 3-way and higher interactions (assumed negligible) and the seed-to-seed
noise of every configuration.

**Effect.** ``effect = 2 b``: for a main effect, the mean change of the metric when the fix goes
from off to on, averaged over the levels of the other switches in the design; for an
interaction A x B, half the difference between A's effect with B on and with B off. Accuracy is
in percentage points. p-values are two-sided t tests of effect = 0, Holm-adjusted
(``statsmodels.stats.multitest.multipletests``) over all the effects reported.

**Aliasing.** A term is identified only when its coefficient is an estimable function of the
model (its unit vector lies in the row space of the design matrix: it has no weight on the
matrix's null space). A term that is not identified is reported "aliased with X", X being the
terms (or the seed block, or the mean) it is confounded with, and no number is printed. Terms
that are identified may still be aliased with interactions outside the model (in the 2^(5-1)
half fraction, each two-way interaction with a three-way one): column ``aliases`` lists them,
from :func:`dapo_exp.analysis.design.describe_design`.

**Bootstrap** (``ci="bootstrap"``): the effects of the replicates of
:func:`dapo_exp.analysis.bootstrap.replicate_means` (seeds, problems, samples), i.e. the same
linear contrasts of the configuration means; the interval is
``effect ± t_{S-1} · sd* · sqrt(S / (S - 1))`` (S seeds; see :mod:`dapo_exp.analysis.bootstrap`).
It needs each run's ``eval_samples.jsonl`` and applies to the final accuracy only. Note the
degrees of freedom: S - 1 (each contrast's own seed-to-seed variation), where OLS pools all
contrasts' residuals.
"""

from __future__ import annotations

import itertools
import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from dapo_exp.analysis.design import LETTERS, SWITCHES, DesignInfo, describe_design, term_name, word_name
from dapo_exp.analysis.runs import RunSet
from dapo_exp.analysis.table import TABLE_METRICS, TableMetric

MODELS = ("two-way", "main")
CIS = ("t", "bootstrap")
_TOL = 1e-8


def _bootstrap_applies(m: TableMetric, runs: pd.DataFrame) -> None:
    """The bootstrap resamples the final evaluation's samples: final accuracy only, and only for runs
    that report the final evaluation (:func:`dapo_exp.analysis.table.bootstrap_endpoint_check`)."""
    if m.key != "final_acc":
        raise ValueError("the bootstrap applies to the final accuracy (it resamples the final eval's samples)")
    from dapo_exp.analysis.table import bootstrap_endpoint_check

    bootstrap_endpoint_check(runs)


def _named_for_endpoint(m: TableMetric, runs: pd.DataFrame) -> TableMetric:
    """The accuracy metric with its header named for the runs' declared endpoint (``eval.endpoint``,
    :func:`dapo_exp.analysis.table.acc_name`); any other metric as it is."""
    if m.key != "final_acc":
        return m
    import dataclasses

    from dapo_exp.analysis.table import acc_name

    return dataclasses.replace(m, header=f"{acc_name(runs)} (%)")


def _metric(metric: str | TableMetric) -> TableMetric:
    if isinstance(metric, TableMetric):
        return metric
    for m in TABLE_METRICS:
        if metric in (m.key, m.source):
            return m
    raise ValueError(f"metric {metric!r}: choose one of {', '.join(m.key for m in TABLE_METRICS)}")


@dataclass
class Effects:
    """The result of :func:`fit_effects`: ``table`` (one row per term) and what it was fitted on."""

    table: pd.DataFrame
    design: DesignInfo
    metric: TableMetric
    model: str
    ci: str
    confidence: float
    n_runs: int
    n_seeds: int
    df_resid: float
    notes: list[str] = field(default_factory=list)
    switches: tuple[str, ...] = SWITCHES  # the switches the fit was over (the design's factors)

    def warning(self) -> str:
        """A line for fits on fewer than 3 seeds, else ""."""
        if self.n_seeds >= 3:
            return ""
        why = (
            f"the intervals rest on the model's residual pooled over all configurations ({self.df_resid:g} df), "
            "i.e. on the assumption that 3-way and higher interactions are negligible and the noise is alike "
            "in every configuration"
            if self.ci == "t"
            else f"the bootstrap intervals use t with {max(self.n_seeds - 1, 0)} df"
        )
        return f"**Warning: n = {self.n_seeds} seed(s) (< 3).** With so few seeds {why}."

    def caption(self) -> str:
        conf = int(round(100 * self.confidence))
        name = self.metric.header.replace(" (%)", "")
        unit = "percentage points" if self.metric.scale == 100.0 else "the table's unit"
        how = (
            f"OLS on ±1-coded switches with the seed as a block factor ({self.df_resid:g} residual df), Student-t"
            if self.ci == "t"
            else "hierarchical bootstrap over seeds, problems and samples (t quantile with S - 1 df on the "
            "bootstrap se; see dapo_exp.analysis.bootstrap)"
        )
        terms = "main effects and two-way interactions" if self.model == "two-way" else "main effects only"
        return (
            f"Effects on {name} (in {unit}): {terms}, fitted on {self.n_runs} runs "
            f"({self.n_seeds} seed{'s' if self.n_seeds != 1 else ''}). Effect = mean change when the fix goes "
            "from off to on, averaged over the other switches (interaction A × B: half the difference between "
            f"A's effect with B on and with B off). {conf}% CI: {how}. p: two-sided, Holm-adjusted over the "
            "reported effects. 'aliased with X': the runs cannot separate the term from X, so no number is given. "
            "aliases: interactions outside the model that the estimate also contains (assumed negligible)."
        )


def model_terms(varied: Sequence[str], model: str = "two-way") -> list[tuple[str, ...]]:
    """The model's terms: one tuple of switches per main effect, then per two-way interaction."""
    if model not in MODELS:
        raise ValueError(f"model={model!r}: choose one of {', '.join(MODELS)}")
    terms = [(s,) for s in varied]
    if model == "two-way":
        terms += list(itertools.combinations(varied, 2))
    return terms


def design_matrix(runs: pd.DataFrame, terms: Sequence[tuple[str, ...]]) -> tuple[np.ndarray, list[str]]:
    """Columns: the mean, seed blocks (all seeds but the first), then one ±1 column per term."""
    cols, names = [np.ones(len(runs))], ["the mean"]
    seeds = sorted(runs["seed"].unique(), key=str)
    for s in seeds[1:]:
        cols.append((runs["seed"] == s).to_numpy(dtype=float))
        names.append(f"seed {s}")
    x = {f: 2.0 * runs[f].to_numpy(dtype=float) - 1.0 for t in terms for f in t}
    for t in terms:
        cols.append(np.prod([x[f] for f in t], axis=0))
        names.append(term_name(t))
    return np.column_stack(cols), names


def null_projection(X: np.ndarray) -> np.ndarray:
    """Projection onto the null space of X (columns): nonzero rows = coefficients that are not estimable."""
    _, s, vt = np.linalg.svd(X, full_matrices=True)
    rank = int((s > s.max() * max(X.shape) * np.finfo(float).eps * 10).sum()) if len(s) else 0
    N = vt[rank:].T
    return N @ N.T


def _alias_text(names: list[str]) -> str:
    """'aliased with X, Y'; seed dummies are "the seed" (with dummy coding the mean takes part in any
    dependency on them, so it is then not named); the mean alone: the term's column is constant."""
    seeds = [n for n in names if n.startswith("seed ")]
    rest = [n for n in names if not n.startswith("seed ") and n != "the mean"]
    if seeds:
        rest.append("the seed")
    elif "the mean" in names:
        rest.append("the mean (its column is constant in these runs)")
    return "aliased with " + ", ".join(rest)


def fit_effects(
    data: RunSet | pd.DataFrame,
    metric: str | TableMetric = "final_acc",
    *,
    model: str = "two-way",
    confidence: float = 0.95,
    ci: str = "t",
    B: int | None = None,
    seed: int | None = None,
    levels: Sequence[str] | None = None,
    switches: Sequence[str] = SWITCHES,
) -> Effects:
    """Main effects (and two-way interactions) of the switches on ``metric`` (a TABLE_METRICS key).

    ``data``: a RunSet (its included runs) or a runs frame. Returns :class:`Effects`; its
    ``table`` has, per term: ``term, order, word, status`` ("estimated" | "aliased with ..."),
    ``effect, lo, hi, se, p, p_holm`` (NaN when aliased or undefined), ``aliases`` (words outside
    the model with the same column in the design) and ``alias_with`` (model terms it is confounded with).
    """
    import statsmodels.api as sm

    from dapo_exp.analysis.runs import with_endpoint

    if ci not in CIS:
        raise ValueError(f"ci={ci!r}: choose one of {', '.join(CIS)}")
    m = _metric(metric)
    runs = with_endpoint(data.runs if isinstance(data, RunSet) else data)
    if "included" in runs:
        runs = runs[runs["included"]]
    if ci == "bootstrap":
        _bootstrap_applies(m, runs)
    notes: list[str] = []
    if m.source not in runs:
        raise ValueError(f"no run has {m.source!r}")
    runs = runs.dropna(subset=[m.source, *switches]).reset_index(drop=True)
    runs[list(switches)] = runs[list(switches)].astype(bool)
    info = describe_design(runs, switches)
    terms = model_terms(info.varied, model)
    y = runs[m.source].to_numpy(dtype=float) * m.scale
    X, names = design_matrix(runs, terms)
    first = len(names) - len(terms)
    P = null_projection(X)
    estimable = np.array([P[j, j] < _TOL for j in range(X.shape[1])])
    n_seeds = int(runs["seed"].nunique()) if len(runs) else 0
    with warnings.catch_warnings():
        # rank deficiency is expected (aliasing) and handled above: only estimable terms are reported
        warnings.simplefilter("ignore")
        res = sm.OLS(y, X).fit() if len(runs) else None
    df_resid = float(res.df_resid) if res is not None else 0.0
    if res is not None and df_resid <= 0:
        notes.append("no residual degrees of freedom (as many parameters as runs): no interval or p-value")

    cis = res.conf_int(alpha=1 - confidence) if res is not None and df_resid > 0 else None
    table = pd.DataFrame(_term_rows(terms, names, first, info, model, estimable, P, X.shape[1], res, cis, df_resid))

    if ci == "bootstrap" and len(table):
        _bootstrap_effects(runs, table, terms, estimable[first:], confidence, B, seed, levels, notes, switches)
    _anytime_effects(table, res, first, getattr(data, "sequential", None) if ci == "t" else None, notes)
    _holm_column(table)
    return Effects(table, info, _named_for_endpoint(m, runs), model, ci, confidence, int(len(runs)), n_seeds, df_resid, notes, tuple(switches))


def _anytime_effects(table: pd.DataFrame, res, first: int, record: dict | None, notes: list[str]) -> None:
    """A sequential sweep's effects: each estimated term's anytime-valid interval (the regression form of
    :mod:`dapo_exp.analysis.sequential`, alpha shared over the terms), in place; p-values dropped (not valid
    after a data-dependent stop)."""
    from dapo_exp.analysis import sequential as seq

    if not record or res is None or res.df_resid <= 0 or not len(table):
        return
    rule = record.get("rule") or {}
    ok = (table["status"] == "estimated") & table["effect"].notna()
    alpha = float(rule.get("alpha", seq.DEFAULT_ALPHA)) / max(1, int(ok.sum()))
    phi = float(rule.get("phi", seq.DEFAULT_PHI))
    sigma = float(np.sqrt(res.scale))
    for i in table.index[ok]:
        bse = float(res.bse[first + i])
        half = 2 * bse * float(seq.regression_multiplier(res.df_resid, (sigma / bse) ** 2, alpha, phi))
        table.loc[i, ["lo", "hi", "p"]] = [table.at[i, "effect"] - half, table.at[i, "effect"] + half, np.nan]
    notes.append(f"sequential sweep: the effects' intervals are {seq.LABEL} ({1 - alpha:.1%} each: alpha "
                 f"{rule.get('alpha', seq.DEFAULT_ALPHA):g} over {int(ok.sum())} terms; the regression form of the "
                 "normal-mixture sequential t), valid although the sweep chose when to stop; no p-values")


def _holm_column(table: pd.DataFrame) -> None:
    """``p_holm``: Holm-adjusted p over the terms that have a p-value (in place)."""
    ok = table["p"].notna() if len(table) else pd.Series([], dtype=bool)
    table["p_holm"] = np.nan
    if ok.any():
        table.loc[ok, "p_holm"] = holm(table.loc[ok, "p"].to_numpy())


def _term_rows(terms, names, first, info, model, estimable, P, n_cols, res, cis, df_resid) -> list[dict]:
    """One row per model term: its estimate and interval, or what it is aliased with."""
    alias_map = {w: g for g in info.alias_groups for w, _ in g}
    rows = []
    for j, t in enumerate(terms, start=first):
        word = word_name(t)
        row = {"term": names[j], "order": len(t), "word": word, "status": "estimated", "effect": np.nan,
               "lo": np.nan, "hi": np.nan, "se": np.nan, "p": np.nan, "alias_with": "", "aliases": ""}
        group = alias_map.get(word, [])
        own = dict(group).get(word, 1)
        top = 2 if model == "two-way" else 1
        outside = [("-" if s * own < 0 else "") + w for w, s in group if w != word and len(w) > top]
        row["aliases"] = " = ".join(outside)
        if not estimable[j]:
            partners = [names[k] for k in range(n_cols) if k != j and abs(P[j, k]) > _TOL]
            row["status"] = _alias_text(partners) if partners else "not identified"
            row["alias_with"] = "; ".join(partners)
        elif res is not None:
            row["effect"] = 2 * float(res.params[j])
            if df_resid > 0:
                lo, hi = cis[j]
                row.update({"lo": 2 * float(lo), "hi": 2 * float(hi), "se": 2 * float(res.bse[j]),
                            "p": float(res.pvalues[j])})
        rows.append(row)
    return rows


def holm(p: np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values (equal to ``statsmodels.stats.multitest.multipletests(p,
    method="holm")[1]``, tested; written out because that function calls ``gc.collect()`` on every
    call, slow in a process holding pandas and statsmodels, and the coverage tests call it hundreds of times)."""
    p = np.asarray(p, dtype=float)
    order = np.argsort(p)
    m = len(p)
    adj = np.minimum(1.0, np.maximum.accumulate(p[order] * (m - np.arange(m))))
    out = np.empty(m)
    out[order] = adj
    return out


def _config_pinv(cube, terms, switches: Sequence[str] = SWITCHES) -> np.ndarray:
    """pinv of the configuration-level design (mean + terms) over the cube's configurations (switch-state keys)."""
    states = pd.DataFrame([[c == "1" for c in k] for k in cube.configs], columns=list(switches))
    Xc, _ = design_matrix(states.assign(seed=0), terms)
    return np.linalg.pinv(Xc)


def _state_key(runs: pd.DataFrame, switches: Sequence[str] = SWITCHES) -> pd.Series:
    return runs[list(switches)].astype(bool).astype(int).astype(str).agg("".join, axis=1)


def contrast_weights(eff: Effects, data: RunSet | pd.DataFrame, cube) -> dict[str, np.ndarray]:
    """Per estimated term: the weights over ``cube``'s configurations (labels) whose combination of
    configuration means is the effect (2 x the OLS coefficient on the configuration means)."""
    runs = data.runs if isinstance(data, RunSet) else data
    runs = runs[runs["included"]] if "included" in runs else runs
    state_of = dict(zip(runs["label"], _state_key(runs, eff.switches)))
    keys = [state_of[c] for c in cube.configs]
    terms = model_terms(eff.design.varied, eff.model)
    states = pd.DataFrame([[c == "1" for c in k] for k in keys], columns=list(eff.switches))
    Xc, _ = design_matrix(states.assign(seed=0), terms)
    pinv = np.linalg.pinv(Xc)
    out = {}
    for i, r in enumerate(eff.table.itertuples()):
        if r.status == "estimated":
            out[r.term] = 2 * pinv[1 + i]
    return out


def _bootstrap_effects(runs, table, terms, estimable, confidence, B, seed, levels, notes,
                       switches: Sequence[str] = SWITCHES) -> None:
    """Replace the t intervals of the estimated terms by bootstrap ones (in place)."""
    from dapo_exp.analysis import bootstrap as boot

    # configuration = switch state; the cube's configurations are the distinct states
    cube = boot.eval_cube(runs.assign(_state=_state_key(runs, switches)), label_col="_state")
    full = cube.has_run.all()
    if not full:
        notes.append("bootstrap: not every configuration has every seed; configuration means average their own seeds")
    pinv = _config_pinv(cube, terms, switches)
    lv = tuple(levels or boot.LEVELS)
    reps = boot.replicate_means(cube, B=B or boot.DEFAULT_B, seed=boot.DEFAULT_SEED if seed is None else seed,
                                levels=lv) * 100
    est = cube.means() * 100
    beta, beta_r = pinv @ est, reps @ pinv.T
    S = int(cube.has_run.sum(axis=1).min())
    for i, ok in enumerate(estimable):
        if not ok:
            continue
        iv = boot.interval(2 * beta[1 + i], 2 * beta_r[:, 1 + i], S, confidence=confidence, seed_level="seed" in lv)
        table.loc[i, ["effect", "lo", "hi", "se", "p"]] = [iv.estimate, iv.lo, iv.hi, iv.se, iv.p]


# --------------------------------------------------------------------------- #
# Output: table files and the forest plot                                       #
# --------------------------------------------------------------------------- #
def format_effects(eff: Effects) -> pd.DataFrame:
    """The effects as strings, one row per term."""
    d = eff.metric.digits
    out = []
    for r in eff.table.itertuples():
        est = r.status == "estimated"
        if est and not math.isnan(r.effect):
            ci = "n/a" if math.isnan(r.lo) else f"[{r.lo:+.{d}f}, {r.hi:+.{d}f}]"
            effect = f"{r.effect:+.{d}f}"
        else:
            effect, ci = (r.status, "") if not est else ("n/a", "")
        out.append(
            {
                "term": r.term,
                "effect": effect,
                f"{int(round(100 * eff.confidence))}% CI": ci,
                "p": _p(r.p),
                "p (Holm)": _p(r.p_holm),
                "aliases": r.aliases,
            }
        )
    return pd.DataFrame(out)


def _p(p: float) -> str:
    if p is None or math.isnan(p):
        return ""
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def effects_markdown(eff: Effects) -> str:
    """Warning (n < 3 seeds), caption, design, the effects table, notes."""
    lines = [eff.warning(), ""] if eff.warning() else []
    lines += [f"**Effects.** {eff.caption()}", "", eff.design.text().replace("\n", "  \n"), ""]
    lines.append(format_effects(eff).to_markdown(index=False, disable_numparse=True) if len(eff.table) else "(no switch varies: no effect)")
    for n in eff.notes:
        lines += ["", f"Note: {n}."]
    return "\n".join(lines) + "\n"


def effects_text(eff: Effects, width: int = 120) -> str:
    """The effects for a terminal, every line at most ``width`` characters: the warning, a short
    caption, the design, the estimated terms (effect, CI, Holm-adjusted p) and the terms the runs
    cannot identify as a note. ``effects.md`` has the full caption, the aliases and every partner."""
    from tabulate import tabulate

    from dapo_exp.analysis.table import wrap_text

    lines = wrap_text(eff.warning(), width) + [""] if eff.warning() else []
    conf = int(round(100 * eff.confidence))
    name = eff.metric.header.replace(" (%)", "")
    unit = "pp" if eff.metric.scale == 100.0 else "the table's unit"
    how = "OLS with the seed as a block" if eff.ci == "t" else "hierarchical bootstrap"
    lines += wrap_text(f"Effects on {name} ({unit}): mean change when the fix goes from off to on, averaged over "
                       f"the other switches; {conf}% CI ({how}); p Holm-adjusted.", width)
    for para in eff.design.text().splitlines():
        lines += wrap_text(para, width)
    f = format_effects(eff)
    est = eff.table["status"] == "estimated" if len(eff.table) else pd.Series([], dtype=bool)
    if est.any():
        lines.append(tabulate(f[est.to_numpy()].drop(columns=["aliases", "p"]), headers="keys", tablefmt="simple",
                              showindex=False, disable_numparse=True))
    elif len(eff.table):
        lines.append("No term can be estimated from these runs.")
    else:
        lines.append("(no switch varies: no effect)")
    note = aliased_note(eff, width=width - 2)
    if note:
        lines.append("Not estimable (aliased; no number):")
        lines += ["  " + ln for n in note for ln in n.splitlines()]
    for n in eff.notes:
        lines += wrap_text(f"Note: {n}.", width)
    return "\n".join(lines) + "\n"


def effects_latex(eff: Effects) -> str:
    from dapo_exp.analysis.table import _latex_escape

    f = format_effects(eff)
    cap = (eff.warning().replace("**", "") + " " if eff.warning() else "") + eff.caption()
    tex = f.to_latex(index=False, escape=True, caption=_latex_escape(cap), label="tab:dapo-effects")
    return tex.replace("×", r"$\times$")


def write_effects(eff: Effects, out_dir: str | os.PathLike, stem: str = "effects") -> dict[str, Path]:
    """``effects.md`` (warning, caption, design, table), ``effects.csv`` (numeric), ``effects.tex``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"md": out / f"{stem}.md", "csv": out / f"{stem}.csv", "tex": out / f"{stem}.tex"}
    paths["md"].write_text(effects_markdown(eff), encoding="utf-8")
    eff.table.to_csv(paths["csv"], index=False)
    paths["tex"].write_text(effects_latex(eff), encoding="utf-8")
    return paths


def _effect_axis_label(eff: Effects) -> str:
    name = eff.metric.header.replace(" (%)", "")
    unit = " (pp)" if eff.metric.scale == 100.0 else ""
    return f"effect on {name}{unit}"


def _partners_text(alias_with: str) -> str:
    """What an aliased term is confounded with, short: up to two terms by name, else their count;
    then the seed block or the mean (a constant column) when they take part."""
    partners = [p for p in alias_with.split("; ") if p]
    seed = any(p.startswith("seed ") for p in partners)
    terms = [p for p in partners if not p.startswith("seed ") and p != "the mean"]
    extra = ["the seed"] if seed else (["the mean"] if "the mean" in partners else [])
    named = terms if len(terms) <= 2 else [f"{len(terms)} other terms"]
    return " and ".join([", ".join(named)] + extra if named else extra) or "not identified"


def aliased_note(eff: Effects, width: int = 72) -> list[str]:
    """The terms the runs cannot identify, one wrapped entry each ("term: aliased with ..."), as
    drawn beside the forest plot, and what "the mean" means there; effects.md has every partner."""
    import textwrap

    lines, mean = [], False
    for r in eff.table.itertuples():
        if r.status == "estimated":
            continue
        what = f"aliased with {_partners_text(r.alias_with)}" if r.alias_with else r.status
        mean |= what.endswith("the mean")
        lines.append(textwrap.fill(f"{r.term}: {what}", width=width, subsequent_indent="    "))
    if mean:
        lines.append(textwrap.fill("(the mean: the overall mean takes part in the confounding, e.g. where switches "
                                   "only ever change together)", width=width))
    return lines


def plot_effects(eff: Effects):
    """Forest plot of the estimated terms (the effect with its CI bar, a zero line) and, beside it, a
    note naming the terms the runs cannot identify and what each is aliased with.

    Only estimated terms are rows of the axis; with none, the figure is the note alone (the analysis
    never draws that one: where the configurations are a ladder or an irregular set,
    :func:`forest_figure` draws their contrasts instead). The axis label and title say what is drawn:
    intervals only when the fit has residual degrees of freedom, the colour key only for the kinds of
    term drawn, the star only when a p-value exists.
    """
    from matplotlib.figure import Figure

    t = eff.table
    est = t[(t["status"] == "estimated") & t["effect"].notna()] if len(t) else t
    note = aliased_note(eff)
    note_lines = sum(n.count("\n") + 1 for n in note)
    conf = int(round(100 * eff.confidence))
    how = "OLS with a seed block" if eff.ci == "t" else "hierarchical bootstrap"
    head = f"{eff.design.name}: {eff.n_runs} runs, {eff.n_seeds} seed{'s' if eff.n_seeds != 1 else ''}"
    n_rows = len(est)
    height = max(0.36 * n_rows + 2.0, 0.16 * note_lines + 1.4, 2.6)
    if n_rows and note:
        fig = Figure(figsize=(12.0, height), layout="constrained")
        ax, side = fig.subplots(1, 2, width_ratios=[1.35, 1.0])
    elif n_rows:
        fig = Figure(figsize=(8.5, height), layout="constrained")
        ax, side = fig.subplots(), None
    else:
        fig = Figure(figsize=(7.0, height + 0.4), layout="constrained")
        ax, side = None, fig.subplots()
        note.append("\nA design that separates the terms: python -m dapo_exp.analysis design fractional")
    if ax is not None:
        _forest_rows(ax, eff, est, f"estimate and {conf}% CI ({how})", f"estimate ({how}; no interval: {_why_no_ci(eff)})")
        ax.set_title(f"{head}; {n_rows} of {len(t)} terms estimated\n" + ax.get_title(), fontsize=9)
    if side is not None:
        side.axis("off")
        title = ("Not estimable from these runs:\n(no number drawn; effects.md lists every partner)"
                 if ax is not None else
                 f"{head}: no term can be estimated from these runs\n(no number drawn; effects.md lists every partner)")
        side.set_title(title, fontsize=9, loc="left")
        side.text(0.0, 1.0, "\n".join(note), transform=side.transAxes, va="top", ha="left", fontsize=8,
                  color="0.25", linespacing=1.35)
    return fig


def _forest_rows(ax, eff: Effects, est, with_ci: str, without_ci: str) -> None:
    """The estimated terms as rows of ``ax``: each effect with its CI bar, a zero line, the axis label
    (``with_ci`` or ``without_ci`` after the effect's unit) and, as the title, the key of what is drawn."""
    n_rows = len(est)
    ys = np.arange(n_rows)[::-1]
    has_ci = bool(est["lo"].notna().any())
    has_p = bool(est["p_holm"].notna().any())
    kinds = []
    for y, r in zip(ys, est.itertuples()):
        color = "#1f77b4" if r.order == 1 else "#ff7f0e"
        if not math.isnan(r.lo):
            ax.plot([r.lo, r.hi], [y, y], color=color, lw=2)
        ax.plot([r.effect], [y], "o", color=color, ms=5)
        kinds.append(r.order)
        if not math.isnan(r.p_holm) and r.p_holm < 0.05:
            ax.text(r.hi if not math.isnan(r.hi) else r.effect, y, "  *", va="center", fontsize=9)
    ax.axvline(0.0, color="k", lw=0.8)
    ax.set_yticks(ys, est["term"].tolist(), fontsize=8)
    ax.set_ylim(-0.7, n_rows - 0.3)
    ax.margins(x=0.15)
    ax.set_xlabel(f"{_effect_axis_label(eff)}:\n{with_ci if has_ci else without_ci}", fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    key = [k for k, o in (("blue: main effects", 1), ("orange: two-way interactions", 2)) if o in kinds]
    if has_p:
        key.append("* Holm-adjusted p < 0.05")
    ax.set_title("; ".join(key), fontsize=9)


def _why_no_ci(eff: Effects) -> str:
    return "no residual degrees of freedom" if eff.df_resid <= 0 else "undefined"


def forest_figure(eff: Effects | None, contrasts: pd.DataFrame | None = None):
    """The figure ``effects_forest`` draws: the configurations' contrasts when there are any (a ladder's
    rungs or an irregular set's Holm-adjusted pairs, :func:`dapo_exp.analysis.contrasts.plot_contrasts`:
    no single switch's effect may be estimable there, the contrasts always are), else the effects
    (a two-level design: :func:`plot_effects`)."""
    if contrasts is not None and len(contrasts):
        from dapo_exp.analysis.contrasts import plot_contrasts

        return plot_contrasts(contrasts)
    if eff is None:
        raise ValueError("nothing to draw: no effects and no contrasts")
    return plot_effects(eff)


def write_forest(eff: Effects | None, out_dir: str | os.PathLike, formats: Sequence[str] = ("png", "svg"),
                 stem: str = "effects_forest", *, contrasts: pd.DataFrame | None = None) -> list[Path]:
    """``<stem>.{png,svg}`` in ``out_dir``: :func:`forest_figure` of ``eff`` and ``contrasts``
    (:func:`dapo_exp.analysis.contrasts.configuration_contrasts`; None or empty: the effects' forest)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig = forest_figure(eff, contrasts)
    paths = []
    for fmt in formats:
        p = out / f"{stem}.{fmt}"
        fig.savefig(p, dpi=130)
        paths.append(p)
    return paths


__all__ = ["Effects", "fit_effects", "format_effects", "effects_markdown", "write_effects", "plot_effects",
           "forest_figure", "write_forest", "model_terms", "design_matrix", "null_projection", "LETTERS"]
