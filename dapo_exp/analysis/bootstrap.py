"""Hierarchical bootstrap of avg@k over seeds, problems and samples (numpy, seeded).

A seed interval (the table's Student-t) sees only how runs differ; it ignores that every run was
evaluated on the same, small sample of problems (AIME 2024: 30). This bootstrap resamples the
three levels of an evaluation, from the per-problem samples each run writes
(``eval_samples.jsonl``; the last evaluation step of each run, i.e. the final one):

1. **seeds**: drawn with replacement among a configuration's seeds. Configurations with the same
   set of seeds share the draw (the pairing by seed of the paired t interval);
2. **problems**: drawn with replacement among the evaluated problems, one draw per replicate
   shared by every run (problems are crossed with runs: all runs answer the same problems);
3. **samples**: the k samples of each drawn (run, problem) copy drawn with replacement, i.e. the
   number correct is Binomial(k, c / k) per copy (a problem drawn twice gets two independent
   draws: Binomial(m k, c / k) for m copies).

A replicate's avg@k of a configuration is the mean over its drawn seeds of the run's mean over the
drawn problems of the fraction correct. Statistics of configurations (a mean, a difference, the
effects of :mod:`dapo_exp.analysis.effects`, all linear in these means) are computed per replicate.

**Interval.** ``estimate ± t_{(1+c)/2, S-1} · sd* · sqrt(S / (S - 1))`` with S seeds and sd* the
standard deviation of the replicates. The bootstrap variance of a mean of S values is
(S - 1) / S times the usual s^2 / S, and with few seeds the t quantile, not the normal one, gives
the stated coverage; so when the seeds are the only source of variance this is the t interval
(tested). With S = 1 the seed variance is unknown and the interval is undefined (n/a), as for the
t interval. ``kind="percentile"`` gives the plain percentile interval instead (sensible only with
many seeds). Without the seed level (``levels`` lacking ``"seed"``) the interval is
``estimate ± z · sd*`` over problems and samples alone.

**What it counts twice, and what it cannot count.** A run's avg@k already carries its own sample
noise, so resampling samples inside resampled seeds counts that noise twice (the interval is
conservative by a term of order p (1 - p) / (P k S)); with seeds resampled, ``levels=("seed",
"problem")`` avoids it. Problems crossed with seeds have no exact bootstrap (McCullagh 2000);
resampling both is the usual, slightly conservative, choice.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from dapo_exp.analysis.runs import RunSet

LEVELS = ("seed", "problem", "sample")
KINDS = ("t", "percentile")
DEFAULT_B = 2000
DEFAULT_SEED = 0


@dataclass
class SampleCube:
    """Per-problem counts of the final evaluation, arranged configuration x seed x problem.

    ``correct[g, s, p]`` and ``total[g, s, p]``: correct samples and samples of problem p in the
    run of configuration g with seed ``seeds[s]`` (total 0 where that run or problem is missing).
    """

    configs: list[str]
    seeds: list
    problems: list
    correct: np.ndarray  # (G, S, P) float
    total: np.ndarray  # (G, S, P) float

    @property
    def has_run(self) -> np.ndarray:
        """(G, S) bool: the configuration has a run with that seed."""
        return self.total.sum(axis=2) > 0

    def run_acc(self) -> np.ndarray:
        """(G, S) avg@k of each run (NaN where there is no run): mean over problems of the fraction correct."""
        with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a (configuration, seed) without a run: NaN
            frac = self.correct / self.total
            return np.nanmean(np.where(self.total > 0, frac, np.nan), axis=2) if self.total.size else frac

    def means(self) -> np.ndarray:
        """(G,) the point estimate: mean over a configuration's seeds of its runs' avg@k."""
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return np.nanmean(self.run_acc(), axis=1)

    def subset_problems(self, problems: Sequence) -> SampleCube:
        idx = [self.problems.index(p) for p in problems]
        return SampleCube(self.configs, self.seeds, list(problems), self.correct[:, :, idx], self.total[:, :, idx])


def eval_cube(data: RunSet | pd.DataFrame, *, label_col: str = "label") -> SampleCube:
    """The :class:`SampleCube` of the included runs' final evaluations (``eval_samples.jsonl``).

    Raises a ValueError naming the runs without samples (e.g. online W&B runs, or runs with
    ``eval.save_samples=false``): the bootstrap needs every run's samples.
    """
    from dapo_exp.analysis.samples import load_samples

    runs = data.runs if isinstance(data, RunSet) else data
    if "included" in runs:
        runs = runs[runs["included"]]
    s = load_samples(runs, "eval", step="last", included_only=False)
    missing = sorted(set(runs["run"]) - set(s["run"])) if len(runs) else []
    if missing:
        raise ValueError(
            f"the bootstrap needs the per-problem eval samples ({len(missing)} run(s) have no eval_samples.jsonl "
            f"under a local run directory, e.g. {missing[0]})"
        )
    lab = runs.set_index("run")[label_col]
    s = s.assign(config=s["run"].map(lab), correct=s["correct"].astype(float))
    grp = s.groupby(["config", "seed", "problem_id"])["correct"].agg(["sum", "count"])
    configs = list(dict.fromkeys(runs[label_col]))
    seeds = sorted(runs["seed"].unique(), key=str)
    problems = sorted(s["problem_id"].unique(), key=str)
    shape = (len(configs), len(seeds), len(problems))
    correct, total = np.zeros(shape), np.zeros(shape)
    gi = {c: i for i, c in enumerate(configs)}
    si = {x: i for i, x in enumerate(seeds)}
    pi = {p: i for i, p in enumerate(problems)}
    for (c, sd, p), row in grp.iterrows():
        correct[gi[c], si[sd], pi[p]] = row["sum"]
        total[gi[c], si[sd], pi[p]] = row["count"]
    return SampleCube(configs, seeds, problems, correct, total)


def replicate_means(
    cube: SampleCube,
    *,
    B: int = DEFAULT_B,
    seed: int = DEFAULT_SEED,
    levels: Sequence[str] = LEVELS,
    chunk: int = 250,
) -> np.ndarray:
    """(B, G) bootstrap replicates of each configuration's avg@k (fraction, not %)."""
    bad = [lv for lv in levels if lv not in LEVELS]
    if bad:
        raise ValueError(f"levels {bad}: choose from {', '.join(LEVELS)}")
    rng = np.random.default_rng(seed)
    G, S, P = cube.correct.shape
    has = cube.has_run
    prob_ok = cube.total > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = np.where(prob_ok, cube.correct / np.where(prob_ok, cube.total, 1.0), 0.0)
    # configurations with the same set of seeds share the seed draw (paired by seed)
    seed_sets: dict[tuple, list[int]] = {}
    for g in range(G):
        seed_sets.setdefault(tuple(np.flatnonzero(has[g])), []).append(g)
    out = np.empty((B, G))
    for start in range(0, B, chunk):
        b = min(chunk, B - start)
        w = np.zeros((b, G, S))  # seed multiplicities
        for idx, gs in seed_sets.items():
            if not idx:
                continue
            if "seed" in levels:
                draw = rng.multinomial(len(idx), np.full(len(idx), 1.0 / len(idx)), size=b)
            else:
                draw = np.ones((b, len(idx)))
            for g in gs:
                w[:, g, list(idx)] = draw
        if "problem" in levels:
            v = rng.multinomial(P, np.full(P, 1.0 / P), size=b).astype(float)  # (b, P) problem multiplicities
        else:
            v = np.ones((b, P))
        mult = w[:, :, :, None] * v[:, None, None, :] * prob_ok[None]  # (b, G, S, P) copies of each cell
        if "sample" in levels:
            n = (mult * cube.total[None]).astype(np.int64)
            hits = rng.binomial(n, np.broadcast_to(frac[None], n.shape))
            num = hits / np.where(prob_ok, cube.total, 1.0)[None]  # sum over copies of the fraction correct
        else:
            num = mult * frac[None]
        # a run's avg@k over its drawn problems, then the mean over the drawn seeds
        run_num = num.sum(axis=3)
        run_den = mult.sum(axis=3)
        with np.errstate(invalid="ignore", divide="ignore"):
            run_acc = run_num / run_den  # (b, G, S), NaN where the seed was not drawn or has no run
            wsum = np.where(run_den > 0, w, 0.0)
            out[start : start + b] = np.nansum(np.where(run_den > 0, run_acc, 0.0) * wsum, axis=2) / wsum.sum(axis=2)
    return out


