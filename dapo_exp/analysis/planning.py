"""Seed planning: how many seeds a comparison needs, from the variances of a pilot sweep.

For each metric, from the pilot:

- ``sd``: the seed-to-seed standard deviation within a configuration, pooled over configurations
  (``sqrt(sum (n_c - 1) s_c^2 / sum (n_c - 1))``, df = sum (n_c - 1));
- ``sd_paired``: the standard deviation of per-seed differences to the baseline configuration
  (runs with the same seed share data order and sampling stream, so pairing removes the shared
  part), pooled over the configurations whose seeds match the baseline's.

Then, for a difference of ``delta`` (in the table's unit: percentage points for accuracy), at
two-sided alpha 0.05 and power 0.8 (``statsmodels.stats.power``):

- unpaired: seeds per configuration from ``TTestIndPower`` (two-sample t, equal variances),
  effect size ``delta / sd``;
- paired: seeds (pairs) from ``TTestPower`` (one-sample t on the differences), effect size
  ``delta / sd_paired``;
- the same two at the 80% upper confidence limit of the pilot's sd (``sd * sqrt(df / chi2_{0.2,
  df})``): a pilot of a few seeds estimates the sd loosely, and too few seeds is the costly error;
- the half-width of the 95% t interval that N seeds give for a configuration's mean
  (``t_{N-1} sd / sqrt(N)``), a paired difference (``t_{N-1} sd_paired / sqrt(N)``), an unpaired
  one (``t_{2N-2} sd sqrt(2 / N)``), and a main effect or two-way interaction of the 2^(5-1)
  fractional design with N seeds (``t_{15(N-1)} 2 sd_e / sqrt(16 N)``, sd_e = sd_paired / sqrt(2)
  the residual sd once the seed block is removed; sd where there is no paired estimate).

**From one seed.** A pilot with one seed per configuration measures no spread. The paired sd is
then the one given (``paired_sd``, ``--paired-sd``, in the table's unit: pp for accuracy), else for the
endpoint's accuracy the toy's measured spread for the pilot's regime and endpoint
(:func:`dapo_exp.analysis.verdicts.seed_advice`: the launch line and a one-seed table give the same count),
for the best accuracy the default of :data:`DEFAULT_PAIRED_SD` (measured on the committed fractional sweep);
a given one also replaces a pilot's. Unpaired counts use the pilot's between-seed sd of each arm, or, without one,
``sd_arm = sd_paired / sqrt(2 (1 - r))`` from the paired sd and the correlation ``r`` of the arms'
per-seed values (``correlation``, ``--correlation``, default 0: pairing assumed to buy nothing), so
that the unpaired difference has ``sd_diff_unpaired = sqrt(2) sd_arm``. The plan then says how many
seeds to add and the command that adds them (:func:`dapo_exp.analysis.verdicts.rerun_command`).

**Sequential design.** Beside the fixed count, the expected cost of a sequential sweep at the same
``delta`` (:mod:`dapo_exp.analysis.sequential`: the anytime-valid interval at ``alpha``, ``first``
seeds then one per round, a stop when the comparison is different or, for accuracy, equivalent within
the margin, at most ``budget`` seeds): the mean and 90th percentile of the seeds per configuration it
stops at, its P(different) and the share still undecided at the budget, from ``sims`` sweeps of
Gaussian paired differences with the sd used (a fixed random seed: the same plan each time). Its error
rates hold wherever it stops; the fixed count's power is the stated one at exactly ``delta``.

The pilot is a sweep directory (per-seed values from its runs) or a ``table.csv`` written by the
analysis (its ``<metric>_sd`` columns, or, for tables written before those existed, the sd backed
out of the t interval: ``s = half-width sqrt(n) / t_{n-1}``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import stats

from dapo_exp.analysis import sequential
from dapo_exp.analysis.table import DIFF_KEY, TABLE_METRICS, TableMetric, acc_name, baseline_label, order_labels

# the power solvers and the default paired sd live with the verdicts (the table's one-seed line uses them)
from dapo_exp.analysis.verdicts import (  # noqa: F401  (part of this module's API)
    DEFAULT_MARGIN,
    DEFAULT_PAIRED_DF,
    DEFAULT_PAIRED_SD,
    SeedAdvice,
    runs_seed_advice,
    seeds_paired,
    seeds_unpaired,
)

ALPHA = 0.05
POWER = 0.8
DEFAULT_METRICS = ("final_acc", "best_acc")
DEFAULT_N = (2, 3, 5, 10, 20)
DEFAULT_DELTA = 5.0  # pp: the default equivalence margin of the analysis (dapo_exp.analysis.verdicts)
FRACTIONAL_RUNS = 16  # configurations of the 2^(5-1) design
SEQ_SIMS, SEQ_SEED = 4000, 0  # simulated sequential sweeps per metric, and their random seed
SEQ_COLUMNS = ("seq_mean", "seq_p90", "seq_different", "seq_undecided")


def _metrics(keys: Sequence[str]) -> list[TableMetric]:
    by = {m.key: m for m in TABLE_METRICS}
    bad = [k for k in keys if k not in by]
    if bad:
        raise ValueError(f"metrics {bad}: choose from {', '.join(by)}")
    return [by[k] for k in keys]


def _pool(sds: Sequence[float], ns: Sequence[int]) -> tuple[float, int]:
    num = sum((n - 1) * s**2 for s, n in zip(sds, ns) if n >= 2 and np.isfinite(s))
    df = sum(n - 1 for s, n in zip(sds, ns) if n >= 2 and np.isfinite(s))
    return (math.sqrt(num / df), int(df)) if df > 0 else (float("nan"), 0)


def variances_from_runs(path: str | os.PathLike | Sequence, metrics: Sequence[str] = DEFAULT_METRICS) -> pd.DataFrame:
    """Per metric: ``sd, df, sd_paired, df_paired, configs, baseline`` from a pilot's runs."""
    from dapo_exp.analysis.runs import RunSet, load_runs, with_endpoint

    data = path if isinstance(path, RunSet) else load_runs(path)
    inc = with_endpoint(data.included)
    labels = order_labels(inc["label"])
    base = baseline_label(labels) or (labels[0] if labels else None)
    rows = []
    for m in _metrics(metrics):
        per = {
            l: pd.Series(g[m.source].to_numpy(float) * m.scale, index=g["seed"].to_numpy()).dropna()
            for l, g in inc.groupby("label")
            if m.source in g
        }
        sd, df = _pool([s.std(ddof=1) if len(s) > 1 else np.nan for s in per.values()], [len(s) for s in per.values()])
        dsd, dn = [], []
        if base in per:
            b = per[base]
            for l, s in per.items():
                if l == base or not (s.index.is_unique and set(s.index) == set(b.index)):
                    continue
                d = (s - b.reindex(s.index)).dropna()
                if len(d) > 1:
                    dsd.append(float(d.std(ddof=1)))
                    dn.append(len(d))
        psd, pdf = _pool(dsd, dn)
        header = f"{acc_name(inc)} (%)" if m.key == DIFF_KEY else m.header  # the declared endpoint's name
        rows.append({"metric": m.key, "header": header, "configs": len(per), "sd": sd, "df": df,
                     "sd_paired": psd, "df_paired": pdf, "baseline": base,
                     "seeds": int(min((len(s) for s in per.values()), default=0))})
    return pd.DataFrame(rows).set_index("metric")


