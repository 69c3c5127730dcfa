"""Anytime-valid intervals for a paired difference, and the rule a sequential sweep stops by.

A fixed-sample t interval is valid only when the number of seeds was fixed in advance: checking it after
every seed and stopping when it excludes zero (what everyone does with a table in front of them) raises
the false-positive rate far above its nominal level (``python -m dapo_exp.benchmarks.sequential`` prints
by how much). A **confidence sequence** is a sequence of intervals that covers the true difference at
every number of seeds at once with probability ``1 - alpha``; stopping whenever one likes keeps the
coverage, and so the error rates of the decisions read from it.

The one used here is the scale-invariant normal-mixture sequential t-test (Lai 1976; Lindon, Ham, Tingley
and Bojinov, "Anytime-valid linear models and regression adjusted causal inference in randomized
experiments", 2024, the closed form below). For paired differences ``d_1..d_n`` (one per seed, the
configuration minus the other on the endpoint) with mean ``m``, sample sd ``s``, ``t = (m - mu) / (s /
sqrt(n))`` and ``nu = n - 1``, the Bayes factor of "mean ``mu`` + effect ``delta * sigma``, ``delta ~
N(0, 1/phi)``" against "mean ``mu``", with the right-Haar prior ``1/sigma`` on the unknown scale, is::

    BF_n(mu) = sqrt(r) * ((1 + t^2/nu) / (1 + r t^2/nu)) ** (n/2),   r = phi / (phi + n)

It is the likelihood ratio of the scale-invariant statistic, a nonnegative martingale under the null
whatever ``sigma`` is, so by Ville's inequality ``P(exists n: BF_n(mu_true) >= 1/alpha) <= alpha``. The
confidence sequence is ``{mu: BF_n(mu) < 1/alpha}``, which solves in closed form to
``m +- s/sqrt(n) * sqrt(nu (1 - c) / (c - r))`` with ``c = (r alpha^2)^(1/n)`` (unbounded while ``c <= r``:
with ``phi = 0.1`` and ``alpha = 0.05`` the first finite interval is at 3 seeds). It assumes the per-seed
differences are Gaussian; the benchmark also checks it on differences resampled from committed runs.

Why not a package: the closed form is the one ``savvi``'s ``LinearRegression`` implements, but savvi needs
Python >= 3.11 and numpy >= 2.1 (this project supports 3.10 and numpy 1.26), pulls in cvxpy for code not used
here, and its intercept-only design counts one degree of freedom too few for a one-sample test; ``confseq``
ships as C++ sources (Boost) and its normal-mixture boundaries need a known variance; ``expectation`` is
yanked. ``tests/test_sequential.py`` checks the closed form against the Bayes factor integrated numerically.

``phi`` (the prior precision of the standardized effect) only trades early stopping on large effects
against small ones; any fixed value keeps the guarantee. ``DEFAULT_PHI = 0.1`` (prior sd of the effect about
3 seed sd) was chosen on the simulated toy (paired sd 2.19 pp; 3 seeds, then one per round up to 20; margin
5 pp; ``python -m dapo_exp.benchmarks.sequential --phi-grid``): of 0.05, 0.1, 0.25, 0.5 and 1 it is the one
value within 0.3 seed of the fewest expected seeds at each of the true effects 0, 2.5, 5 and 10 points
(6.17, 8.46, 5.50 and 3.84 seeds; the fewest are 6.17 at 0.1 and 0.25, 8.19 at 0.25, 5.50 at 0.1 and 3.71
at 0.05): a smaller phi stops sooner on large effects, a larger one on small effects. Several comparisons
share ``alpha`` (Bonferroni: each gets ``alpha / k``), so the chance that any of them errs stays at most
``alpha``.

A comparison is **different** when its interval excludes 0, **equivalent** when it lies inside
``+-margin``, else **undecided** (and stays so once its seed budget is spent). Both decisions err only when
the interval misses the true difference, so each error rate is at most ``alpha`` under any stopping rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

DEFAULT_ALPHA = 0.05
DEFAULT_PHI = 0.1
DEFAULT_FIRST, DEFAULT_BUDGET = 3, 20  # a sequential sweep's first round and its most seeds per comparison
DIFFERENT, EQUIVALENT, UNDECIDED = "different", "equivalent", "undecided"
LABEL = "anytime-valid"  # how tables and figures name these intervals


def multiplier(n, alpha: float = DEFAULT_ALPHA, phi: float = DEFAULT_PHI) -> np.ndarray:
    """The half-width of the confidence sequence at ``n`` seeds in standard errors ``s / sqrt(n)``
    (``inf`` where it is unbounded: ``n < 2`` or too few seeds for ``alpha`` and ``phi``)."""
    if not 0 < alpha < 1 or phi <= 0:
        raise ValueError(f"alpha must be in (0, 1) and phi > 0, got alpha={alpha}, phi={phi}")
    n = np.asarray(n, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        r = phi / (phi + n)
        c = (r * alpha**2) ** (1.0 / n)
        m = np.sqrt((n - 1) * (1 - c) / (c - r))
    return np.where((n >= 2) & (c > r), m, np.inf)


def regression_multiplier(nu, z2, alpha: float = DEFAULT_ALPHA, phi: float = DEFAULT_PHI) -> np.ndarray:
    """The same confidence sequence for one coefficient of a linear model (Lindon et al. 2024), in standard
    errors of that coefficient: ``nu`` residual degrees of freedom, ``z2 = (sigma_hat / se)^2``. One mean is
    the case ``nu = n - 1``, ``z2 = n`` (:func:`multiplier`); the effects of a two-level design use it."""
    if not 0 < alpha < 1 or phi <= 0:
        raise ValueError(f"alpha must be in (0, 1) and phi > 0, got alpha={alpha}, phi={phi}")
    nu, z2 = np.asarray(nu, dtype=float), np.asarray(z2, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        r = phi / (phi + z2)
        c = (r * alpha**2) ** (1.0 / (nu + 1))
        m = np.sqrt(nu * (1 - c) / (c - r))
    return np.where((nu >= 1) & (c > r), m, np.inf)


def log_bayes_factor(d, mu: float = 0.0, phi: float = DEFAULT_PHI) -> float:
    """``log BF_n(mu)`` of the module docstring for the differences ``d`` (at least 2)."""
    d = np.asarray(d, dtype=float)
    n = len(d)
    if n < 2:
        raise ValueError("the Bayes factor needs at least 2 differences")
    nu = n - 1
    t2 = n * (d.mean() - mu) ** 2 / d.var(ddof=1)
    r = phi / (phi + n)
    return 0.5 * np.log(r) + 0.5 * n * (np.log1p(t2 / nu) - np.log1p(r * t2 / nu))


def sequence(d, alpha: float = DEFAULT_ALPHA, phi: float = DEFAULT_PHI) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The confidence sequence along the last axis of ``d`` (differences in seed order): the mean and the
    bounds after 1, 2, ..., N differences (bounds infinite where the interval is unbounded)."""
    d = np.asarray(d, dtype=float)
    n = np.arange(1, d.shape[-1] + 1)
    mean = np.cumsum(d, axis=-1) / n
    with np.errstate(divide="ignore", invalid="ignore"):
        var = (np.cumsum(d * d, axis=-1) - n * mean**2) / (n - 1)
        half = multiplier(n, alpha, phi) * np.sqrt(np.maximum(var, 0.0) / n)
    half = np.where(np.isfinite(half), half, np.inf)
    return mean, mean - half, mean + half


