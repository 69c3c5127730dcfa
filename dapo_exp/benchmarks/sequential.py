"""Benchmark: sequential sweeps of one comparison, stopped by the anytime-valid interval.

    python -m dapo_exp.benchmarks.sequential                    # 20,000 simulated sweeps per effect (seconds)
    python -m dapo_exp.benchmarks.sequential --phi-grid --out DIR   # and the phi table; writes the files

A simulated sweep draws paired differences (one per seed, percentage points) and runs the sweeper's rule
(:func:`dapo_exp.analysis.sequential.stops`): ``--first`` seeds, then one per round; after each round the
anytime-valid interval at ``--alpha`` (:func:`dapo_exp.analysis.sequential.sequence`); a stop when the
comparison is *different* (the interval excludes 0) or *equivalent* (it lies inside ``+-margin``), else
at ``--budget`` seeds (*undecided*). Every figure comes with its Monte Carlo 95% interval: Wilson for a
rate (``statsmodels``' ``proportion_confint``), t for a mean, the binomial order-statistic interval for a
percentile. It reports:

- the false-positive rate ("different" at effect 0), with PASS when it is <= alpha and its upper bound
  within 0.01 of alpha; beside it **naive peeking** (the fixed-sample 95% t interval checked after every
  seed from 2 to the budget, stopping at the first that excludes 0) and the fixed 5-seed t test;
- per effect (Gaussian differences of sd ``--sd``): P(different with the right sign), P(equivalent),
  P(undecided), the coverage of the interval at the stopping time, the expected and 90th-percentile
  seeds to the stop, and the **fixed design of the same power**: the smallest n whose two-sided paired t
  test at alpha has P(significant with the right sign) >= the sequential design's P(different with the
  right sign) (capped at 0.999); at effect 0 the smallest n whose TOST at alpha and the margin has
  P(equivalent) >= the sequential design's P(equivalent) (capped the same). Acceptance: fewer expected
  seeds than the fixed design at every effect >= the margin;
- the false-equivalence rate at 1.5 x margin;
- the same false-positive rate and coverage with differences **resampled** from committed runs
  (``--runs``, a ``runs.csv``; ``--pair A,B``, or ``consecutive``: each configuration against the one
  before it in the file, a ladder's rungs): the per-seed differences on the declared endpoint in points,
  each pair's mean removed, pooled and drawn with replacement, plus the effect;
- with ``--phi-grid``, the expected seeds at each effect for phi in 0.05 .. 1 (the same draws).

Prints the report (markdown); ``--out DIR`` also writes ``sequential.md``, ``sequential.csv`` (one row
per figure: data, effect, phi, quantity, value, mc_lo, mc_hi) and, with ``--phi-grid``,
``sequential_phi.csv``.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import integrate, stats

from dapo_exp.analysis import sequential as S
from dapo_exp.analysis.verdicts import DEFAULT_MARGIN

ROOT = Path(__file__).resolve().parents[2]
RUNS = "sweeps/results/2026-11-27-toy_dapo_ladder/runs.csv"
EFFECTS = (0.0, 2.5, 5.0, 10.0)
PHIS = (0.05, 0.1, 0.25, 0.5, 1.0)
POWER_CAP = 0.999
FIXED = 5  # seeds of the fixed-sample t test the false-positive rates are set beside
N_MAX = 2000  # the largest fixed design searched
ENDPOINTS = ("endpoint/eval/acc_avg", "final/eval/acc_avg")  # the declared endpoint, else the final accuracy


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m dapo_exp.benchmarks.sequential",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--sims", type=int, default=20000, help="simulated sweeps per effect (default 20000)")
    p.add_argument("--sd", type=float, default=2.19, help="sd of the paired differences, pp (default 2.19: the "
                                                          "toy's measured paired sd of Clip-Higher)")
    p.add_argument("--alpha", type=float, default=S.DEFAULT_ALPHA)
    p.add_argument("--phi", type=float, default=S.DEFAULT_PHI)
    p.add_argument("--margin", type=float, default=DEFAULT_MARGIN, help="equivalence margin, pp (default %(default)g)")
    p.add_argument("--first", type=int, default=S.DEFAULT_FIRST,
                   help="seeds of the first round (default %(default)s)")
    p.add_argument("--budget", type=int, default=S.DEFAULT_BUDGET, help="seeds at most (default %(default)s)")
    p.add_argument("--effects", default=",".join(f"{e:g}" for e in EFFECTS), help="true effects, pp")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs", default=RUNS, help=f"runs.csv to resample differences from (default {RUNS})")
    p.add_argument("--pair", default="consecutive", help="A,B (B - A by seed) or consecutive (default)")
    p.add_argument("--phi-grid", action="store_true", help="also the expected seeds for phi in "
                                                           + ", ".join(map(str, PHIS)))
    p.add_argument("--out", type=Path, default=None, help="also write sequential.md / .csv here")
    args = p.parse_args(argv)
    args.effects = [float(x) for x in args.effects.split(",")]
    if args.sims < 100 or not 2 <= args.first <= args.budget or args.sd <= 0 or args.margin <= 0:
        p.error("need --sims >= 100, 2 <= --first <= --budget, --sd > 0 and --margin > 0")
    return args


# ---- Monte Carlo intervals -------------------------------------------------------------------------------------


def rate(hits: np.ndarray) -> tuple[float, float, float]:
    """A rate and its Wilson 95% interval."""
    from statsmodels.stats.proportion import proportion_confint

    k, n = int(np.sum(hits)), int(np.size(hits))
    lo, hi = proportion_confint(k, n, alpha=0.05, method="wilson")
    return k / n, float(lo), float(hi)


def mean_ci(x: np.ndarray) -> tuple[float, float, float]:
    """A mean and its t 95% interval."""
    x = np.asarray(x, dtype=float)
    h = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return float(x.mean()), float(x.mean() - h), float(x.mean() + h)


def quantile_ci(x: np.ndarray, q: float = 0.9) -> tuple[float, float, float]:
    """The ``q`` quantile (the smallest value with at least ``q`` of the mass at or below it) and its
    distribution-free 95% interval (order statistics at the binomial's 2.5% and 97.5% points)."""
    s = np.sort(np.asarray(x))
    n = len(s)
    lo, hi = (int(v) for v in stats.binom.ppf([0.025, 0.975], n, q))
    return float(s[math.ceil(q * n) - 1]), float(s[max(lo - 1, 0)]), float(s[min(hi, n - 1)])


# ---- the fixed designs -----------------------------------------------------------------------------------------


def fixed_power(effect: float, sd: float, n: np.ndarray, alpha: float) -> np.ndarray:
    """P(the two-sided paired t test at ``alpha`` with ``n`` pairs is significant with the effect's sign)."""
    n = np.asarray(n, dtype=float)
    tc = stats.t.ppf(1 - alpha / 2, n - 1)
    return stats.nct.sf(tc, n - 1, abs(effect) / sd * np.sqrt(n))


def tost_probability(n: int, sd: float, margin: float, alpha: float, effect: float = 0.0) -> float:
    """P(TOST at ``alpha`` shows equivalence within ``+-margin`` with ``n`` pairs): the 1 - 2 alpha t
    interval inside the margin, integrated exactly over the sample variance (chi-square)."""
    nu, se = n - 1, sd / math.sqrt(n)
    tq = stats.t.ppf(1 - alpha, nu)

    def given(q: float) -> float:  # q = nu s^2 / sd^2 ~ chi2(nu): P(|mean| < margin - tq s / sqrt(n) | s)
        h = margin - tq * sd * math.sqrt(q / nu) / math.sqrt(n)
        p = stats.norm.cdf((h - effect) / se) - stats.norm.cdf((-h - effect) / se) if h > 0 else 0.0
        return p * stats.chi2.pdf(q, nu)

    top = nu * (margin * math.sqrt(n) / (tq * sd)) ** 2
    return float(integrate.quad(given, 0, top, limit=200)[0])


def fixed_n(effect: float, sd: float, target: float, alpha: float, margin: float) -> int:
    """The smallest fixed n matching ``target`` (capped at POWER_CAP): the t test's power at a nonzero
    effect, TOST's P(equivalent) at 0; -1 beyond N_MAX."""
    target = min(target, POWER_CAP)
    if effect == 0:
        return next((n for n in range(2, N_MAX + 1) if tost_probability(n, sd, margin, alpha) >= target), -1)
    ns = np.arange(2, N_MAX + 1)
    ok = np.flatnonzero(fixed_power(effect, sd, ns, alpha) >= target)
    return int(ns[ok[0]]) if len(ok) else -1


def naive_peeking(d: np.ndarray, alpha: float, start: int = 2) -> np.ndarray:
    """Per row of ``d``: whether the fixed-sample ``1 - alpha`` t interval excludes 0 at any n from
    ``start`` to the row's length (checked after every seed)."""
    n = np.arange(1, d.shape[-1] + 1)
    mean = np.cumsum(d, axis=-1) / n
    with np.errstate(divide="ignore", invalid="ignore"):
        var = (np.cumsum(d * d, axis=-1) - n * mean**2) / (n - 1)
        half = stats.t.ppf(1 - alpha / 2, n - 1) * np.sqrt(np.maximum(var, 0.0) / n)
    excl = np.abs(mean) > half
    return excl[:, start - 1:].any(axis=-1)


# ---- resampled differences -------------------------------------------------------------------------------------


def _label(runs: pd.DataFrame) -> pd.Series:
    if "engine" in runs and runs["engine"].nunique() > 1:
        return runs["engine"].astype(str) + "/" + runs["label"].astype(str)
    return runs["label"].astype(str)


def paired_differences(csv: str | os.PathLike, pair: str = "consecutive") -> tuple[np.ndarray, str]:
    """The per-seed differences of a committed ``runs.csv`` in points, each pair's mean removed, pooled;
    and a line saying where they come from."""
    runs = pd.read_csv(csv)
    if "included" in runs:
        runs = runs[runs["included"].astype(str).str.lower() == "true"]
    col = next((c for c in ENDPOINTS if c in runs), None)
    if col is None:
        raise ValueError(f"{csv}: no accuracy column ({' or '.join(ENDPOINTS)})")
    small = pd.DataFrame({"seed": runs["seed"], "label": _label(runs), "value": runs[col]})
    values = small.pivot_table(index="seed", columns="label", values="value", aggfunc="first")
    scale = 100.0 if np.nanmax(values.to_numpy()) <= 1.0 else 1.0
    labels = list(pd.unique(small["label"]))
    pairs = list(zip(labels, labels[1:])) if pair == "consecutive" else [tuple(pair.split(",", 1))]
    pool, parts = [], []
    for a, b in pairs:
        if a not in values or b not in values:
            raise ValueError(f"{csv}: no configuration {a if a not in values else b!r} (have {', '.join(labels)})")
        d = ((values[b] - values[a]) * scale).dropna().to_numpy()
        if len(d) < 2:
            raise ValueError(f"{csv}: {b} - {a} has {len(d)} seeds in common")
        pool.append(d - d.mean())
        parts.append(f"{b} - {a} ({len(d)} seeds, mean {d.mean():+.2f}, sd {d.std(ddof=1):.2f})")
    out = np.concatenate(pool)
    where = (f"{_shown(csv)}, column {col}{' x 100' if scale != 1 else ''}: {'; '.join(parts)}; "
             f"{len(out)} differences, each pair's mean removed, sd {out.std(ddof=1):.2f} pp")
    return out, where


def _shown(path) -> str:
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(path)


def _resolve(path: str) -> Path:
    p = Path(path)
    return p if p.exists() or p.is_absolute() else ROOT / p


# ---- the simulations -------------------------------------------------------------------------------------------


def summarize(st: S.Stops, effect: float) -> dict[str, tuple[float, float, float]]:
    """The figures of one batch of sweeps at one true effect."""
    sign = np.sign(st.mean) == (np.sign(effect) if effect else 1)
    diff = st.state == S.DIFFERENT
    out = {
        "p_different": rate(diff),
        "p_different_right_sign": rate(diff & sign) if effect else (np.nan, np.nan, np.nan),  # no sign at 0
        "p_equivalent": rate(st.state == S.EQUIVALENT),
        "p_undecided": rate(st.state == S.UNDECIDED),
        "coverage": rate((st.lo <= effect) & (effect <= st.hi)),
        "expected_seeds": mean_ci(st.n),
        "p90_seeds": quantile_ci(st.n, 0.9),
    }
    return out


def gaussian_rows(args, z: np.ndarray) -> list[dict]:
    """Every figure of the Gaussian simulation, one row each (``z``: standard normal draws)."""
    rows = []
    eq_effect = 1.5 * args.margin
    for effect in [*args.effects, *([eq_effect] if eq_effect not in args.effects else [])]:
        d = effect + args.sd * z
        st = S.stops(d, first=args.first, alpha=args.alpha, phi=args.phi, margin=args.margin)
        fig = summarize(st, effect)
        target = fig["p_equivalent"][0] if effect == 0 else fig["p_different_right_sign"][0]
        fig["fixed_n"] = (float(fixed_n(effect, args.sd, target, args.alpha, args.margin)), np.nan, np.nan)
        if effect == 0:
            fig["naive_peeking_fpr"] = rate(naive_peeking(d, args.alpha, 2))
            fig["naive_peeking_from_first_fpr"] = rate(naive_peeking(d, args.alpha, args.first))
            fig["fixed5_fpr"] = rate(naive_peeking(d[:, :FIXED], args.alpha, FIXED))
        rows += [{"data": "gaussian", "effect": effect, "phi": args.phi, "quantity": k, "value": v[0],
                  "mc_lo": v[1], "mc_hi": v[2]} for k, v in fig.items()]
    return rows


def resampled_rows(args, pool: np.ndarray, rng: np.random.Generator) -> list[dict]:
    """The false-positive rate, coverage and seeds with differences drawn from ``pool`` (+ the effect)."""
    idx = rng.integers(0, len(pool), (args.sims, args.budget))
    rows = []
    for effect in args.effects:
        d = effect + pool[idx]
        st = S.stops(d, first=args.first, alpha=args.alpha, phi=args.phi, margin=args.margin)
        fig = summarize(st, effect)
        if effect == 0:
            fig["naive_peeking_fpr"] = rate(naive_peeking(d, args.alpha, 2))
        rows += [{"data": "resampled", "effect": effect, "phi": args.phi, "quantity": k, "value": v[0],
                  "mc_lo": v[1], "mc_hi": v[2]} for k, v in fig.items()]
    return rows


def phi_rows(args, z: np.ndarray) -> list[dict]:
    """Expected seeds (and the false-positive rate at 0) for each phi of PHIS, on the same draws."""
    rows = []
    for phi in PHIS:
        for effect in args.effects:
            st = S.stops(effect + args.sd * z, first=args.first, alpha=args.alpha, phi=phi, margin=args.margin)
            figs = {"expected_seeds": mean_ci(st.n), "p_undecided": rate(st.state == S.UNDECIDED)}
            if effect == 0:
                figs["fpr"] = rate(st.state == S.DIFFERENT)
            rows += [{"data": "gaussian", "effect": effect, "phi": phi, "quantity": k, "value": v[0],
                      "mc_lo": v[1], "mc_hi": v[2]} for k, v in figs.items()]
    return rows


# ---- the report ------------------------------------------------------------------------------------------------


def _get(t: pd.DataFrame, data: str, effect: float, quantity: str, phi: float | None = None) -> tuple:
    sel = t[(t["data"] == data) & np.isclose(t["effect"], effect) & (t["quantity"] == quantity)]
    if phi is not None:
        sel = sel[np.isclose(sel["phi"], phi)]
    r = sel.iloc[0]
    return float(r["value"]), float(r["mc_lo"]), float(r["mc_hi"])


def _ci(v: tuple, digits: int = 4) -> str:
    if not np.isfinite(v[0]):
        return "—"
    return f"{v[0]:.{digits}f} [{v[1]:.{digits}f}, {v[2]:.{digits}f}]"


def checks(t: pd.DataFrame, args) -> tuple[bool, bool]:
    """(false-positive criterion, expected-seeds acceptance)."""
    fpr = _get(t, "gaussian", 0.0, "p_different")
    fpr_ok = fpr[0] <= args.alpha and fpr[2] <= args.alpha + 0.01
    big = [e for e in t[t["data"] == "gaussian"]["effect"].unique() if e >= args.margin]
    seeds_ok = all(0 < _get(t, "gaussian", e, "expected_seeds")[0] < _get(t, "gaussian", e, "fixed_n")[0]
                   or _get(t, "gaussian", e, "fixed_n")[0] < 0 for e in big)
    return fpr_ok, seeds_ok


def fpr_section(t: pd.DataFrame, args, where: str) -> list[str]:
    g = lambda q, data="gaussian": _ci(_get(t, data, 0.0, q))  # noqa: E731
    fpr_ok, _ = checks(t, args)
    return [
        "## False positives at effect 0 (\"different\" when the true difference is 0)",
        "",
        f"- sequential, Gaussian: **{g('p_different')}** ({args.sims} sweeps): "
        f"**{'PASS' if fpr_ok else 'FAIL'}** (<= alpha {args.alpha:g}, upper MC bound <= alpha + 0.01)",
        f"- naive peeking, Gaussian (95% t interval after every seed 2..{args.budget}, stop at the first that "
        f"excludes 0): **{g('naive_peeking_fpr')}**; from seed {args.first} on (the sequential's first look): "
        f"{g('naive_peeking_from_first_fpr')}",
        f"- fixed {FIXED}-seed t test, Gaussian: {g('fixed5_fpr')}",
        f"- sequential, resampled: **{g('p_different', 'resampled')}**; naive peeking, resampled: "
        f"{g('naive_peeking_fpr', 'resampled')}",
        f"- false equivalence at 1.5 x margin = {1.5 * args.margin:g} pp (Gaussian): "
        f"{_ci(_get(t, 'gaussian', 1.5 * args.margin, 'p_equivalent'))}",
        "",
        f"Resampled differences: {where}.",
    ]


def effects_section(t: pd.DataFrame, args) -> list[str]:
    _, seeds_ok = checks(t, args)
    lines = [
        f"## Per effect (Gaussian differences, sd {args.sd:g} pp)",
        "",
        "P(diff+): P(different with the right sign) by the budget (the sequential design's power); fixed n: the "
        "smallest n whose two-sided paired t test at alpha has that power (capped at "
        f"{POWER_CAP:g}); at effect 0, whose TOST at alpha and +-{args.margin:g} pp has the sequential design's "
        "P(equivalent). Seeds per arm (pairs). MC 95% intervals in brackets.",
        "",
        "| effect (pp) | P(diff+) | P(equivalent) | P(undecided) | coverage at stop | E[seeds] | 90th pct seeds "
        "| fixed n (same power) | E[seeds] < fixed |",
        "|---:|---|---|---|---|---|---|---:|---|",
    ]
    for e in sorted(t[t["data"] == "gaussian"]["effect"].unique()):
        g = lambda q, e=e: _get(t, "gaussian", e, q)  # noqa: E731
        fx, es = g("fixed_n")[0], g("expected_seeds")
        which = "TOST" if e == 0 else "t"
        lines.append(
            f"| {e:g} | {_ci(g('p_different_right_sign'), 3)} | {_ci(g('p_equivalent'), 3)} "
            f"| {_ci(g('p_undecided'), 3)} | {_ci(g('coverage'), 3)} | {_ci(es, 2)} | {_ci(g('p90_seeds'), 0)} "
            f"| {int(fx) if fx > 0 else f'> {N_MAX}'} ({which}) | {'yes' if fx < 0 or es[0] < fx else 'no'} |")
    lines += ["", f"Acceptance (expected seeds below the fixed design's at every effect >= {args.margin:g} pp): "
                  f"**{'PASS' if seeds_ok else 'FAIL'}**"]
    return lines


def resampled_section(t: pd.DataFrame, args) -> list[str]:
    lines = ["## Resampled differences (committed runs, centred, + the effect)", "",
             "| effect (pp) | P(different) | P(diff+) | P(equivalent) | coverage at stop | E[seeds] |",
             "|---:|---|---|---|---|---|"]
    for e in args.effects:
        g = lambda q, e=e: _get(t, "resampled", e, q)  # noqa: E731
        lines.append(f"| {e:g} | {_ci(g('p_different'), 3)} | {_ci(g('p_different_right_sign'), 3)} "
                     f"| {_ci(g('p_equivalent'), 3)} | {_ci(g('coverage'), 3)} | {_ci(g('expected_seeds'), 2)} |")
    return lines


def phi_section(t: pd.DataFrame, args) -> list[str]:
    head = " | ".join(f"E[seeds] @{e:g}" for e in args.effects)
    lines = [f"## phi (Gaussian, sd {args.sd:g} pp)", "",
             "The same draws for every phi: the differences between rows are surer than each row's interval "
             "suggests.", "",
             f"| phi | {head} | FPR @0 |", "|---:|" + "---|" * (len(args.effects) + 1)]
    for phi in PHIS:
        cells = " | ".join(_ci(_get(t, "gaussian", e, "expected_seeds", phi), 2) for e in args.effects)
        lines.append(f"| {phi:g} | {cells} | {_ci(_get(t, 'gaussian', 0.0, 'fpr', phi), 4)} |")
    return lines


def load_line() -> str:
    """``uptime``'s line (the load averages from the OS where there is no ``uptime``)."""
    if shutil.which("uptime"):
        out = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
        if out:
            return out
    return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def header(args, argv: list[str], before: str, after: str, wall: float) -> list[str]:
    from dapo_exp.rundir import git_commit

    cmd = " ".join(["python -m dapo_exp.benchmarks.sequential", *argv])
    return [
        "# Sequential sweeps of one comparison: anytime-valid intervals (issue 37)",
        "",
        f"Command: `{cmd}`",
        "",
        f"{datetime.datetime.now().isoformat(timespec='seconds')}, commit {git_commit()}; {platform.platform()}, "
        f"{os.cpu_count()} CPUs; wall time {wall:.1f} s (the simulations and the report, after the imports)",
        "",
        f"Load (uptime) before: `{before}`; after: `{after}`",
        "",
        f"Rule: {args.first} seeds, then one per round, up to {args.budget}; after each round the anytime-valid "
        f"interval (the confidence sequence at alpha {args.alpha:g}, phi {args.phi:g}); stop when different "
        f"(excludes 0) or equivalent (inside +-{args.margin:g} pp). {args.sims} simulated sweeps per effect, "
        f"seed {args.seed}.",
    ]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    before, start = load_line(), time.perf_counter()
    rng = np.random.default_rng(args.seed)
    z = rng.standard_normal((args.sims, args.budget))
    pool, where = paired_differences(_resolve(args.runs), args.pair)
    t = pd.DataFrame(gaussian_rows(args, z) + resampled_rows(args, pool, rng))
    tphi = pd.DataFrame(phi_rows(args, z)) if args.phi_grid else None
    body = fpr_section(t, args, where) + [""] + effects_section(t, args) + [""] + resampled_section(t, args)
    if tphi is not None:
        body += [""] + phi_section(tphi, args)
    md = "\n".join(header(args, argv, before, load_line(), time.perf_counter() - start) + [""] + body) + "\n"
    print(md, end="")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sequential.md").write_text(md)
        t.to_csv(args.out / "sequential.csv", index=False)
        if tphi is not None:
            tphi.to_csv(args.out / "sequential_phi.csv", index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
