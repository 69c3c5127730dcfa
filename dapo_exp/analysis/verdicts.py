"""What a verdict rules out, and what to run when nothing can be concluded.

A confidence interval that contains 0 says "no difference shown", which is not "no difference":
with 3 seeds and a spread of 10 points it rules out almost nothing. Wherever the analysis says
"no difference shown" (the study tables, :mod:`dapo_exp.analysis.studies`, and the comparison
table's difference to the baseline, :mod:`dapo_exp.analysis.table`) it also gives:

- **MDE**, the minimum detectable effect: the true difference that the same test, at the same n
  and the observed spread, would detect with power 0.8 at two-sided alpha 0.05. Paired (the
  seeds match): ``d * sd_diff`` with ``d`` solved by ``statsmodels`` ``TTestPower`` (one-sample t on
  the per-seed differences, ``nobs = n``). Unpaired: ``d * sd_pooled`` with ``TTestIndPower``
  (``nobs1 = n_a``, ``ratio = n_b / n_a``). An MDE larger than the effect that matters means the
  run could not have seen it.
- **Equivalence** by two one-sided tests (TOST, ``statsmodels.stats.weightstats.ttost_paired``;
  ``ttost_ind`` with unequal variances when the seeds do not match) against a margin ``±m``:
  "equivalent within ±m" when the TOST p-value is below alpha (the 90% interval lies inside
  ``(-m, m)``), else "not shown equivalent within ±m".

  **The margin.** For accuracy metrics (the table's final accuracy, a study's held-out accuracy:
  any metric shown in percent) it is :data:`DEFAULT_MARGIN` = 5 percentage points unless the user
  gives another (``--margin``). Other metrics are in their own units (shares 0-1, tokens, nats), so
  no margin fits them all: a study metric's margin is given per metric (``--margin-for
  <metric>=<m>``, in that metric's unit); without one the verdict says "no margin".
- **r**: the Pearson correlation of the two arms' per-seed values (paired only, n >= 3). It is what
  pairing buys: ``var(a - b) = var(a) + var(b) - 2 r sd_a sd_b``.

:func:`one_seed_line` and :func:`rerun_command` write the first line of a table whose every
configuration has one seed: nothing can be concluded, and the command that adds the seeds
``plan`` recommends.

**Seed advice** comes from one function, :func:`seed_advice`: the toy's paired spread measured for a
regime and an endpoint, and the seeds it takes to detect a difference. The launch line, a one-seed
table's first line and ``plan`` without a measured spread all ask it, so they give one number.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from dapo_exp import rundir
from dapo_exp.console import shell_word

ALPHA = 0.05
POWER = 0.8
DEFAULT_MARGIN = 5.0  # percentage points, for accuracy metrics (shown in percent)

# sd of per-seed differences (table unit) used when the pilot measured none and no toy measurement fits (the
# endpoint's accuracy has one: :func:`seed_advice`): (sd, where it comes from)
_FRACTIONAL = "measured on the 2026-11-22 fractional sweep, 15 df, sweeps/results/2026-11-22-fractional/plan.txt"
DEFAULT_PAIRED_SD: dict[str, tuple[float, str]] = {
    "best_acc": (4.27, _FRACTIONAL),
}
DEFAULT_PAIRED_DF = 15

# The toy's paired standard deviation of held-out accuracy between two arms of one seed, in points, as the
# verdict_cost benchmark measured it (docs: results), per (regime, endpoint): the larger of the two fixes
# measured. Pooled over seeds 12-35 in two blocks on the 2-core machine (2026-11-24/25,
# sweeps/results/2026-11-25-verdict-cost-batch/pooled). The default regime (64 prompts per step, a 256 x 8 final
# evaluation), final accuracy: Clip-Higher 2.34 [1.68, 2.83], Token-level Loss 2.96 [2.05, 3.83]. The fast
# regime (experiment=toy_fast: 16 prompts, 64 x 4 evaluations): final, Clip-Higher 5.67 [3.69, 7.16], Token-level
# Loss 7.82 [5.19, 10.10]; last_k_mean with k = 3 (steps 10, 20, 30) 3.46 [2.38, 4.32] and 4.06 [2.78, 5.05].
TOY_PAIRED_SD: dict[tuple[str, str], float] = {("default", "final"): 2.96, ("fast", "final"): 7.8,
                                               ("fast", "last_k_mean"): 4.1}
TOY_PAIRED_DF = 23  # 24 seeds' pairs
TOY_KEYS = ("task.name", "model.path")  # the toy's task and model (their schema defaults: arith, tiny)
# the keys that make the toy's measured default regime (their schema defaults): the batch, the held-out set
REGIME_KEYS = ("train.prompts_per_step", "train.mini_batch_size", "rollout.n", "task.arith_n_eval",
               "eval.final_problems", "eval.final_samples")


def toy_setup(value: Callable[[str], Any]) -> bool:
    """Whether the toy's task and model (:data:`TOY_KEYS` at their schema defaults, read with ``value(key)``) are
    the run's: its measured seed advice and run times hold only there (a value not recorded, None, counts as
    the toy's)."""
    from omegaconf import OmegaConf

    from dapo_exp.config import Config

    schema = OmegaConf.structured(Config)
    return all(value(key) in (None, OmegaConf.select(schema, key)) for key in TOY_KEYS)