@dataclass(frozen=True)
class Interval:
    """A comparison's anytime-valid interval after ``n`` paired seeds, and its state."""

    n: int
    mean: float
    lo: float
    hi: float
    alpha: float  # this comparison's error rate (the sweep's alpha / comparisons)
    state: str


def state(lo: float, hi: float, margin: float | None) -> str:
    """``different`` (the interval excludes 0), ``equivalent`` (inside +-margin) or ``undecided``."""
    if lo > 0 or hi < 0:
        return DIFFERENT
    if margin is not None and -margin < lo and hi < margin:
        return EQUIVALENT
    return UNDECIDED


def interval(d, *, alpha: float = DEFAULT_ALPHA, phi: float = DEFAULT_PHI, margin: float | None = None) -> Interval:
    """The interval after all of ``d`` (paired differences, one per seed) and its state."""
    d = np.asarray(d, dtype=float)
    if not len(d):
        return Interval(0, float("nan"), -np.inf, np.inf, alpha, UNDECIDED)
    mean, lo, hi = (float(x[-1]) for x in sequence(d, alpha, phi))
    return Interval(len(d), mean, lo, hi, alpha, state(lo, hi, margin))


@dataclass(frozen=True)
class Stops:
    """Where each of a batch of sequential sweeps stopped: the seeds it had then (``n``), its state and
    its interval there (arrays of one entry per sweep)."""

    n: np.ndarray
    state: np.ndarray
    mean: np.ndarray
    lo: np.ndarray
    hi: np.ndarray


