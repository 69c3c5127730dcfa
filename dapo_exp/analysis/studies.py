"""Regime studies of the CPU testbed: one fix against its ablation, on the regime built for it.

Each :class:`Study` is built from a fix's own declaration (``Fix.study``, :class:`dapo_exp.fixes.Judged`, in
the fix's module): it names a switch of :data:`dapo_exp.fixes.FIXES`, the testbed regime
(``conf/experiment/toy_*.yaml``) in which the paper says that fix has a job, and the
*mechanism metrics* through which the paper says it acts, each with the predicted sign of
``fix on - fix off``. :func:`study_table` pairs the runs by seed and gives, per metric, both
arms' means, the paired difference with its 95% t interval and p-value, and a verdict:

- ``as predicted``: the interval excludes 0 on the predicted side;
- ``opposite``: it excludes 0 on the other side;
- ``no difference shown``: it contains 0 (or n < 2);
- ``reported``: a metric with no prediction (held-out accuracy: reported whatever it is).

A metric's value per run is its mean over the logged training steps (``avg/``) or the
held-out evaluation at the end (``final/``), see :attr:`StudyMetric.source`.

**What "no difference shown" ruled out** (:mod:`dapo_exp.analysis.verdicts`): every row also has
``r`` (Pearson correlation of the two arms' per-seed values), ``mde`` (the difference a paired t
test with these pairs and this spread detects with power 0.8 at alpha 0.05) and the equivalence
verdict of two one-sided tests (``ttost_paired``) against ``±margin``: for the held-out accuracy
(in percent) the margin is ``margin`` (``--margin``, default 5 points); other metrics are in their
own units (shares, tokens, nats), so their margin is per metric (``margins``, ``--margin-for
<metric>=<m>``, or :attr:`StudyMetric.margin`); without one the row says "no margin".

**Positive control** (:class:`PositiveControl`): a study names a change with a known large effect
on held-out accuracy, run as a third arm in the same sweep (:meth:`Study.control_command`: the
control arm, the fix off, plus one override, same seeds). When such runs are present,
:func:`study_table` reports the paired difference ``control run - fix off`` on held-out accuracy
with its interval (``attrs["positive_control"]``): a set-up that cannot see that effect cannot see a
smaller one, and the one it detects is set against the MDE of the study's own accuracy row. When
they are absent the study says so and gives the command.

    python -m dapo_exp.analysis study multirun/toy_clip_clip_higher --study clip_higher
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from dapo_exp import fixes, rundir
from dapo_exp.analysis import verdicts
from dapo_exp.analysis.runs import RunSet
from dapo_exp.analysis.stats import paired_difference


@dataclass(frozen=True)
class StudyMetric:
    """``source``: a column of the runs frame (``avg/<metric>``: mean over training steps;
    ``final/<metric>``: the last evaluation); ``sign``: +1 / -1 predicted sign of on - off,
    0 for none; ``scale``: shown in the table's unit (accuracy in percent)."""

    source: str
    sign: int
    why: str
    scale: float = 1.0
    # equivalence margin in the metric's own unit (after ``scale``); None: the accuracy margin for
    # metrics in percent (scale 100), else no equivalence test unless one is given
    margin: float | None = None

    @property
    def is_accuracy(self) -> bool:
        return self.scale == 100.0


FINAL_ACC = StudyMetric(f"endpoint/{rundir.EVAL_ACC}", 0,
                        "held-out avg@k at the declared endpoint (eval.endpoint; percent)", 100.0)


@dataclass(frozen=True)
class PositiveControl:
    """A third arm with a known large effect on held-out accuracy: the fix off plus ``override`` (a
    Hydra override of one config key, ``key=value``); ``sign``: the expected sign of ``control - off``."""

    override: str
    sign: int
    why: str

    @property
    def key(self) -> str:
        return self.override.split("=", 1)[0].lstrip("+")

    @property
    def value(self) -> str:
        return self.override.split("=", 1)[1]

    @property
    def column(self) -> str:
        """The runs frame's column of the key (the flattened resolved config)."""
        return f"config.{self.key}"

    def matches(self, values: pd.Series) -> pd.Series:
        """Which runs carry the override (numbers compared as numbers: ``5e-6`` == 5.0e-06)."""
        want = self.value
        try:
            w = float(want)
            num = pd.to_numeric(values, errors="coerce")
            return (num - w).abs() <= 1e-12 * max(1.0, abs(w))
        except ValueError:
            return values.astype(str) == want


