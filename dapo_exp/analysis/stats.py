"""Confidence intervals for means over seeds and for differences between configurations.

All intervals are Student-t intervals (``scipy.stats.t``):

- mean of n values: ``mean ± t_{(1+c)/2, n-1} * s / sqrt(n)`` (s: sample sd, ddof=1);
- paired difference (same seeds): the same interval on the per-seed differences;
- unpaired difference: Welch's t, ``se = sqrt(s_a^2/n_a + s_b^2/n_b)`` with the
  Welch–Satterthwaite degrees of freedom.

With n = 1 (or n_a or n_b = 1 for Welch) the interval is undefined: the bounds are
NaN (shown as "n/a"), never a zero-width interval. The same holds for a difference whose
per-seed values are identical (zero variance): two or three seeds that happen to agree say
nothing about the spread, so the bounds are NaN and ``note`` says "identical per seed".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

PAIRED = "paired t"
WELCH = "Welch t"
IDENTICAL_PAIRED = "identical per seed"
IDENTICAL = "identical values"


@dataclass(frozen=True)
class Interval:
    """A mean (or difference of means) with its confidence bounds and sample size."""

    mean: float
    lo: float
    hi: float
    n: int
    test: str = ""
    p: float = float("nan")
    # why the bounds are undefined although n >= 2 ("identical per seed", "identical values")
    note: str = ""

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2.0


_NAN = float("nan")


def t_interval(values, confidence: float = 0.95) -> Interval:
    """Mean of ``values`` (NaNs dropped) with its Student-t interval; bounds NaN when n < 2."""
    x = pd.Series(values, dtype=float).dropna().to_numpy()
    n = len(x)
    if n == 0:
        return Interval(_NAN, _NAN, _NAN, 0)
    m = float(x.mean())
    if n == 1:
        return Interval(m, _NAN, _NAN, 1)
    h = float(stats.t.ppf((1 + confidence) / 2, n - 1) * x.std(ddof=1) / math.sqrt(n))
    return Interval(m, m - h, m + h, n)


def _p_value(tstat: float, df: float) -> float:
    if not np.isfinite(tstat) or not np.isfinite(df) or df <= 0:
        return _NAN
    return float(2 * stats.t.sf(abs(tstat), df))


def paired_difference(a: pd.Series, b: pd.Series, confidence: float = 0.95) -> Interval:
    """``a - b`` paired by index (seed): the t interval of the per-seed differences."""
    d = (a - b.reindex(a.index)).dropna().to_numpy(dtype=float)
    n = len(d)
    if n == 0:
        return Interval(_NAN, _NAN, _NAN, 0, PAIRED)
    m = float(d.mean())
    if n == 1:
        return Interval(m, _NAN, _NAN, 1, PAIRED)
    se = d.std(ddof=1) / math.sqrt(n)
    if se == 0:
        return Interval(m, _NAN, _NAN, n, PAIRED, _NAN, IDENTICAL_PAIRED)
    h = float(stats.t.ppf((1 + confidence) / 2, n - 1) * se)
    p = _p_value(m / se, n - 1) if se > 0 else _NAN
    return Interval(m, m - h, m + h, n, PAIRED, p)


def welch_difference(a, b, confidence: float = 0.95) -> Interval:
    """``mean(a) - mean(b)`` for independent samples, Welch's t interval; ``n`` is n_a + n_b."""
    x = pd.Series(a, dtype=float).dropna().to_numpy()
    y = pd.Series(b, dtype=float).dropna().to_numpy()
    na, nb = len(x), len(y)
    if na == 0 or nb == 0:
        return Interval(_NAN, _NAN, _NAN, na + nb, WELCH)
    m = float(x.mean() - y.mean())
    if na < 2 or nb < 2:
        return Interval(m, _NAN, _NAN, na + nb, WELCH)
    va, vb = x.var(ddof=1) / na, y.var(ddof=1) / nb
    se = math.sqrt(va + vb)
    if se == 0:
        return Interval(m, _NAN, _NAN, na + nb, WELCH, _NAN, IDENTICAL)
    df = (va + vb) ** 2 / (va**2 / (na - 1) + vb**2 / (nb - 1))
    h = float(stats.t.ppf((1 + confidence) / 2, df) * se)
    return Interval(m, m - h, m + h, na + nb, WELCH, _p_value(m / se, df))


def difference(a: pd.Series, b: pd.Series, confidence: float = 0.95) -> Interval:
    """``a - b`` where both are indexed by seed: paired when the seeds match, Welch's t otherwise.

    The seeds match when both series (NaNs dropped) have the same set of unique seeds.
    """
    a, b = a.dropna(), b.dropna()
    same = a.index.is_unique and b.index.is_unique and set(a.index) == set(b.index) and len(a) > 0
    if same:
        return paired_difference(a, b, confidence)
    return welch_difference(a, b, confidence)