def toy_regime(value: Callable[[str], Any], experiment: str | None) -> str:
    """``default``: the toy's measured default regime (no experiment preset, whose warm starts differ, and the
    schema's defaults of :data:`REGIME_KEYS`, read with ``value(key)``); ``fast``: ``experiment=toy_fast``;
    ``other`` otherwise, and for another task or model than the toy's (``task.name``, ``model.path``: the tiny
    model on ``task=gsm8k`` is no toy regime; a value that is not recorded, None, does not count against)."""
    from omegaconf import OmegaConf

    from dapo_exp.config import Config

    if not toy_setup(value):
        return "other"
    schema = OmegaConf.structured(Config)
    if experiment in (None, "null"):
        if all(value(key) == OmegaConf.select(schema, key) for key in REGIME_KEYS):
            return "default"
    return "fast" if experiment == "toy_fast" else "other"


@dataclass(frozen=True)
class SeedAdvice:
    """The paired spread (points) seed advice is computed from, and the endpoint it was measured for, as
    the advice names it."""

    sd: float
    what: str
    df: int = TOY_PAIRED_DF

    def seeds(self, delta: float = DEFAULT_MARGIN) -> int:
        """Seeds per arm, paired by seed, that detect ``delta`` points with power 0.8 (at least 2)."""
        return max(seeds_paired(delta, self.sd), 2)

    def detects(self, n_seeds: int) -> float:
        """The difference (points) ``n_seeds`` seeds per arm detect with power 0.8."""
        return mde_paired(self.sd, n_seeds)


def seed_advice(regime: str, endpoint: str = "final", k: int = 3) -> SeedAdvice:
    """The one source of seed advice: the toy's paired spread for a regime (:func:`toy_regime`) and an
    endpoint (``eval.endpoint``, ``eval.endpoint_k``); a regime or endpoint not measured gets the fast
    regime's spread, and its text says so."""
    fast = "" if regime == "fast" else " (at experiment=toy_fast's spread)"
    if regime == "default" and endpoint == "final":
        return SeedAdvice(TOY_PAIRED_SD["default", "final"], "final accuracy")
    if endpoint == "last_k_mean" and k == 3:
        return SeedAdvice(TOY_PAIRED_SD["fast", "last_k_mean"], f"the mean accuracy of the last 3 evaluations{fast}")
    if endpoint == "last_k_mean":  # measured for k = 3 only: final accuracy's larger spread, said so
        return SeedAdvice(TOY_PAIRED_SD["fast", "final"],
                          f"the mean accuracy of the last {k} evaluations (at experiment=toy_fast's final-accuracy spread)")
    return SeedAdvice(TOY_PAIRED_SD["fast", "final"], f"final accuracy{fast}")


def runs_seed_advice(runs: pd.DataFrame) -> SeedAdvice:
    """:func:`seed_advice` for the regime and endpoint the runs record (their first run's config and
    overrides); runs that record none: another regime's advice."""
    if not len(runs):
        return seed_advice("other")
    row = runs.iloc[0]

    def value(key: str) -> Any:
        v = row.get(f"config.{key}")
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else v

    experiment = next((o.split("=", 1)[1] for o in _read_overrides(row.get("path")) or []
                       if o.split("=", 1)[0].lstrip("+") == "experiment"), None)
    k = value("eval.endpoint_k")
    return seed_advice(toy_regime(value, experiment), value("eval.endpoint") or "final", int(k) if k else 3)