# No RL training: held-out accuracy stays at the warm start's. 30 rollout steps move it by tens of
# points on the toy (docs/results/index.md: the 16-prompt toy 21-25% -> 41-71% at seeds 0-2; toy_clip's base policy guesses
# right about 11% of the time, 75% after 30 steps, sweeps/README.md), so a set-up that misses it is broken.
# train.steps=0 is supported (the trainer evaluates once and writes the summary) and costs only the
# warm start (cached per regime) and one evaluation.
NO_TRAINING = PositiveControl("train.steps=0", -1, "no RL training (train.steps=0): held-out accuracy stays at "
                                                   "the warm start's; 30 steps add tens of points on the toy")


@dataclass(frozen=True)
class Study:
    name: str
    fix: str  # a key of dapo_exp.fixes.FIXES: its switch is what the two arms differ in
    experiment: str  # the regime: conf/experiment/<experiment>.yaml
    metrics: tuple[StudyMetric, ...]
    arms: tuple[str, str] = ("disabled", "enabled")  # the fix's config-group options: off, on
    positive_control: PositiveControl | None = NO_TRAINING

    @property
    def sweep(self) -> str:
        """The sweep's name: its runs land in ``multirun/<sweep>/``."""
        return f"{self.experiment}_{self.fix}"

    def command(self, seeds: str = "0,1,2,3,4") -> str:
        """The sweep: GRPO with the fix off and on, on the study's regime, jobs side by side on
        every core (``hydra/launcher=parallel``; a launcher given after it wins)."""
        return (f"python run.py -m hydra/launcher=parallel sweep={self.sweep} "
                f"experiment={self.experiment} fixes=grpo {self.fix}={','.join(self.arms)} seed={seeds}")

    def control_command(self, seeds: str = "0,1,2,3,4") -> str:
        """The positive-control arm into the same sweep directory: the fix off plus the control's
        override, on the same seeds (paired with the off arm). "" without a positive control."""
        if self.positive_control is None:
            return ""
        return (f"python run.py -m hydra/launcher=parallel sweep={self.sweep} experiment={self.experiment} "
                f"fixes=grpo {self.fix}={self.arms[0]} {self.positive_control.override} seed={seeds}")


def _study(name: str, judged: fixes.Judged) -> Study:
    """A fix's study as its module declares it (``Fix.study``), with the held-out accuracy at the endpoint."""
    return Study(name, name, judged.experiment, tuple(StudyMetric(*m) for m in judged.metrics) + (FINAL_ACC,),
                 arms=judged.arms)


# one per fix whose module declares how it is judged (Fix.study), in registry order
STUDIES: dict[str, Study] = {name: _study(name, f.study) for name, f in fixes.FIXES.items() if f.study is not None}


def _verdict(m: StudyMetric, lo: float, hi: float) -> str:
    if m.sign == 0:
        return "reported"
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo <= 0 <= hi:
        return "no difference shown"
    return "as predicted" if (lo > 0) == (m.sign > 0) else "opposite"


def _margin(m: StudyMetric, margin: float, margins: dict[str, float] | None) -> float | None:
    if margins and m.source in margins:
        return float(margins[m.source])
    if m.margin is not None:
        return float(m.margin)
    return float(margin) if m.is_accuracy else None