def variances_from_table(csv: str | os.PathLike, metrics: Sequence[str] = DEFAULT_METRICS) -> pd.DataFrame:
    """The same from a ``table.csv`` (sd columns, else backed out of the t intervals)."""
    t = pd.read_csv(csv, index_col="config")
    base = next((c for c in t.index if t.loc[c, "d_test"] == "baseline"), None) if "d_test" in t else None

    def sd_of(prefix: str, row) -> float:
        if f"{prefix}_sd" in t and np.isfinite(row.get(f"{prefix}_sd", np.nan)):
            return float(row[f"{prefix}_sd"])
        n = int(row.get(f"{prefix}_n", 0) or 0)
        lo, hi = row.get(f"{prefix}_lo", np.nan), row.get(f"{prefix}_hi", np.nan)
        if n < 2 or not np.isfinite(lo) or not np.isfinite(hi):
            return float("nan")
        return float((hi - lo) / 2 * math.sqrt(n) / stats.t.ppf(0.975, n - 1))

    rows = []
    for m in _metrics(metrics):
        if m.key not in t:
            continue
        sds = [sd_of(m.key, r) for _, r in t.iterrows()]
        ns = [int(r.get(f"{m.key}_n", 0) or 0) for _, r in t.iterrows()]
        sd, df = _pool(sds, ns)
        psd, pdf = float("nan"), 0
        if m.key == DIFF_KEY and "d_test" in t:
            paired = t[t["d_test"].fillna("").str.startswith("paired")]
            psd, pdf = _pool([sd_of(f"d_{DIFF_KEY}", r) for _, r in paired.iterrows()],
                             [int(r[f"d_{DIFF_KEY}_n"]) for _, r in paired.iterrows()])
        header = (f"{t['endpoint'].iloc[0]} (%)" if m.key == DIFF_KEY and "endpoint" in t and len(t)
                  else m.header)  # the declared endpoint's name (tables before it: final acc)
        rows.append({"metric": m.key, "header": header, "configs": len(t), "sd": sd, "df": df,
                     "sd_paired": psd, "df_paired": pdf, "baseline": base, "seeds": int(min(ns, default=0))})
    return pd.DataFrame(rows).set_index("metric")