NO_DIFFERENCE = "no difference shown"
DIFFERENCE = "difference shown"


def seeds_unpaired(delta: float, sd: float, power: float = POWER, alpha: float = ALPHA) -> int:
    """Seeds per configuration for a two-sample t test to detect ``delta`` with ``power``."""
    from statsmodels.stats.power import TTestIndPower

    return _solve(TTestIndPower(), delta, sd, power, alpha, ratio=1.0)


def seeds_paired(delta: float, sd_diff: float, power: float = POWER, alpha: float = ALPHA) -> int:
    """Seeds (pairs) for a paired t test (one-sample t on per-seed differences)."""
    from statsmodels.stats.power import TTestPower

    return _solve(TTestPower(), delta, sd_diff, power, alpha)


def _solve(analysis, delta, sd, power, alpha, **kw) -> int:
    if not (np.isfinite(sd) and sd > 0 and delta > 0):
        return -1
    es = delta / sd
    # power at n = 2 (the least that gives an interval) already enough
    nobs = "nobs1" if kw else "nobs"  # TTestIndPower names the group size nobs1
    if _power(analysis, es, alpha, 2, kw) >= power:
        return 2
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("ignore")  # the root finder's convergence warnings: handled below
        n = float(np.squeeze(analysis.solve_power(effect_size=es, alpha=alpha, power=power,
                                                  alternative="two-sided", **{nobs: None}, **kw)))
    ok = lambda k: _power(analysis, es, alpha, k, kw) >= power  # noqa: E731
    if not np.isfinite(n):
        # the root finder gave up (a large effect: the answer is a handful of seeds): count up
        return next((k for k in range(3, 10_000) if ok(k)), -1)
    k = int(math.ceil(n - 1e-9))
    # the root finder can land off the answer for large effects (few df): step to the least n with the power
    while k > 2 and ok(k - 1):
        k -= 1
    while not ok(k) and k < 10_000:
        k += 1
    return k


def _power(analysis, es: float, alpha: float, k: int, kw: dict) -> float:
    """statsmodels' power at ``k`` seeds; where it gives NaN (the lower tail of the noncentral t fails
    for a large noncentrality at few df) the upper tail alone, which is then all of it."""
    nobs = "nobs1" if kw else "nobs"
    with warnings.catch_warnings(record=True):
        p = float(np.squeeze(analysis.power(effect_size=es, alpha=alpha, **{nobs: k}, **kw)))
    if np.isfinite(p):
        return p
    if kw:  # two samples, k and ratio * k
        k2 = kw.get("ratio", 1.0) * k
        df, nc = k + k2 - 2, es * math.sqrt(k * k2 / (k + k2))
    else:
        df, nc = k - 1, es * math.sqrt(k)
    return float(stats.nct.sf(stats.t.ppf(1 - alpha / 2, df), df, nc))


def _nan_result(test: str = "", margin: float | None = None) -> dict[str, Any]:
    return {"test": test, "n": 0, "r": math.nan, "sd_diff": math.nan, "mde": math.nan,
            "margin": math.nan if margin is None else float(margin), "tost_p": math.nan,
            "equivalence": equivalence_text(math.nan, margin)}


def equivalence_text(tost_p: float, margin: float | None, alpha: float = ALPHA, note: str = "") -> str:
    """"equivalent within ±m" / "not shown equivalent within ±m" / "no margin ..."."""
    if margin is None or not np.isfinite(margin):
        return "no margin (give one: --margin-for <metric>=<m>)"
    m = f"{margin:g}"
    if not np.isfinite(tost_p):
        return f"equivalence within ±{m} n/a" + (f" ({note})" if note else "")
    return f"equivalent within ±{m}" if tost_p < alpha else f"not shown equivalent within ±{m}"


def pearson_r(a: pd.Series, b: pd.Series) -> float:
    """Pearson r of the per-seed values of two arms (aligned by seed); NaN below 3 pairs or with no spread."""
    j = pd.concat([a, b.reindex(a.index)], axis=1).dropna()
    if len(j) < 3 or j.iloc[:, 0].std() == 0 or j.iloc[:, 1].std() == 0:
        return math.nan
    return float(np.corrcoef(j.iloc[:, 0], j.iloc[:, 1])[0, 1])


