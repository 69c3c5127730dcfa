"""Anytime-valid intervals (dapo_exp.analysis.sequential) and their benchmark
(python -m dapo_exp.benchmarks.sequential): the closed form against the Bayes factor integrated
numerically, the multiplier's shape, the states, the vectorised stopping rule against the scalar one, and
the error rates the benchmark reports (sequential at most alpha, naive peeking far above)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import integrate, stats

from dapo_exp.analysis import sequential as S
from dapo_exp.benchmarks import sequential as B

# --------------------------------------------------------------------------------------------------------------
# (a) the closed form against the Bayes factor integrated numerically
# --------------------------------------------------------------------------------------------------------------


def _log_bf_integrated(d: np.ndarray, mu0: float, phi: float) -> float:
    """log of m1 / m0, each marginal likelihood integrated numerically: the Gaussian likelihood of ``d``
    with the right-Haar prior 1/sigma on sigma under both hypotheses; the mean is ``mu0`` under H0 and
    mu | sigma ~ N(mu0, sigma^2 / phi) under H1. sigma = exp(u), so that (1/sigma) dsigma = du; the outer
    integral over u by ``quad``, the inner one over mu by Simpson's rule on 4001 points spanning +-15
    widths of the likelihood-times-prior bump (its centre (n mean + phi mu0) / (n + phi), width
    sigma / sqrt(n + phi): only where the grid sits, the integrand is the plain product)."""
    d = np.asarray(d, dtype=float)
    n = len(d)
    sigma0 = math.sqrt(np.mean((d - mu0) ** 2))  # the scale that fits H0 best
    spread = math.sqrt(np.mean((d - d.mean()) ** 2))  # and H1, where mu can sit at the mean
    offset = -n * math.log(sigma0) - n / 2  # H0's peak log-likelihood, so that exp() stays finite
    x = np.linspace(-15.0, 15.0, 4001)

    def loglik(mu, u: float):
        mu = np.asarray(mu, dtype=float)[..., None]
        return -n * u - np.sum((d - mu) ** 2, axis=-1) / (2 * math.exp(2 * u)) - offset

    def h1_given_u(u: float) -> float:
        sigma = math.exp(u)
        mu = (n * d.mean() + phi * mu0) / (n + phi) + sigma / math.sqrt(n + phi) * x
        f = np.exp(loglik(mu, u)) * stats.norm.pdf(mu, mu0, sigma / math.sqrt(phi))
        return float(integrate.simpson(f, x=mu))

    u_lo, u_hi = math.log(min(sigma0, spread)) - 6, math.log(max(sigma0, spread)) + 80 / (n - 1)
    kw = {"limit": 400, "epsabs": 0, "epsrel": 1e-11}
    m0 = integrate.quad(lambda u: math.exp(loglik(mu0, u)), u_lo, u_hi, **kw)[0]
    m1 = integrate.quad(h1_given_u, u_lo, u_hi, **kw)[0]
    return math.log(m1 / m0)


DATASETS = [  # (differences, alpha, phi)
    (np.array([1.2, -0.4, 2.9]), 0.05, 0.1),  # 3 seeds: the first finite interval at the defaults
    (np.random.default_rng(1).normal(2.0, 3.0, 6), 0.05, 0.1),
    (np.random.default_rng(2).normal(-1.0, 2.0, 10), 0.01, 0.5),
    (np.random.default_rng(3).normal(0.5, 1.0, 4), 0.1, 1.0),
]


@pytest.mark.parametrize("d, alpha, phi", DATASETS)
def test_the_bounds_are_where_the_integrated_bayes_factor_is_one_over_alpha(d, alpha, phi):
    iv = S.interval(d, alpha=alpha, phi=phi)
    assert np.isfinite(iv.lo) and np.isfinite(iv.hi) and iv.lo < iv.mean < iv.hi
    _, lo, hi = S.sequence(d, alpha, phi)
    assert (lo[-1], hi[-1]) == (iv.lo, iv.hi)
    target = math.log(1 / alpha)
    for bound in (iv.lo, iv.hi):
        assert _log_bf_integrated(d, bound, phi) == pytest.approx(target, rel=1e-6)
    eps = 0.01 * (iv.hi - iv.lo)
    assert _log_bf_integrated(d, iv.lo + eps, phi) < target < _log_bf_integrated(d, iv.lo - eps, phi)
    assert _log_bf_integrated(d, iv.hi - eps, phi) < target < _log_bf_integrated(d, iv.hi + eps, phi)


@pytest.mark.parametrize("d, alpha, phi", DATASETS)
def test_log_bayes_factor_is_the_integral(d, alpha, phi):
    iv = S.interval(d, alpha=alpha, phi=phi)
    for mu in (iv.mean, iv.lo, iv.hi, iv.mean + 2 * (iv.hi - iv.mean), 0.0):
        assert S.log_bayes_factor(d, mu, phi) == pytest.approx(_log_bf_integrated(d, mu, phi), rel=1e-6, abs=1e-9)


def test_an_unbounded_interval_is_one_whose_bayes_factor_never_reaches_one_over_alpha():
    d = np.array([0.3, 1.1])  # 2 seeds at the defaults: the Bayes factor stays below 1/alpha for every mu
    assert S.interval(d).lo == -np.inf and S.interval(d).hi == np.inf
    far = d.mean() + 1e4 * d.std(ddof=1)
    assert _log_bf_integrated(d, far, S.DEFAULT_PHI) < math.log(1 / S.DEFAULT_ALPHA)


# --------------------------------------------------------------------------------------------------------------
# (b) the multiplier, (c) the states
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha, phi", [(0.05, 0.1), (0.05, 1.0), (0.01, 0.1), (0.2, 0.05), (0.05 / 6, 0.25)])
def test_multiplier_is_infinite_below_its_first_finite_n_and_decreasing_after(alpha, phi):
    n = np.arange(1, 501)
    m = S.multiplier(n, alpha, phi)
    n0 = int(n[np.isfinite(m)][0])
    # the first n whose Bayes factor can reach 1/alpha at all: sup_mu BF_n = r^(-(n-1)/2), r = phi / (phi + n)
    r = phi / (phi + n)
    assert n0 == int(n[(n >= 2) & (-(n - 1) / 2 * np.log(r) > np.log(1 / alpha))][0])
    assert np.all(np.isinf(m[: n0 - 1])) and np.all(np.isfinite(m[n0 - 1:]))
    # decreasing over every seed budget a sweep uses (through 30 seeds); its minimum comes at a few tens of
    # seeds (63 at the defaults), after which it grows again, slowly, as sqrt(log n): holding at every n
    # costs width that a fixed interval does not pay
    assert np.all(np.diff(m[n0 - 1: 30]) < 0)
    assert m[-1] > m[n0 - 1:].min()
    # and it stays above the fixed-sample t quantile (an anytime-valid interval is wider than a fixed one)
    assert np.all(m[n0 - 1:] > stats.t.ppf(1 - alpha / 2, n[n0 - 1:] - 1))


def test_the_first_finite_interval_at_the_defaults_is_at_3_seeds():
    m = S.multiplier(np.arange(1, 5))
    assert np.isinf(m[:2]).all() and np.isfinite(m[2:]).all()
    with pytest.raises(ValueError):
        S.multiplier(3, alpha=1.5)


@pytest.mark.parametrize("lo, hi, margin, expected", [
    (1.0, 3.0, 5.0, S.DIFFERENT), (-3.0, -1.0, 5.0, S.DIFFERENT), (0.5, 3.0, None, S.DIFFERENT),
    (-4.0, 4.0, 5.0, S.EQUIVALENT), (0.0, 3.0, 5.0, S.EQUIVALENT),  # lo = 0 excludes nothing: inside the margin
    (-6.0, 1.0, 5.0, S.UNDECIDED), (-4.0, 4.0, None, S.UNDECIDED), (-5.0, 4.0, 5.0, S.UNDECIDED),  # strict
    (-np.inf, np.inf, 5.0, S.UNDECIDED), (2.0, 9.0, 5.0, S.DIFFERENT),  # different wins over inside/outside
])
def test_state_on_hand_cases(lo, hi, margin, expected):
    assert S.state(lo, hi, margin) == expected


def test_interval_on_nothing_and_its_state():
    empty = S.interval([])
    assert empty.n == 0 and empty.state == S.UNDECIDED and math.isnan(empty.mean)
    tight = S.interval(np.array([0.1, -0.2, 0.05, 0.0, -0.1, 0.15]), margin=5.0)
    assert tight.state == S.EQUIVALENT and -5 < tight.lo < tight.hi < 5


# --------------------------------------------------------------------------------------------------------------
# the vectorised stopping rule is the sweeper's rule run seed by seed
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("first", [3, 6])
def test_stops_is_the_rule_run_seed_by_seed(first):
    rng = np.random.default_rng(7)
    d = rng.normal(rng.choice([0.0, 2.5, 6.0], (300, 1)), 2.19, (300, 12))
    st = S.stops(d, first=first, margin=5.0)
    for i, row in enumerate(d):
        for n in range(first, 13):
            iv = S.interval(row[:n], margin=5.0)
            if iv.state != S.UNDECIDED or n == 12:
                break
        assert (st.n[i], st.state[i]) == (n, iv.state)
        assert (st.lo[i], st.hi[i], st.mean[i]) == pytest.approx((iv.lo, iv.hi, iv.mean))
    assert st.n.min() == first and set(st.state) == {S.DIFFERENT, S.EQUIVALENT, S.UNDECIDED}
    sim = S.simulate(2.0, 2.19, sims=50, budget=8, margin=5.0, seed=3)
    again = S.simulate(2.0, 2.19, sims=50, budget=8, margin=5.0, seed=3)
    assert np.array_equal(sim.n, again.n) and sim.n.min() >= 3 and sim.n.max() <= 8


# --------------------------------------------------------------------------------------------------------------
# (d) the benchmark, (e) sequential against naive peeking
# --------------------------------------------------------------------------------------------------------------


def test_the_benchmark_prints_its_figures_and_keeps_the_false_positive_rate(tmp_path, capsys):
    sims, alpha = 2000, 0.05
    assert B.main(["--sims", str(sims), "--out", str(tmp_path), "--phi-grid"]) == 0
    out = capsys.readouterr().out
    for text in ("sequential, Gaussian:", "naive peeking, Gaussian", "fixed 5-seed t test", "coverage at stop",
                 "E[seeds]", "fixed n (same power)", "sequential, resampled:", "false equivalence at 1.5 x margin",
                 "Acceptance (expected seeds", "## phi", "wall time", "load average"):
        assert text in out, text
    t = pd.read_csv(tmp_path / "sequential.csv")
    pick = lambda data, e, q: t[(t.data == data) & np.isclose(t.effect, e) & (t.quantity == q)].iloc[0]  # noqa: E731
    fpr = pick("gaussian", 0.0, "p_different")
    assert fpr.value <= alpha + 0.01 and fpr.mc_lo <= fpr.value <= fpr.mc_hi
    assert "**PASS** (<= alpha" in out
    assert pick("resampled", 0.0, "p_different").value <= alpha + 0.01
    assert pick("gaussian", 0.0, "naive_peeking_fpr").value > 0.1
    for e in (0.0, 2.5, 5.0, 10.0):
        assert pick("gaussian", e, "coverage").value >= 1 - alpha - 0.01
        assert 3 <= pick("gaussian", e, "expected_seeds").value <= 20
    assert (tmp_path / "sequential.md").read_text() == out
    assert set(pd.read_csv(tmp_path / "sequential_phi.csv").phi) == set(B.PHIS)


def test_naive_peeking_is_far_above_alpha_while_the_sequential_rule_keeps_it():
    alpha, sims = 0.05, 4000
    d = np.random.default_rng(11).normal(0.0, 2.19, (sims, 20))
    naive = B.naive_peeking(d, alpha).mean()
    seq = (S.stops(d, first=3, alpha=alpha, margin=5.0).state == S.DIFFERENT).mean()
    slack = 3 * math.sqrt(alpha * (1 - alpha) / sims)
    assert naive > 0.1 and seq <= alpha + slack, (naive, seq)
    fixed5 = B.naive_peeking(d[:, :5], alpha, 5).mean()  # one look at 5 seeds: the nominal rate
    assert abs(fixed5 - alpha) <= slack


# --------------------------------------------------------------------------------------------------------------
# the benchmark's helpers
# --------------------------------------------------------------------------------------------------------------


def test_the_fixed_designs_against_statsmodels_and_simulation():
    from statsmodels.stats.power import TTestPower

    # significant with the right sign: the one-sided test at alpha / 2 (the two-sided power less its wrong-sign part)
    right = TTestPower().power(2.5 / 2.19, 6, 0.025, alternative="larger")
    assert B.fixed_power(2.5, 2.19, 6, 0.05) == pytest.approx(right, rel=1e-9)
    assert B.fixed_power(2.5, 2.19, 6, 0.05) == pytest.approx(TTestPower().power(2.5 / 2.19, 6, 0.05), abs=1e-4)
    n = B.fixed_n(5.0, 2.19, 0.9, 0.05, 5.0)
    assert B.fixed_power(5.0, 2.19, n, 0.05) >= 0.9 > B.fixed_power(5.0, 2.19, n - 1, 0.05)
    d = np.random.default_rng(5).normal(0.0, 2.19, (100_000, 4))
    m, s, tq = d.mean(1), d.std(1, ddof=1), stats.t.ppf(0.95, 3)
    tost = np.mean((m - tq * s / 2 > -5) & (m + tq * s / 2 < 5))  # the 90% interval inside +-5
    assert B.tost_probability(4, 2.19, 5.0, 0.05) == pytest.approx(tost, abs=0.004)
    assert B.fixed_n(0.0, 2.19, 0.95, 0.05, 5.0) == 5  # TOST's P(equivalent): 0.917 at 4, 0.985 at 5


def test_paired_differences_from_a_runs_csv(tmp_path):
    rows = [{"label": lab, "seed": s, "included": True, "endpoint/eval/acc_avg": v}
            for lab, vals in (("a", (0.10, 0.20, 0.30)), ("b", (0.15, 0.20, 0.40)), ("c", (0.10, 0.30, 0.30)))
            for s, v in enumerate(vals)]
    rows.append({"label": "c", "seed": 3, "included": False, "endpoint/eval/acc_avg": 0.9})
    pd.DataFrame(rows).to_csv(tmp_path / "runs.csv", index=False)
    pool, where = B.paired_differences(tmp_path / "runs.csv")  # b - a, c - b, each centred, in points
    ba, cb = np.array([5.0, 0.0, 10.0]), np.array([-5.0, 10.0, -10.0])
    assert pool == pytest.approx(np.concatenate([ba - ba.mean(), cb - cb.mean()]))
    assert "b - a (3 seeds" in where and "6 differences" in where
    one, _ = B.paired_differences(tmp_path / "runs.csv", "a,c")
    assert len(one) == 3 and one.mean() == pytest.approx(0.0)
    with pytest.raises(ValueError, match="no configuration"):
        B.paired_differences(tmp_path / "runs.csv", "a,z")


def test_quantile_and_its_interval():
    x = np.arange(1, 101)
    q, lo, hi = B.quantile_ci(x, 0.9)
    assert q == 90 and lo < 90 < hi