def pilot_variances(source, metrics: Sequence[str] = DEFAULT_METRICS) -> pd.DataFrame:
    """From a sweep directory / RunSet, or a ``table.csv`` (a file ending in .csv)."""
    if isinstance(source, (str, os.PathLike)) and str(source).endswith(".csv"):
        return variances_from_table(source, metrics)
    return variances_from_runs(source, metrics)


def upper_sd(sd: float, df: int, level: float = 0.8) -> float:
    """The one-sided ``level`` upper confidence limit of a standard deviation with ``df`` degrees of freedom."""
    if df < 1 or not np.isfinite(sd):
        return float("nan")
    return float(sd * math.sqrt(df / stats.chi2.ppf(1 - level, df)))


def half_widths(sd: float, sd_paired: float, n: int, confidence: float = 0.95) -> dict[str, float]:
    """Half-widths (same unit as sd) of the 95% intervals that ``n`` seeds give (see module doc)."""
    q = lambda df: float(stats.t.ppf((1 + confidence) / 2, df)) if df > 0 else float("nan")  # noqa: E731
    # residual sd once the seed block is removed; without a paired estimate, the within-configuration
    # sd (which also holds the seed-to-seed part, so it over-states sd_e when seeds are correlated)
    sd_e = sd_paired / math.sqrt(2) if np.isfinite(sd_paired) else sd
    return {
        "mean": q(n - 1) * sd / math.sqrt(n),
        "paired diff": q(n - 1) * sd_paired / math.sqrt(n),
        "unpaired diff": q(2 * n - 2) * sd * math.sqrt(2 / n),
        "2^(5-1) effect": q(15 * (n - 1)) * 2 * sd_e / math.sqrt(FRACTIONAL_RUNS * n),
    }


def _given(paired_sd, key: str) -> float | None:
    if paired_sd is None:
        return None
    if isinstance(paired_sd, dict):
        v = paired_sd.get(key)
        return None if v is None else float(v)
    return float(paired_sd)


def _sds(r, key: str, given: float | None, correlation: float, advice: SeedAdvice) -> tuple:
    """(sd_paired, its df, where from, sd per arm, its df, where from) for one metric of a pilot; the
    endpoint's accuracy without a measured spread takes ``advice``'s (:func:`seed_advice`, as the launch line
    and a one-seed table do)."""
    if given is not None:
        sdp, sdp_df, sdp_from = given, 0, "--paired-sd"
    elif np.isfinite(r["sd_paired"]):
        sdp, sdp_df, sdp_from = float(r["sd_paired"]), int(r["df_paired"]), "pilot"
    elif key == "final_acc":
        sdp, sdp_df, sdp_from = advice.sd, advice.df, f"the toy's measured spread of {advice.what}"
    elif key in DEFAULT_PAIRED_SD:
        sdp, sdp_df = DEFAULT_PAIRED_SD[key][0], DEFAULT_PAIRED_DF
        sdp_from = f"default ({DEFAULT_PAIRED_SD[key][1]})"
    else:
        sdp, sdp_df, sdp_from = float("nan"), 0, "none (give --paired-sd)"
    if np.isfinite(r["sd"]):
        return sdp, sdp_df, sdp_from, float(r["sd"]), int(r["df"]), "pilot"
    if np.isfinite(sdp):
        return (sdp, sdp_df, sdp_from, sdp / math.sqrt(2 * (1 - correlation)), sdp_df,
                f"paired sd / sqrt(2 (1 - r)), r = {correlation:g}")
    return sdp, sdp_df, sdp_from, float("nan"), 0, "none"