def _split_control(runs: pd.DataFrame, study: Study) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the two arms' runs, the positive control's runs)."""
    pc = study.positive_control
    if pc is None or pc.column not in runs:
        return runs, runs.iloc[:0]
    is_ctrl = pc.matches(runs[pc.column]).fillna(False).astype(bool)
    return runs[~is_ctrl], runs[is_ctrl & (runs[study.fix] == False)]  # noqa: E712 - a column of bools


def _per_seed(runs: pd.DataFrame, m: StudyMetric) -> pd.Series:
    if m.source not in runs:
        return pd.Series(dtype=float)
    return pd.Series(runs[m.source].to_numpy(float) * m.scale, index=runs["seed"].to_numpy()).dropna()


def study_table(data: RunSet | pd.DataFrame, study: Study, confidence: float = 0.95, *,
                margin: float = verdicts.DEFAULT_MARGIN, margins: dict[str, float] | None = None) -> pd.DataFrame:
    """One row per metric of ``study``: both arms' means, ``on - off`` paired by seed with its
    interval, p-value and verdict, and what it ruled out: ``r`` (correlation of the arms' per-seed
    values), ``sd_diff``, ``mde`` (power 0.8, alpha 0.05), ``margin``, ``tost_p`` and ``equivalence``
    (see the module doc; ``margin``: accuracy metrics, in points; ``margins``: per metric source, in
    its unit). Only finished runs count; runs whose other switches differ from the first run's are
    refused (the arms must differ in the study's switch alone). The positive control's runs (the
    study's :class:`PositiveControl` override) are not an arm: ``attrs["positive_control"]`` holds
    their paired difference to the fix-off arm on held-out accuracy, or ``present: False``."""
    from dapo_exp.analysis.runs import with_endpoint

    runs = with_endpoint(data.included if isinstance(data, RunSet) else data[data["included"]])
    if study.fix not in runs:
        raise ValueError(f"no run records the switch {study.fix!r}")
    missing = [m.source for m in study.metrics if m.source not in runs]
    if missing:  # a broken diagnostics pipeline must not read as "no difference shown"
        raise ValueError(f"study {study.name}: no run logged {missing}")
    others = [k for k in fixes.switch_names() if k != study.fix and k in runs]
    if len(runs) and (runs[others].nunique(dropna=False) > 1).any():
        mixed = [k for k in others if runs[k].nunique(dropna=False) > 1]
        raise ValueError(f"study {study.name}: the runs also differ in {mixed}; give one study's sweep")
    runs, ctrl = _split_control(runs, study)
    arms = {v: runs[runs[study.fix] == v] for v in (False, True)}
    rows = []
    for m in study.metrics:
        per = {v: _per_seed(a, m) for v, a in arms.items()}
        d = paired_difference(per[True], per[False], confidence)
        v = verdicts.compare(per[True], per[False], _margin(m, margin, margins))
        rows.append({"metric": m.source, "meaning": m.why, "predicted": {1: "+", -1: "-", 0: ""}[m.sign],
                     "off": per[False].mean(), "on": per[True].mean(), "diff": d.mean, "lo": d.lo, "hi": d.hi,
                     "p": d.p, "n_pairs": d.n, "verdict": _verdict(m, d.lo, d.hi),
                     "r": v["r"], "sd_diff": v["sd_diff"], "mde": v["mde"], "margin": v["margin"],
                     "tost_p": v["tost_p"], "equivalence": v["equivalence"]})
    table = pd.DataFrame(rows)
    table.attrs["positive_control"] = _control(study, ctrl, arms[False], confidence)
    table.attrs["margin"] = margin
    return table


def _control(study: Study, ctrl: pd.DataFrame, off: pd.DataFrame, confidence: float) -> dict:
    """The positive control's paired difference to the fix-off arm on held-out accuracy."""
    pc = study.positive_control
    out: dict = {"override": pc.override if pc else "", "why": pc.why if pc else "", "present": False,
                 "n_runs": int(len(ctrl)), "metric": FINAL_ACC.source}
    if pc is None or not len(ctrl) or FINAL_ACC.source not in ctrl:
        return out
    c, o = _per_seed(ctrl, FINAL_ACC), _per_seed(off, FINAL_ACC)
    d = paired_difference(c, o, confidence)
    out.update({"present": True, "control": c.mean(), "off": o.mean(), "diff": d.mean, "lo": d.lo, "hi": d.hi,
                "p": d.p, "n_pairs": d.n, "sign": pc.sign,
                "detected": bool(math.isfinite(d.lo) and math.isfinite(d.hi) and
                                 ((d.lo > 0) if pc.sign > 0 else (d.hi < 0)))})
    return out


def _f(x: float) -> str:
    return "n/a" if not (isinstance(x, (int, float)) and math.isfinite(x)) else f"{x:.4g}"


def _ruled_out(r) -> str:
    """What the row rules out: MDE and equivalence where its interval contains 0."""
    if math.isfinite(r.lo) and math.isfinite(r.hi) and not (r.lo <= 0 <= r.hi):
        return ""
    if r.n_pairs < 2:
        return "not measured (fewer than 2 pairs)"
    return verdicts.ruled_out(r.mde, r.equivalence)


def control_markdown(table: pd.DataFrame, study: Study) -> str:
    """The positive-control paragraph of a study: its effect, or that its runs are absent."""
    pc = table.attrs.get("positive_control") or {}
    if study.positive_control is None:
        return "**Positive control:** none defined for this study.\n"
    if not pc.get("present"):
        return (f"**Positive control:** no runs with `{study.positive_control.override}` in this sweep, so "
                "nothing shows that this set-up detects an effect it should (e.g. "
                f"{study.positive_control.why}). Add them (same seeds as the arms): "
                f"`{study.control_command(_seed_list(table))}`\n")
    acc = table.set_index("metric").loc[FINAL_ACC.source] if FINAL_ACC.source in set(table["metric"]) else None
    if pc["detected"]:
        word = "detected"
    elif not (math.isfinite(pc["lo"]) and math.isfinite(pc["hi"])):
        word = ("no interval (fewer than 2 pairs, or the same difference on every seed): add seeds to the control "
                "arm")
    else:
        word = "NOT detected: the set-up misses a known effect; distrust its verdicts"
    line = (f"**Positive control** `{pc['override']}` ({pc['why']}): held-out accuracy {_f(pc['control'])} vs "
            f"{_f(pc['off'])} with the fix off, control - off {_f(pc['diff'])} [{_f(pc['lo'])}, {_f(pc['hi'])}] "
            f"points (95% t, {pc['n_pairs']} pairs, p {_f(pc['p'])}): {word}.")
    if acc is not None and math.isfinite(acc["mde"]):
        line += (f" The study's own accuracy comparison detects {_f(acc['mde'])} points with power 0.8 (MDE); "
                 f"the margin is ±{_f(acc['margin'])}" + (": an effect of the margin's size would be missed more than 20% of the time."
                                                         if acc["mde"] > acc["margin"] else "."))
    return line + "\n"


def _seed_list(table: pd.DataFrame) -> str:
    n = int(table["n_pairs"].max()) if len(table) and "n_pairs" in table else 0
    return ",".join(str(i) for i in range(max(n, 5)))


def study_markdown(table: pd.DataFrame, study: Study) -> str:
    """The table as Markdown, with a caption saying what was compared and the positive control."""
    lines = [f"**Study `{study.name}`** on `experiment={study.experiment}`: `{study.fix}` on vs off, "
             f"difference on - off paired by seed, 95% t interval. Where it contains 0, 'ruled out' gives the "
             "minimum detectable effect (MDE, power 0.8, alpha 0.05, at this spread and number of pairs) and "
             "equivalence by two one-sided tests within ±margin (accuracy in points, --margin; other metrics in "
             "their own unit, --margin-for); r (arms): Pearson correlation of the arms' per-seed values.", "",
             "| metric | predicted | off | on | on - off [95% CI] | p | pairs | verdict | ruled out | r (arms) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in table.itertuples():
        lines.append(f"| `{r.metric}` ({r.meaning}) | {r.predicted} | {_f(r.off)} | {_f(r.on)} | "
                     f"{_f(r.diff)} [{_f(r.lo)}, {_f(r.hi)}] | {_f(r.p)} | {r.n_pairs} | {r.verdict} | "
                     f"{_ruled_out(r)} | {'' if not math.isfinite(r.r) else f'{r.r:+.2f}'} |")
    lines += ["", control_markdown(table, study).rstrip("\n")]
    return "\n".join(lines) + "\n"


def study_figure(data: RunSet, study: Study):
    """Curves of the study's metrics and held-out accuracy per arm against the training step (the
    sweep's own analysis draws them against generated tokens too: ``analysis/figures/curves_vs_tokens``)."""
    from dapo_exp.analysis.curves import plot_curves

    metrics = [m.source.split("/", 1)[1] for m in study.metrics if m is not FINAL_ACC]
    return plot_curves(data, metrics=[*metrics, rundir.EVAL_ACC], x="step", ncols=len(metrics) + 1)