def mde_paired(sd_diff: float, n: int, power: float = POWER, alpha: float = ALPHA) -> float:
    """Minimum detectable mean difference of a paired t test with ``n`` pairs (NaN when undefined)."""
    from statsmodels.stats.power import TTestPower

    if n < 2 or not np.isfinite(sd_diff) or sd_diff <= 0:
        return math.nan
    return _solve_es(TTestPower(), dict(nobs=n), power, alpha) * sd_diff


def mde_unpaired(sd: float, n_a: int, n_b: int, power: float = POWER, alpha: float = ALPHA) -> float:
    """Minimum detectable difference of a two-sample t test (pooled ``sd``, ``n_a`` and ``n_b`` seeds)."""
    from statsmodels.stats.power import TTestIndPower

    if n_a < 2 or n_b < 2 or not np.isfinite(sd) or sd <= 0:
        return math.nan
    return _solve_es(TTestIndPower(), dict(nobs1=n_a, ratio=n_b / n_a), power, alpha) * sd


def _solve_es(analysis, kw, power, alpha) -> float:
    try:
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("ignore")
            es = analysis.solve_power(effect_size=None, alpha=alpha, power=power, alternative="two-sided", **kw)
        es = float(np.squeeze(es))
    except Exception:  # noqa: BLE001 - the root finder gives up at tiny n
        return math.nan
    return es if np.isfinite(es) and es > 0 else math.nan


def compare(a: pd.Series, b: pd.Series, margin: float | None = DEFAULT_MARGIN, *, alpha: float = ALPHA,
            power: float = POWER) -> dict[str, Any]:
    """What a comparison of ``a - b`` (both indexed by seed) ruled out: ``test`` ("paired t" when the
    seeds match, as :func:`dapo_exp.analysis.stats.difference`, else "Welch t"), ``n``, ``r``,
    ``sd_diff`` (paired) , ``mde``, ``margin``, ``tost_p`` and ``equivalence`` (see the module doc)."""
    from statsmodels.stats.weightstats import ttost_ind, ttost_paired

    a, b = pd.Series(a, dtype=float).dropna(), pd.Series(b, dtype=float).dropna()
    same = a.index.is_unique and b.index.is_unique and set(a.index) == set(b.index) and len(a) > 0
    lo, hi = (-margin, margin) if margin is not None and np.isfinite(margin) else (None, None)
    if same:
        b = b.reindex(a.index)
        d = (a - b).to_numpy()
        n = len(d)
        out = _nan_result("paired t", margin)
        out["n"] = n
        if n < 2:
            return out
        sd = float(d.std(ddof=1))
        out.update({"r": pearson_r(a, b), "sd_diff": sd, "mde": mde_paired(sd, n, power, alpha)})
        if lo is not None and sd > 0:
            with warnings.catch_warnings(record=True):
                warnings.simplefilter("ignore")
                out["tost_p"] = float(ttost_paired(a.to_numpy(), b.to_numpy(), lo, hi)[0])
        out["equivalence"] = equivalence_text(out["tost_p"], margin, alpha,
                                              "identical per seed" if sd == 0 else "")
        return out
    out = _nan_result("Welch t", margin)
    na, nb = len(a), len(b)
    out["n"] = na + nb
    if na < 2 or nb < 2:
        return out
    sd = math.sqrt(((na - 1) * a.var(ddof=1) + (nb - 1) * b.var(ddof=1)) / (na + nb - 2))
    out["mde"] = mde_unpaired(sd, na, nb, power, alpha)
    if lo is not None and sd > 0:
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("ignore")
            out["tost_p"] = float(ttost_ind(a.to_numpy(), b.to_numpy(), lo, hi, usevar="unequal")[0])
    out["equivalence"] = equivalence_text(out["tost_p"], margin, alpha, "identical values" if sd == 0 else "")
    return out


def verdict_word(lo: float, hi: float, n: int) -> str:
    """"not measured (1 seed)" / "no difference shown" / "difference shown" from an interval."""
    if n < 2 and not (np.isfinite(lo) and np.isfinite(hi)):
        return "not measured (1 seed)" if n <= 1 else NO_DIFFERENCE
    if not (np.isfinite(lo) and np.isfinite(hi)) or lo <= 0 <= hi:
        return NO_DIFFERENCE
    return DIFFERENCE