@dataclass(frozen=True)
class BootInterval:
    """An estimate with its bootstrap interval; ``se``: sd of the replicates (corrected, see module doc)."""

    estimate: float
    lo: float
    hi: float
    se: float
    n_seeds: int
    df: float
    p: float = float("nan")


def interval(
    estimate: float,
    replicates: np.ndarray,
    n_seeds: int,
    *,
    confidence: float = 0.95,
    kind: str = "t",
    seed_level: bool = True,
    df: float | None = None,
) -> BootInterval:
    """The interval of one statistic from its replicates (see the module docstring)."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: choose one of {', '.join(KINDS)}")
    r = np.asarray(replicates, dtype=float)
    r = r[np.isfinite(r)]
    nan = float("nan")
    if not np.isfinite(estimate) or len(r) < 2:
        return BootInterval(estimate, nan, nan, nan, n_seeds, nan)
    sd = float(r.std(ddof=1))
    if seed_level:
        if n_seeds < 2:
            return BootInterval(estimate, nan, nan, nan, n_seeds, nan)
        se = sd * math.sqrt(n_seeds / (n_seeds - 1))
        dof = float(n_seeds - 1 if df is None else df)
        q = float(stats.t.ppf((1 + confidence) / 2, dof))
    else:
        se, dof = sd, math.inf
        q = float(stats.norm.ppf((1 + confidence) / 2))
    if se > 0:
        z = abs(estimate) / se
        p = float(2 * (stats.t.sf(z, dof) if np.isfinite(dof) else stats.norm.sf(z)))
    else:
        p = nan
    if kind == "percentile":
        a = (1 - confidence) / 2
        lo, hi = (float(x) for x in np.quantile(r, [a, 1 - a]))
        return BootInterval(estimate, lo, hi, se, n_seeds, dof, p)
    return BootInterval(estimate, estimate - q * se, estimate + q * se, se, n_seeds, dof, p)


def config_intervals(
    cube: SampleCube,
    *,
    B: int = DEFAULT_B,
    seed: int = DEFAULT_SEED,
    levels: Sequence[str] = LEVELS,
    confidence: float = 0.95,
    kind: str = "t",
    baseline: str | None = None,
) -> pd.DataFrame:
    """Per configuration: avg@k (%) with its bootstrap interval, and the difference to ``baseline`` (pp).

    Columns ``acc, acc_lo, acc_hi, acc_se, n`` and, with a baseline, ``d_acc, d_acc_lo, d_acc_hi,
    d_acc_se, d_acc_p, d_test`` ("paired bootstrap" when the seed sets match, else "unpaired
    bootstrap"; the unpaired df are Welch-Satterthwaite's over the two seed-level variances).
    """
    reps = replicate_means(cube, B=B, seed=seed, levels=levels) * 100
    est = cube.means() * 100
    n = cube.has_run.sum(axis=1)
    seed_level = "seed" in levels
    rows = []
    for g, c in enumerate(cube.configs):
        iv = interval(est[g], reps[:, g], int(n[g]), confidence=confidence, kind=kind, seed_level=seed_level)
        row = {"config": c, "acc": iv.estimate, "acc_lo": iv.lo, "acc_hi": iv.hi, "acc_se": iv.se, "n": int(n[g])}
        if baseline is not None and baseline in cube.configs and c != baseline:
            b = cube.configs.index(baseline)
            paired = bool(np.array_equal(cube.has_run[g], cube.has_run[b]))
            d = reps[:, g] - reps[:, b]
            if paired:
                div = interval(est[g] - est[b], d, int(n[g]), confidence=confidence, kind=kind, seed_level=seed_level)
            else:
                div = _unpaired(est[g] - est[b], reps[:, g], reps[:, b], int(n[g]), int(n[b]), d, confidence, kind,
                                seed_level)
            row.update({"d_acc": div.estimate, "d_acc_lo": div.lo, "d_acc_hi": div.hi, "d_acc_se": div.se,
                        "d_acc_p": div.p, "d_test": "paired bootstrap" if paired else "unpaired bootstrap"})
        rows.append(row)
    out = pd.DataFrame(rows).set_index("config")
    out.attrs.update({"B": B, "seed": seed, "levels": tuple(levels), "kind": kind, "confidence": confidence,
                      "problems": len(cube.problems)})
    return out


def _unpaired(est, ra, rb, na, nb, d, confidence, kind, seed_level) -> BootInterval:
    """Difference of configurations with different seeds: variances add, Welch-Satterthwaite df."""
    if not seed_level:
        return interval(est, d, min(na, nb), confidence=confidence, kind=kind, seed_level=False)
    nan = float("nan")
    if na < 2 or nb < 2:
        return BootInterval(est, nan, nan, nan, min(na, nb), nan)
    va = np.nanvar(ra, ddof=1) * na / (na - 1)
    vb = np.nanvar(rb, ddof=1) * nb / (nb - 1)
    df = (va + vb) ** 2 / (va**2 / (na - 1) + vb**2 / (nb - 1)) if va + vb > 0 else nan
    iv = interval(est, d, min(na, nb), confidence=confidence, kind=kind, seed_level=True, df=df)
    se = math.sqrt(va + vb)
    q = float(stats.t.ppf((1 + confidence) / 2, df)) if np.isfinite(df) else nan
    p = float(2 * stats.t.sf(abs(est) / se, df)) if se > 0 and np.isfinite(df) else nan
    if kind == "percentile":
        return BootInterval(est, iv.lo, iv.hi, se, iv.n_seeds, df, p)
    return BootInterval(est, est - q * se, est + q * se, se, iv.n_seeds, df, p)


def crossed_components(values: np.ndarray) -> dict[str, float]:
    """Method-of-moments (two-way ANOVA) split of the variance of the mean of a seeds x problems table.

    ``values[s, p]``: a run's (or a contrast's) per-problem accuracy, already averaged over its
    samples. With seeds and problems crossed, ``Var(mean) = s2_seed / S + s2_problem / P +
    s2_residual / (S P)``, estimated without bias by ``(MS_seed + MS_problem - MS_res) / (S P)``;
    the problem part is ``(MS_problem - MS_res) / (S P)`` (0 when negative). Unlike the bootstrap
    with and without resampling problems, this does not count each problem's seed and sample noise
    a second time. Needs S >= 2 and P >= 2.
    """
    v = np.asarray(values, dtype=float)
    S, P = v.shape
    nan = float("nan")
    if S < 2 or P < 2 or not np.isfinite(v).all():
        return {"var_mean": nan, "problem_part": nan, "seed_part": nan, "residual_part": nan}
    g = v.mean()
    ms_s = P * ((v.mean(axis=1) - g) ** 2).sum() / (S - 1)
    ms_p = S * ((v.mean(axis=0) - g) ** 2).sum() / (P - 1)
    res = v - v.mean(axis=1, keepdims=True) - v.mean(axis=0, keepdims=True) + g
    ms_r = (res**2).sum() / ((S - 1) * (P - 1))
    return {
        "var_mean": max(ms_s + ms_p - ms_r, 0.0) / (S * P),
        "problem_part": max(ms_p - ms_r, 0.0) / (S * P),
        "seed_part": max(ms_s - ms_r, 0.0) / (S * P),
        "residual_part": ms_r / (S * P),
    }


def per_problem(cube: SampleCube) -> np.ndarray:
    """(G, S, P) fraction correct of each run on each problem (NaN where missing)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(cube.total > 0, cube.correct / np.where(cube.total > 0, cube.total, 1.0), np.nan)