def stops(d, *, first: int = DEFAULT_FIRST, alpha: float = DEFAULT_ALPHA, phi: float = DEFAULT_PHI,
          margin: float | None = None) -> Stops:
    """The sweeper's stopping rule run on each row of ``d`` (sweeps x budget paired differences, in seed
    order): ``first`` seeds, then one per round; after each round the interval of :func:`sequence`, and a
    stop when :func:`state` is different or equivalent, else at the budget (the row's length, undecided).
    Vectorised over the rows, so that a simulation runs every sweep at once."""
    d = np.atleast_2d(np.asarray(d, dtype=float))
    budget = d.shape[-1]
    if not 1 <= first <= budget:
        raise ValueError(f"first {first}: must lie in 1..{budget} (the budget)")
    mean, lo, hi = sequence(d, alpha, phi)
    different = (lo > 0) | (hi < 0)
    equivalent = ~different & ((-margin < lo) & (hi < margin) if margin is not None else False)
    decided = different | equivalent
    decided[..., : first - 1] = False
    k = np.where(decided.any(axis=-1), decided.argmax(axis=-1), budget - 1)[..., None]

    def at(x: np.ndarray) -> np.ndarray:
        return np.take_along_axis(x, k, axis=-1)[..., 0]

    st = np.where(at(different), DIFFERENT, np.where(at(equivalent), EQUIVALENT, UNDECIDED))
    return Stops(k[..., 0] + 1, st, at(mean), at(lo), at(hi))


def simulate(effect: float, sd: float, *, sims: int = 4000, budget: int = DEFAULT_BUDGET,
             first: int = DEFAULT_FIRST, alpha: float = DEFAULT_ALPHA, phi: float = DEFAULT_PHI,
             margin: float | None = None, seed: int = 0) -> Stops:
    """:func:`stops` on ``sims`` sweeps of Gaussian paired differences (mean ``effect``, sd ``sd``), drawn
    from ``numpy.random.default_rng(seed)`` (the same ``seed`` gives the same sweeps)."""
    z = np.random.default_rng(seed).standard_normal((sims, budget))
    return stops(effect + sd * z, first=first, alpha=alpha, phi=phi, margin=margin)


RECORD = "sequential.json"  # a sequential sweep's record, in its sweep directory (dapo_exp.analysis.sequential_sweep)


def record_of(sweep_dir) -> dict | None:
    """The sequential record of a sweep directory (its rule and rounds), or None (a fixed sweep)."""
    import json
    from pathlib import Path

    path = Path(sweep_dir) / RECORD
    return json.loads(path.read_text()) if path.is_file() else None


def comparisons_in(record: dict[str, Any]) -> int:
    """How many comparisons shared the sweep's alpha (its last round's)."""
    rounds = record.get("rounds") or []
    return max(1, len(rounds[-1]["comparisons"])) if rounds else 1


def anytime(a, b, record: dict[str, Any]) -> Interval:
    """``a - b`` (per-seed values in pp, indexed by seed) as the sequential sweep of ``record`` judged it: the
    anytime-valid interval of the paired differences at the rule's ``alpha / comparisons`` and its state."""
    rule = record.get("rule") or {}
    common = sorted(set(a.dropna().index) & set(b.dropna().index))
    d = (a.loc[common] - b.loc[common]).to_numpy(dtype=float)
    alpha = float(rule.get("alpha", DEFAULT_ALPHA)) / comparisons_in(record)
    return interval(d, alpha=alpha, phi=float(rule.get("phi", DEFAULT_PHI)), margin=rule.get("margin"))


def caption(record: dict[str, Any]) -> str:
    """The sentence a table or contrasts caption adds for a sequential sweep."""
    rule, k = record.get("rule") or {}, comparisons_in(record)
    alpha = float(rule.get("alpha", DEFAULT_ALPHA))
    return (f"Sequential sweep (hydra/sweeper=sequential, {len(record.get('rounds') or [])} round(s)): the Δ intervals "
            f"are {LABEL} ({1 - alpha / k:.1%} each: alpha {alpha:g} over {k} comparison(s); normal-mixture "
            f"sequential t, phi {rule.get('phi', DEFAULT_PHI):g}), valid although the sweep chose when to stop; "
            f"the verdict reads them (equivalent: inside ±{rule.get('margin', 5.0):g} pp); the MDE and the TOST, "
            "fixed-sample quantities, are not given.")