def ruled_out(mde: float, equivalence: str, r: float = math.nan, unit: str = "") -> str:
    """"MDE 8.1 pp (power 0.8); equivalent within ±5": what a "no difference shown" rules out."""
    parts = [f"MDE {mde:.3g}{(' ' + unit) if unit else ''} (power {POWER:g})" if np.isfinite(mde) else "MDE n/a"]
    if equivalence:
        parts.append(equivalence)
    if np.isfinite(r):
        parts.append(f"r {r:+.2f}")
    return "; ".join(parts)


# --------------------------------------------------------------------------- #
# One seed per configuration                                                    #
# --------------------------------------------------------------------------- #
def _read_overrides(path: Any) -> list[str] | None:
    return rundir.read_overrides(path) if isinstance(path, str) and path else None


def rerun_command(runs: pd.DataFrame, n_seeds: int) -> str:
    """``python run.py -m <the runs' overrides> seed=0,...,n_seeds-1``: the sweep again with more seeds
    (a re-run sweep skips its finished jobs). The overrides are the union of the runs' own
    ``.hydra/overrides.yaml`` (values of a key joined by commas, in order of appearance), then the launcher's
    and the sweeper's as the command gave them (:func:`dapo_exp.rundir.read_launch_overrides`); without
    those, ``sweep=<name>`` (when not the default) and ``fixes=<the presets>``. Each override is
    written as the shell must pass it (:func:`shell_word`: ``"sweep='fixes=grpo,clip'"``)."""
    keys: dict[str, list[str]] = {}
    launch: list[str] = []  # where the jobs ran (the launcher, the sweeper and their settings), kept as given
    got = False
    for path in runs.get("path", pd.Series(dtype=object)):
        ov = _read_overrides(path)
        if ov is None:
            continue
        got = True
        launch += [o for o in rundir.read_launch_overrides(path) if o not in launch]
        for o in ov:
            if "=" not in o:
                continue
            k, v = o.split("=", 1)
            if k.lstrip("+~") == "seed":
                continue
            vals = keys.setdefault(k, [])
            if v not in vals:
                vals.append(v)
    from dapo_exp.fixes import PRESETS

    order = {p: i for i, p in enumerate(PRESETS)}
    if "fixes" in keys:  # the presets in their registry order (grpo first), not the directories'
        keys["fixes"] = sorted(keys["fixes"], key=lambda p: (order.get(p, len(order)), p))
    if not got:
        sweeps = [s for s in dict.fromkeys(runs.get("sweep", pd.Series(dtype=object)).dropna()) if s != "default"]
        if len(sweeps) == 1:
            keys["sweep"] = [str(sweeps[0])]
        presets = sorted((str(p) for p in dict.fromkeys(runs.get("preset", pd.Series(dtype=object)).dropna())),
                         key=lambda p: (order.get(p, len(order)), p))
        if presets:
            keys["fixes"] = presets
    parts = [shell_word(f"{k}={','.join(v)}") for k, v in keys.items()] + [shell_word(o) for o in launch]
    seeds = ",".join(str(i) for i in range(max(n_seeds, 2)))
    return " ".join(["python run.py -m", *parts, f"seed={seeds}"])


def one_seed_line(table: pd.DataFrame, runs: pd.DataFrame | None = None, margin: float = DEFAULT_MARGIN) -> str:
    """The first line of a table whose every configuration has one seed, else "" (a table of runs of which
    none finished has nothing to add seeds to: its failures are the message)."""
    if not len(table) or "n" not in table or int(table["n"].max()) != 1:
        return ""
    runs = runs if runs is not None else pd.DataFrame()
    advice = runs_seed_advice(runs)
    n = advice.seeds(margin)
    cmd = rerun_command(runs, n)
    return (
        "**Nothing can be concluded from one seed per configuration**: no interval, no test, and a difference "
        "of one run against one run is as likely seed noise as an effect. "
        f"Add seeds: `{cmd}` ({n} seeds per configuration detect {margin:g} points of {advice.what} with power "
        f"{POWER:g}, paired by seed, at the toy's measured paired sd of {advice.sd:g} pp: what the launch line and "
        f"`python -m dapo_exp.analysis plan <sweep> --delta {margin:g}` say too; give a measured sd with "
        "`--paired-sd`)."
    )