def problem_share(
    cube: SampleCube,
    *,
    baseline: str | None = None,
    B: int = DEFAULT_B,
    seed: int = DEFAULT_SEED,
    contrasts: dict[str, np.ndarray] | None = None,
) -> pd.DataFrame:
    """How much of the uncertainty comes from the problem sample, two ways.

    One row per configuration (its avg@k), per difference to ``baseline`` and per named contrast
    (``contrasts``: name -> weights over the configurations, e.g. an effect), in pp:

    - ``se_all`` / ``se_no_problems``: the bootstrap se resampling seeds, problems and samples, and
      without resampling problems; ``boot_problem_share = 1 - se_no_problems^2 / se_all^2``. An
      upper bound: resampling problems also re-weights each problem's seed and sample noise,
      which the seed level already holds;
    - ``anova_problem_share``: the problem part of :func:`crossed_components` over its total, on the
      seeds x problems table of per-problem accuracies (configurations with the same seeds only).
    """
    with_p = config_intervals(cube, B=B, seed=seed, levels=LEVELS, baseline=baseline)
    without = config_intervals(cube, B=B, seed=seed, levels=("seed", "sample"), baseline=baseline)
    acc = per_problem(cube) * 100
    G = len(cube.configs)
    weights: list[tuple[str, np.ndarray, float, float]] = []
    for g, c in enumerate(cube.configs):
        weights.append((f"{c}: avg@k", np.eye(G)[g], with_p.loc[c, "acc_se"], without.loc[c, "acc_se"]))
        if "d_acc_se" in with_p and np.isfinite(with_p.loc[c].get("d_acc_se", np.nan)):
            w = np.eye(G)[g] - np.eye(G)[cube.configs.index(baseline)]
            weights.append((f"{c} - {baseline}", w, with_p.loc[c, "d_acc_se"], without.loc[c, "d_acc_se"]))
    if contrasts:
        reps_all = replicate_means(cube, B=B, seed=seed, levels=LEVELS) * 100
        reps_np = replicate_means(cube, B=B, seed=seed, levels=("seed", "sample")) * 100
        n = int(cube.has_run.sum(axis=1).min())
        corr = math.sqrt(n / (n - 1)) if n > 1 else float("nan")
        for name, w in contrasts.items():
            weights.append((name, np.asarray(w, float), float((reps_all @ w).std(ddof=1)) * corr,
                            float((reps_np @ w).std(ddof=1)) * corr))
    rows = []
    for name, w, se_all, se_np in weights:
        used = np.flatnonzero(w)
        same_seeds = all(np.array_equal(cube.has_run[used[0]], cube.has_run[u]) for u in used)
        comp = {"problem_part": np.nan, "var_mean": np.nan}
        if same_seeds:
            cols = np.flatnonzero(cube.has_run[used[0]])
            table = np.tensordot(w[used], acc[used][:, cols, :], axes=1)  # (S, P) contrast per seed and problem
            comp = crossed_components(table)
        rows.append({"quantity": name, "n": int(cube.has_run[used].sum(axis=1).min()), "se_all": se_all,
                     "se_no_problems": se_np, "boot_problem_share": 1 - se_np**2 / se_all**2 if se_all else np.nan,
                     "anova_se": math.sqrt(comp["var_mean"]) if np.isfinite(comp["var_mean"]) else np.nan,
                     "anova_problem_share": comp["problem_part"] / comp["var_mean"] if comp["var_mean"] else np.nan})
    return pd.DataFrame(rows)