def sequential_cost(delta: float, sd_paired: float, *, alpha: float = ALPHA, margin: float | None = DEFAULT_MARGIN,
                    first: int = sequential.DEFAULT_FIRST, budget: int = sequential.DEFAULT_BUDGET,
                    sims: int = SEQ_SIMS, seed: int = SEQ_SEED) -> dict[str, float]:
    """A sequential sweep's cost at a true difference ``delta`` (module doc): ``seq_mean`` and ``seq_p90``
    seeds per configuration at its stop, ``seq_different`` (P(different)) and ``seq_undecided`` (P(still
    undecided at the budget)); NaN without a finite sd."""
    if not (np.isfinite(sd_paired) and sd_paired > 0):
        return dict.fromkeys(SEQ_COLUMNS, float("nan"))
    st = sequential.simulate(delta, sd_paired, sims=sims, budget=budget, first=first, alpha=alpha, margin=margin,
                             seed=seed)
    n = np.sort(st.n)
    return {"seq_mean": float(n.mean()), "seq_p90": float(n[math.ceil(0.9 * len(n)) - 1]),
            "seq_different": float(np.mean(st.state == sequential.DIFFERENT)),
            "seq_undecided": float(np.mean(st.state == sequential.UNDECIDED))}


def plan(source, delta: float = DEFAULT_DELTA, *, metrics: Sequence[str] = DEFAULT_METRICS,
         ns: Sequence[int] = DEFAULT_N, power: float = POWER, alpha: float = ALPHA,
         paired_sd: float | dict[str, float] | None = None, correlation: float = 0.0,
         margin: float | None = DEFAULT_MARGIN, budget: int = sequential.DEFAULT_BUDGET,
         sims: int = SEQ_SIMS) -> pd.DataFrame:
    """One row per metric: the pilot's variances, the sds used, seeds needed (paired and unpaired),
    seeds to add, half-widths at each N in ``ns``, and a sequential sweep's expected cost at ``delta``.

    ``paired_sd``: the sd of per-seed differences to use (one number for every metric, or per metric
    key), e.g. measured elsewhere; it replaces the pilot's. Without it and without a pilot estimate
    (one seed per configuration): the toy's measured spread for the endpoint's accuracy
    (:func:`dapo_exp.analysis.verdicts.seed_advice`), :data:`DEFAULT_PAIRED_SD` for the others. ``correlation``: r between the arms'
    per-seed values, for the unpaired counts when the pilot has no between-seed sd. ``margin`` (pp),
    ``budget``, ``sims``: the sequential sweep's equivalence margin (accuracy metrics only), most seeds
    and simulated sweeps (:func:`sequential_cost`).
    """
    if not -1.0 < correlation < 1.0:
        raise ValueError(f"correlation {correlation}: must lie in (-1, 1)")
    data = None
    if not (isinstance(source, (str, os.PathLike)) and str(source).endswith(".csv")):
        from dapo_exp.analysis.runs import RunSet, load_runs

        data = source if isinstance(source, RunSet) else load_runs(source)
        if not len(data.runs):
            raise FileNotFoundError(f"no runs found in {source}")
    v = pilot_variances(data if data is not None else source, metrics)
    advice = runs_seed_advice(data.included if data is not None else pd.DataFrame())
    rows = []
    for key, r in v.iterrows():
        row = r.to_dict()
        row["delta"] = delta
        sdp, sdp_df, sdp_from, sda, sda_df, sda_from = _sds(r, key, _given(paired_sd, key), correlation, advice)
        row.update({"sd_paired_used": sdp, "sd_paired_from": sdp_from, "sd_arm": sda, "sd_arm_from": sda_from,
                    "correlation": correlation})
        row["n_unpaired"] = seeds_unpaired(delta, sda, power, alpha)
        row["n_paired"] = seeds_paired(delta, sdp, power, alpha)
        row["n_unpaired_sd80"] = seeds_unpaired(delta, upper_sd(sda, sda_df), power, alpha)
        row["n_paired_sd80"] = seeds_paired(delta, upper_sd(sdp, sdp_df), power, alpha)
        have = int(r.get("seeds", 0) or 0)
        row["seeds_to_add"] = max(0, int(row["n_paired"]) - have) if row["n_paired"] > 0 else -1
        row["rerun"] = ""
        if data is not None and row["seeds_to_add"] > 0:
            from dapo_exp.analysis.verdicts import rerun_command

            row["rerun"] = rerun_command(data.included, int(row["n_paired"]))
        for n in ns:
            for what, h in half_widths(sda, sdp, n).items():
                row[f"hw {what} @{n}"] = h
        acc = _metrics([key])[0].scale == 100.0  # accuracy, in points: the margin applies
        row.update(sequential_cost(delta, sdp, alpha=alpha, margin=margin if acc else None, budget=budget,
                                   sims=sims))
        row["seq_margin"] = margin if acc and margin is not None else float("nan")
        rows.append({"metric": key, **row})
    out = pd.DataFrame(rows).set_index("metric")
    out.attrs.update({"delta": delta, "power": power, "alpha": alpha, "ns": tuple(ns), "source": str(source),
                      "correlation": correlation, "budget": budget, "sims": sims})
    return out


