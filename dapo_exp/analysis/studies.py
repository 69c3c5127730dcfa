"""Regime studies of the CPU testbed: one fix against its ablation, on the regime built for it.

Each :class:`Study` names a switch of :data:`dapo_exp.fixes.FIXES`, the testbed regime
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

    python -m dapo_exp.analysis study multirun/toy_clip_clip_higher --study clip_higher
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from dapo_exp import fixes, rundir
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


FINAL_ACC = StudyMetric(f"final/{rundir.EVAL_ACC}", 0, "held-out avg@k at the end (percent)", 100.0)


@dataclass(frozen=True)
class Study:
    name: str
    fix: str  # a key of dapo_exp.fixes.FIXES: its switch is what the two arms differ in
    experiment: str  # the regime: conf/experiment/<experiment>.yaml
    metrics: tuple[StudyMetric, ...]
    arms: tuple[str, str] = ("disabled", "enabled")  # the fix's config-group options: off, on

    @property
    def sweep(self) -> str:
        """The sweep's name: its runs land in ``multirun/<sweep>/``."""
        return f"{self.experiment}_{self.fix}"

    def command(self, seeds: str = "0,1,2,3,4") -> str:
        """The sweep: GRPO with the fix off and on, on the study's regime, jobs side by side on
        every core (``hydra/launcher=parallel``; a launcher given after it wins)."""
        return (f"python run.py -m hydra/launcher=parallel sweep={self.sweep} "
                f"experiment={self.experiment} fixes=grpo {self.fix}={','.join(self.arms)} seed={seeds}")


STUDIES: dict[str, Study] = {s.fix: s for s in (
    Study("clip_higher", "clip_higher", "toy_clip", (
        StudyMetric("avg/diag/style_step", +1, "share of samples opening the rare, much better step strategy with "
                                               "its `Steps:` marker: how fast a ~1% first token with a large "
                                               "positive advantage grows"),
        StudyMetric(f"avg/{rundir.ENTROPY}", +1, "policy entropy (the paper: the symmetric clip collapses it; here "
                                                 "the selected step strategy is itself low-entropy)"),
        StudyMetric(f"avg/{rundir.CLIP_HIGH}", -1, "share of tokens clipped at 1 + eps_high"),
        StudyMetric("avg/diag/marker_mangled", 0, "step solutions opened by another first token (`xteps:`), "
                                                  "not in style_step"),
        FINAL_ACC)),
    Study("dynamic_sampling", "dynamic_sampling", "toy_ds", (
        StudyMetric("avg/actor/effective_batch_frac", +1, "share of trained responses with a non-zero advantage: "
                                                          "1 by construction when on (a sanity check)"),
        StudyMetric(f"avg/{rundir.ROLLOUTS_PER_TRAINED}", +1, "rollouts generated per trained rollout (its cost)"),
        FINAL_ACC)),
    Study("token_level_loss", "token_level_loss", "toy_degeneration", (
        StudyMetric("avg/diag/degenerate", -1, "share of samples in a repetition loop"),
        StudyMetric(f"avg/{rundir.RESP_LEN}", -1, "mean response length (tokens)"),
        FINAL_ACC)),
    Study("overlong_filtering", "overlong_filtering", "toy_overlong", (
        StudyMetric("avg/diag/style_step_long", +1, "step-by-step share on long problems (5+ operands), whose "
                                                     "solutions the cap truncates: the push to short guesses"),
        StudyMetric(f"avg/{rundir.RESP_LEN}", +1, "mean response length (tokens)"),
        FINAL_ACC)),
    Study("overlong_punishment", "overlong_punishment", "toy_overlong", (
        StudyMetric(f"avg/{rundir.TRUNC}", -1, "share of truncated samples (the soft ramp teaches to fit)"),
        StudyMetric("avg/diag/trunc_on_path", -1, "share truncated while on a correct path"),
        StudyMetric("avg/diag/style_step_long", +1, "step-by-step share on long problems: does it fit by "
                                                     "shortening its reasoning (+) or by guessing (-)?"),
        FINAL_ACC), arms=("disabled", "soft")),
)}


def _verdict(m: StudyMetric, lo: float, hi: float) -> str:
    if m.sign == 0:
        return "reported"
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo <= 0 <= hi:
        return "no difference shown"
    return "as predicted" if (lo > 0) == (m.sign > 0) else "opposite"


def study_table(data: RunSet | pd.DataFrame, study: Study, confidence: float = 0.95) -> pd.DataFrame:
    """One row per metric of ``study``: both arms' means, ``on - off`` paired by seed with its
    interval, p-value and verdict. Only finished runs count; runs whose other switches differ
    from the first run's are refused (the arms must differ in the study's switch alone)."""
    runs = data.included if isinstance(data, RunSet) else data[data["included"]]
    if study.fix not in runs:
        raise ValueError(f"no run records the switch {study.fix!r}")
    missing = [m.source for m in study.metrics if m.source not in runs]
    if missing:  # a broken diagnostics pipeline must not read as "no difference shown"
        raise ValueError(f"study {study.name}: no run logged {missing}")
    others = [k for k in fixes.switch_names() if k != study.fix and k in runs]
    if len(runs) and (runs[others].nunique(dropna=False) > 1).any():
        mixed = [k for k in others if runs[k].nunique(dropna=False) > 1]
        raise ValueError(f"study {study.name}: the runs also differ in {mixed}; give one study's sweep")
    arms = {v: runs[runs[study.fix] == v] for v in (False, True)}
    rows = []
    for m in study.metrics:
        per = {v: (pd.Series(a[m.source].to_numpy(float) * m.scale, index=a["seed"].to_numpy()).dropna()
                   if m.source in a else pd.Series(dtype=float)) for v, a in arms.items()}
        d = paired_difference(per[True], per[False], confidence)
        rows.append({"metric": m.source, "meaning": m.why, "predicted": {1: "+", -1: "-", 0: ""}[m.sign],
                     "off": per[False].mean(), "on": per[True].mean(), "diff": d.mean, "lo": d.lo, "hi": d.hi,
                     "p": d.p, "n_pairs": d.n, "verdict": _verdict(m, d.lo, d.hi)})
    return pd.DataFrame(rows)


def study_markdown(table: pd.DataFrame, study: Study) -> str:
    """The table as Markdown, with a caption saying what was compared."""
    def f(x: float) -> str:
        return "n/a" if not math.isfinite(x) else f"{x:.4g}"

    lines = [f"**Study `{study.name}`** on `experiment={study.experiment}`: `{study.fix}` on vs off, "
             f"difference on - off paired by seed, 95% t interval.", "",
             "| metric | predicted | off | on | on - off [95% CI] | p | pairs | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for r in table.itertuples():
        lines.append(f"| `{r.metric}` ({r.meaning}) | {r.predicted} | {f(r.off)} | {f(r.on)} | "
                     f"{f(r.diff)} [{f(r.lo)}, {f(r.hi)}] | {f(r.p)} | {r.n_pairs} | {r.verdict} |")
    return "\n".join(lines) + "\n"


def study_figure(data: RunSet, study: Study):
    """Curves of the study's metrics and held-out accuracy per arm against the training step (the
    sweep's own analysis draws them against generated tokens too: ``analysis/figures/curves_vs_tokens``)."""
    from dapo_exp.analysis.curves import plot_curves

    metrics = [m.source.split("/", 1)[1] for m in study.metrics if m is not FINAL_ACC]
    return plot_curves(data, metrics=[*metrics, rundir.EVAL_ACC], x="step", ncols=len(metrics) + 1)
