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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from dapo_exp.analysis.design import SWITCHES, DesignInfo, LETTERS, describe_design, term_name, word_name
from dapo_exp.analysis.runs import RunSet
from dapo_exp.analysis.table import TABLE_METRICS, TableMetric

MODELS = ("two-way", "main")
CIS = ("t", "bootstrap")
_TOL = 1e-8


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

    if ci not in CIS:
        raise ValueError(f"ci={ci!r}: choose one of {', '.join(CIS)}")
    m = _metric(metric)
    if ci == "bootstrap" and m.key != "final_acc":
        raise ValueError("the bootstrap applies to the final accuracy (it resamples the final eval's samples)")
    runs = data.runs if isinstance(data, RunSet) else data
    if "included" in runs:
        runs = runs[runs["included"]]
    notes = []
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
    rows = _term_rows(terms, names, first, info, model, estimable, P, X.shape[1], res, cis, df_resid)
    table = pd.DataFrame(rows)

    if ci == "bootstrap" and len(table):
        _bootstrap_effects(runs, table, terms, estimable[first:], confidence, B, seed, levels, notes)
    _holm_column(table)
    return Effects(table, info, m, model, ci, confidence, int(len(runs)), n_seeds, df_resid, notes)


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
    call, 0.1-0.2 s in a process holding pandas and statsmodels, which the coverage tests call hundreds of times)."""
    p = np.asarray(p, dtype=float)
    order = np.argsort(p)
    m = len(p)
    adj = np.minimum(1.0, np.maximum.accumulate(p[order] * (m - np.arange(m))))
    out = np.empty(m)
    out[order] = adj
    return out


def _config_pinv(cube, terms) -> np.ndarray:
    """pinv of the configuration-level design (mean + terms) over the cube's configurations (switch-state keys)."""
    states = pd.DataFrame([[c == "1" for c in k] for k in cube.configs], columns=list(SWITCHES))
    Xc, _ = design_matrix(states.assign(seed=0), terms)
    return np.linalg.pinv(Xc)


def _state_key(runs: pd.DataFrame) -> pd.Series:
    return runs[list(SWITCHES)].astype(bool).astype(int).astype(str).agg("".join, axis=1)


def contrast_weights(eff: "Effects", data: RunSet | pd.DataFrame, cube) -> dict[str, np.ndarray]:
    """Per estimated term: the weights over ``cube``'s configurations (labels) whose combination of
    configuration means is the effect (2 x the OLS coefficient on the configuration means)."""
    runs = data.runs if isinstance(data, RunSet) else data
    runs = runs[runs["included"]] if "included" in runs else runs
    state_of = dict(zip(runs["label"], _state_key(runs)))
    keys = [state_of[c] for c in cube.configs]
    terms = model_terms(eff.design.varied, eff.model)
    states = pd.DataFrame([[c == "1" for c in k] for k in keys], columns=list(SWITCHES))
    Xc, _ = design_matrix(states.assign(seed=0), terms)
    pinv = np.linalg.pinv(Xc)
    out = {}
    for i, r in enumerate(eff.table.itertuples()):
        if r.status == "estimated":
            out[r.term] = 2 * pinv[1 + i]
    return out


def _bootstrap_effects(runs, table, terms, estimable, confidence, B, seed, levels, notes) -> None:
    """Replace the t intervals of the estimated terms by bootstrap ones (in place)."""
    from dapo_exp.analysis import bootstrap as boot

    # configuration = switch state; the cube's configurations are the distinct states
    cube = boot.eval_cube(runs.assign(_state=_state_key(runs)), label_col="_state")
    full = cube.has_run.all()
    if not full:
        notes.append("bootstrap: not every configuration has every seed; configuration means average their own seeds")
    pinv = _config_pinv(cube, terms)
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


def plot_effects(eff: Effects):
    """Forest plot: one row per term, the effect with its CI bar, a zero line; aliased terms say so."""
    from matplotlib.figure import Figure
    from matplotlib.transforms import blended_transform_factory

    t = eff.table
    n = max(len(t), 1)
    fig = Figure(figsize=(8.5, 0.36 * n + 1.8), layout="constrained")
    ax = fig.subplots()
    ys = np.arange(len(t))[::-1]
    text_at = blended_transform_factory(ax.transAxes, ax.transData)
    for y, r in zip(ys, t.itertuples()):
        if r.status != "estimated" or math.isnan(r.effect):
            ax.text(0.01, y, r.status if r.status != "estimated" else "n/a", va="center", ha="left", fontsize=7,
                    color="0.35", style="italic", transform=text_at)
            continue
        color = "#1f77b4" if r.order == 1 else "#ff7f0e"
        if not math.isnan(r.lo):
            ax.plot([r.lo, r.hi], [y, y], color=color, lw=2)
        ax.plot([r.effect], [y], "o", color=color, ms=5)
        if not math.isnan(r.p_holm) and r.p_holm < 0.05:
            ax.text(r.hi if not math.isnan(r.hi) else r.effect, y, "  *", va="center", fontsize=9)
    ax.axvline(0.0, color="k", lw=0.8)
    ax.set_yticks(ys, t["term"].tolist(), fontsize=8)
    ax.set_ylim(-0.7, len(t) - 0.3)
    if not t["effect"].notna().any():
        ax.set_xlim(-1, 1)
    conf = int(round(100 * eff.confidence))
    how = "OLS with a seed block" if eff.ci == "t" else "hierarchical bootstrap"
    ax.set_xlabel(f"{_effect_axis_label(eff)}: estimate and {conf}% CI ({how})", fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(
        f"{eff.design.name}: {eff.n_runs} runs, {eff.n_seeds} seed(s)\n"
        "blue: main effects, orange: two-way interactions; * Holm-adjusted p < 0.05",
        fontsize=9,
    )
    return fig


def write_forest(eff: Effects, out_dir: str | os.PathLike, formats: Sequence[str] = ("png", "svg"),
                 stem: str = "effects_forest") -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig = plot_effects(eff)
    paths = []
    for fmt in formats:
        p = out / f"{stem}.{fmt}"
        fig.savefig(p, dpi=130)
        paths.append(p)
    return paths


__all__ = ["Effects", "fit_effects", "format_effects", "effects_markdown", "write_effects", "plot_effects",
           "write_forest", "model_terms", "design_matrix", "null_projection", "LETTERS"]