def format_plan(p: pd.DataFrame) -> str:
    """The plan as text: one block per metric."""
    ns = p.attrs.get("ns", DEFAULT_N)
    d, pw, a = p.attrs["delta"], p.attrs["power"], p.attrs["alpha"]
    lines = [
        f"Seed plan from {p.attrs.get('source')}: detect a difference of {d:g} (table units; pp for accuracy) "
        f"with power {pw:g} at two-sided alpha {a:g}.",
    ]
    n_txt = lambda n: "n/a (no variance: give --paired-sd)" if n < 0 else str(n)  # noqa: E731
    for _, r in p.iterrows():
        have = int(r.get("seeds", 0) or 0)
        sdp_from = r.get("sd_paired_from", "pilot")
        if np.isfinite(r["sd"]):
            first = (f"{r['header']}: pilot sd across seeds {r['sd']:.2f} (pooled over {r['configs']} configurations, "
                     f"{int(r['df'])} df); sd of per-seed differences to {r['baseline']} "
                     + (f"{r['sd_paired']:.2f} ({int(r['df_paired'])} df)" if np.isfinite(r["sd_paired"]) else "n/a"))
            if np.isfinite(r["sd_paired"]) and r["sd"] > 0:
                first += f"; implied r between arms {1 - r['sd_paired'] ** 2 / (2 * r['sd'] ** 2):+.2f}"
        else:
            first = (f"{r['header']}: the pilot has {have} seed(s) per configuration ({r['configs']} configurations): "
                     "no spread measured")
        lines += ["", first]
        if sdp_from != "pilot" or r.get("sd_arm_from", "pilot") != "pilot":
            sdp = r.get("sd_paired_used", np.nan)
            lines.append(
                "  using: sd of per-seed differences "
                + (f"{sdp:.2f} from {sdp_from}" if np.isfinite(sdp) else f"n/a ({sdp_from})")
                + "; sd per arm "
                + (f"{r['sd_arm']:.2f} from {r['sd_arm_from']}" if np.isfinite(r["sd_arm"]) else "n/a")
            )
        lines.append(
            f"  seeds per configuration for power {pw:g}: unpaired {n_txt(r['n_unpaired'])}, "
            f"paired {n_txt(r['n_paired'])}; with the sd at its 80% upper bound: "
            f"unpaired {n_txt(r['n_unpaired_sd80'])}, paired {n_txt(r['n_paired_sd80'])}"
        )
        add = int(r.get("seeds_to_add", -1))
        if add > 0:
            cmd = r.get("rerun", "")
            lines.append(f"  add {add} seeds per configuration (to {int(r['n_paired'])}, paired by seed)"
                         + (f": {cmd}" if isinstance(cmd, str) and cmd else ""))
        elif add == 0:
            lines.append(f"  the pilot's {have} seeds per configuration are enough (paired by seed)")
        hw = pd.DataFrame(
            {
                f"N={n}": [r[f"hw {w} @{n}"] for w in ("mean", "paired diff", "unpaired diff", "2^(5-1) effect")]
                for n in ns
            },
            index=["mean ±", "paired diff ±", "unpaired diff ±", "2^(5-1) effect ±"],
        )
        lines.append("  95% half-width with N seeds:")
        lines += ["    " + l for l in hw.to_string(float_format=lambda x: f"{x:.1f}", na_rep="n/a").splitlines()]
        lines += _sequential_lines(r, p.attrs)
    return "\n".join(lines) + "\n"


def _sequential_lines(r, attrs: dict) -> list[str]:
    """The plan's sequential line for one metric (nothing for a plan made without it)."""
    if "seq_mean" not in r or not np.isfinite(r["seq_mean"]):
        return []
    m = r.get("seq_margin", np.nan)
    stop = "different" + (f" or equivalent within ±{m:g}" if np.isfinite(m) else "")
    return [
        f"  or a sequential sweep (anytime-valid interval at alpha {attrs['alpha']:g}; "
        f"{sequential.DEFAULT_FIRST} seeds, then one per round until {stop}, at most {attrs.get('budget')}): "
        f"at a difference of {attrs['delta']:g}, {r['seq_mean']:.1f} seeds per configuration expected, 90% of "
        f"sweeps within {int(r['seq_p90'])}; P(different) {r['seq_different']:.2f}, undecided at the budget "
        f"{r['seq_undecided']:.2f}",
        f"    ({attrs.get('sims')} simulated sweeps at the sd of per-seed differences used; its error rates hold "
        "wherever it stops: python -m dapo_exp.benchmarks.sequential)",
    ]
