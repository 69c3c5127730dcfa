"""Benchmark: what a verdict costs in seeds, under each candidate way of running the arms.

    python -m dapo_exp.benchmarks.verdict_cost --seeds 12 --jobs 2          # the measurement (hours on 2 cores)
    python -m dapo_exp.benchmarks.verdict_cost --quick                      # a smoke run (a minute or two)

On the toy (``fixes=grpo``), for each fix of ``--fixes`` (default Clip-Higher and Token-level Loss)
it trains ``--seeds`` seeds of GRPO with the fix off and on (the off arm is shared by the fixes), under
each setting of ``--settings``. Every setting starts from the fast regime (``experiment=toy_fast``'s
sizes, named explicitly so that a change of the defaults never changes a setting):

- ``fast``: that regime with the stream sampler named (``train.randomness=stream``): the toy's
  former default, called ``today`` in the results committed while it was the default (``--settings
  today`` still names it, and its run directories keep that name);
- ``precise``: a larger final evaluation (``eval.final_problems`` x ``eval.final_samples``, the
  held-out set grown with ``task.arith_n_eval``; intermediate evaluations stay 64 x 4);
- ``keyed``: ``train.randomness=keyed`` (:mod:`dapo_exp.keyed`);
- ``both``: the two together;
- ``dense``: the stream sampler with an evaluation every 5 steps instead of 10 (``eval.every=5``), for
  a late-training endpoint over more evaluations (``late_acc`` with ``--late-k 3``: steps 20, 25, 30);
- ``batch2x``, ``batch4x``: ``precise`` with 2 or 4 times the prompts per rollout step
  (``train.prompts_per_step``, and ``train.mini_batch_size`` with it: the same 4 optimizer updates per
  step, each on a 2 or 4 times larger mini-batch), so less gradient noise for the arms to drift apart on,
  at about 2 or 4 times the training time (``batch4x`` with ``--final-problems 256 --final-samples 8``, as
  every committed measurement ran it, is the toy's default regime: ``tests/test_experiments.py``).

Every run also evaluates its final policy ``--repeats`` more times with fresh noise
(``eval.final_repeats``), which measures the evaluation's own noise. Runs are ordinary run
directories (``<runs>/steps<S>-rep<R>-final<P>x<K>/<setting>/<arm>/seed<s>``, ``--runs`` default
``multirun/verdict_cost``): a run with a finished ``summary.json`` is reused,
an interrupted one resumes from its checkpoint, so the command can be stopped and run again, and
``--jobs`` runs that many side by side. The jobs are interleaved (seed by seed, setting by
setting), so that a slow spell of the machine falls on every setting alike.

Per setting, fix and metric (the final held-out accuracy in points; ``late_acc``, the mean held-out
accuracy of the last ``--late-k`` evaluations, the endpoint ``eval.endpoint=last_k_mean`` declares;
and the fix's mechanism metric averaged over training: Clip-Higher's share of step-strategy samples
``diag/style_step``, Token-level Loss's mean response length), with a bootstrap interval over seeds
(pairs resampled):

- ``sd``: standard deviation across seeds within an arm (the two arms pooled);
- ``sd_paired``: standard deviation of the per-seed difference on - off;
- ``r``: correlation of the two arms' per-seed values;
- ``eval_share`` (accuracy): the share of the paired difference's variance that is evaluation
  noise, ``2 * mean within-run variance of the repeated final evaluations / var(difference)``
  (with keyed randomness both arms' final evaluations share their noise, which then partly
  cancels in the difference: the figure is an upper bound there);
- ``n_paired``: seeds per arm for a paired t test to detect ``--delta`` points at power 0.8,
  alpha 0.05 (:func:`dapo_exp.analysis.verdicts.seeds_paired`; its interval is the sd_paired
  interval's);
- ``effect``: the mean difference with its 95% t interval, and whether it agrees with ``fast``'s
  (the two settings' runs are independent: agreement = the difference of the two estimates is
  within 1.96 of its standard error).

Writes ``verdict_cost.md`` and ``verdict_cost.csv`` to ``--out`` (default
``sweeps/results/<date>-verdict-cost``) and prints the table. Timings of the runs (``timing_s/eval``
of the final evaluation against the intermediate ones) give the extra cost of the precise endpoint.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dapo_exp import rundir
from dapo_exp.benchmarks import SHRUNKEN_TOY

ROOT = Path(__file__).resolve().parents[2]
BASE = ("fixes=grpo",)
FIXES = {  # fix -> (its arm's overrides, its mechanism metric (a metrics.jsonl key, mean over training), scale)
    "clip_higher": (("clip_higher=enabled",), "diag/style_step", 1.0),
    "token_level_loss": (("token_level_loss=enabled",), "response_length/mean", 1.0),
}
ACC = "final_acc"
LATE = "late_acc"  # the mean held-out accuracy over the last --late-k evaluations (eval.endpoint=last_k_mean)
ACCS = (ACC, LATE)
COLUMNS = ("setting", "fix", "metric", "n", "sd", "sd_lo", "sd_hi", "sd_paired", "sd_paired_lo", "sd_paired_hi",
           "r", "r_lo", "r_hi", "eval_share", "eval_share_lo", "eval_share_hi", "n_paired", "n_paired_lo",
           "n_paired_hi", "effect", "effect_lo", "effect_hi", "agrees_with_fast", "final_eval_s", "eval_s", "run_s")


FINAL_PROBLEMS, FINAL_SAMPLES = 512, 16  # the precise endpoint's default size (the toy's intermediate: 64 x 4)


def settings(quick: bool, final_problems: int = FINAL_PROBLEMS,
             final_samples: int = FINAL_SAMPLES) -> dict[str, tuple[str, ...]]:
    """Each setting's overrides, the fast regime's sizes first (``--quick``: the shrunken toy's)."""
    fast = SHRUNKEN_TOY if quick else FAST
    precise = fast + (("task.arith_n_eval=16", "eval.problems=8", "eval.final_problems=16", "eval.final_samples=4")
                      if quick else
                      (f"task.arith_n_eval={max(final_problems, 64)}", "eval.problems=64",
                       f"eval.final_problems={final_problems}", f"eval.final_samples={final_samples}"))
    keyed = fast + ("train.randomness=keyed",)
    dense = fast + ("train.randomness=stream", "eval.every=1" if quick else "eval.every=5")
    def bigger(times: int) -> tuple[str, ...]:  # the rollout batch x times, the same 4 updates per step
        prompts, mini = (4, 8) if quick else (16, 32)
        return precise + ("train.randomness=stream", f"train.prompts_per_step={prompts * times}",
                          f"train.mini_batch_size={mini * times}")

    return {name: _last_wins(*ov) for name, ov in {
        "fast": fast + ("train.randomness=stream",), "precise": precise, "keyed": keyed,
        "both": precise + ("train.randomness=keyed",), "dense": dense, "batch2x": bigger(2),
        "batch4x": bigger(4)}.items()}


# a setting's run directories, where they differ from its name (the fast regime's runs were made as `today`)
FOLDERS = {"fast": "today"}
# the fast regime (experiment=toy_fast): 16 prompts x 8 per step in 4 updates of 32, 64 held-out problems
# x 4 samples at every evaluation, the final one included
FAST = ("train.prompts_per_step=16", "train.mini_batch_size=32", "task.arith_n_eval=64", "eval.problems=null",
        "eval.final_problems=null", "eval.final_samples=null")


@dataclass(frozen=True)
class Job:
    setting: str
    arm: str  # "off" or a fix name
    seed: int
    overrides: tuple[str, ...]
    out: Path

    def done(self) -> bool:
        """Finished, and trained from these very overrides (its ``.hydra/overrides.yaml``). A finished run of
        other overrides (an older version's settings, a changed default) goes through ``run.py``, which
        reuses it when its resolved configuration is the same and refuses it, naming the keys, otherwise."""
        s = _summary(self.out)
        recorded = rundir.read_overrides(self.out)
        return bool(s) and s.get("status") == "finished" and recorded is not None \
            and sorted(recorded) == sorted(self.overrides)


def _summary(out: Path) -> dict | None:
    return rundir.read_summary(out)


def jobs(*, runs: Path, seeds: int, first_seed: int = 0, steps: int, repeats: int, fixes: list[str], which: list[str], quick: bool,
         extra: tuple[str, ...] = (), final_problems: int = FINAL_PROBLEMS,
         final_samples: int = FINAL_SAMPLES) -> list[Job]:
    """Every run, interleaved: seed by seed, setting by setting, arm by arm."""
    sets = settings(quick, final_problems, final_samples)
    common = ("logger=none", f"train.steps={steps}", f"eval.final_repeats={repeats}", *extra)
    arms = {"off": BASE, **{f: BASE + FIXES[f][0] for f in fixes}}
    out = []
    for seed in range(first_seed, first_seed + seeds):
        for s in which:
            for arm, ov in arms.items():
                out.append(Job(s, arm, seed, _last_wins(*common, *ov, *sets[s], f"seed={seed}"),
                               runs / FOLDERS.get(s, s) / arm / f"seed{seed}"))
    return out


def _last_wins(*overrides: str) -> tuple[str, ...]:
    """One override per key, the last given (a setting's ``task.arith_n_eval`` over ``FAST``'s)."""
    by_key = {o.split("=", 1)[0]: o for o in overrides}
    return tuple(by_key.values())


def run_job(job: Job, python: str = sys.executable) -> tuple[Job, int, str]:
    """Train one run (``run.py`` in a subprocess, one torch thread); a finished run is reused."""
    if job.done():
        return job, 0, "reused"
    job.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "DAPO_THREADS": "1"}
    cmd = [python, str(ROOT / "run.py"), *job.overrides, f"hydra.run.dir={job.out}"]
    with open(job.out / "verdict_cost.log", "a") as log:
        rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    return job, rc, "ran"


def _mean_metric(rows: list[dict], key: str) -> float:
    """The mean of ``key`` over the training steps' rows of a run's metrics."""
    vals = [float(r[key]) for r in rows if key in r and "reward/mean" in r]  # a training step's row
    return float(np.mean(vals)) if vals else float("nan")


def _eval_times(rows: list[dict], final_step: int) -> tuple[float, float]:
    """(seconds of the final evaluation, mean seconds of the others) from a run's metrics rows."""
    final, other = float("nan"), []
    for row in rows:
        if "timing_s/eval" in row:
            if row.get("step") == final_step:
                final = float(row["timing_s/eval"])
            else:
                other.append(float(row["timing_s/eval"]))
    return final, float(np.mean(other)) if other else float("nan")


def _late_mean(rows: list[dict], k: int) -> float:
    """The mean ``eval/acc_avg`` of the last ``k`` evaluations of the trained policy (step > 0), the
    value ``eval.endpoint=last_k_mean`` with ``eval.endpoint_k=k`` records."""
    from dapo_exp.evaluation import last_k_steps

    evals = {int(r["step"]): float(r["eval/acc_avg"]) for r in rows if "eval/acc_avg" in r and int(r["step"]) > 0}
    last = last_k_steps(evals, k)
    return float(np.mean([evals[s] for s in last])) if len(last) == k else float("nan")


def collect(all_jobs: list[Job], fixes: list[str], late_k: int = 2) -> dict:
    """Per (setting, arm, seed): final accuracy (points), its repeats, the mean accuracy of the last
    ``late_k`` evaluations (points), the mechanism metrics, eval times."""
    data: dict = {}
    for j in all_jobs:
        s = _summary(j.out)
        if not s or s.get("status") != "finished":
            continue
        final = s["final"]
        reps = [final["eval/acc_avg"]] + [final[k] for k in sorted(final) if k.startswith("eval/acc_avg_rep")]
        row = {ACC: 100 * final["eval/acc_avg"], "reps": [100 * v for v in reps]}
        metrics = rundir.read_jsonl(j.out / rundir.METRICS)  # one read of the run's log for every figure
        row[LATE] = 100 * _late_mean(metrics, late_k)
        for f in fixes:
            row[FIXES[f][1]] = _mean_metric(metrics, FIXES[f][1]) * FIXES[f][2]
        row["final_eval_s"], row["eval_s"] = _eval_times(metrics, s["final"]["step"])
        row["run_s"] = float(s.get("wall_time_s") or "nan")
        data[(j.setting, j.arm, j.seed)] = row
    return data


def _stats(a: np.ndarray, b: np.ndarray, ev: np.ndarray | None) -> dict[str, float]:
    d = b - a
    n = len(d)
    out = {"sd": math.sqrt((np.var(a, ddof=1) + np.var(b, ddof=1)) / 2) if n > 1 else float("nan"),
           "sd_paired": float(np.std(d, ddof=1)) if n > 1 else float("nan"),
           "r": float(np.corrcoef(a, b)[0, 1]) if n > 2 and np.std(a) > 0 and np.std(b) > 0 else float("nan"),
           "effect": float(np.mean(d)) if n else float("nan")}
    vd = np.var(d, ddof=1) if n > 1 else float("nan")
    out["eval_share"] = float(2 * np.mean(ev) / vd) if ev is not None and n > 1 and vd > 0 else float("nan")
    return out


def _bootstrap(row: dict, a: np.ndarray, b: np.ndarray, ev: np.ndarray | None, boot: int,
               rng: np.random.Generator) -> None:
    """Percentile intervals of sd, sd_paired, r and eval_share by resampling the seeds' pairs, into ``row``."""
    n = len(a)
    reps = {k: [] for k in ("sd", "sd_paired", "r", "eval_share")}
    if n > 2:
        for _ in range(boot):
            i = rng.integers(0, n, n)
            r_ = _stats(a[i], b[i], None if ev is None else ev[i])
            for k, vals in reps.items():
                vals.append(r_[k])
    for k, v in reps.items():
        v = np.asarray(v, dtype=float)
        v = v[np.isfinite(v)]
        row[f"{k}_lo"], row[f"{k}_hi"] = ((float(np.quantile(v, 0.025)), float(np.quantile(v, 0.975)))
                                          if len(v) else (float("nan"), float("nan")))


def _row(data: dict, setting: str, f: str, metric: str, *, delta: float, boot: int,
         rng: np.random.Generator) -> dict:
    """One row: a fix's paired comparison with the GRPO arm on one metric under one setting."""
    from scipy import stats as st

    from dapo_exp.analysis.verdicts import seeds_paired

    seeds = sorted(s for (st_, arm, s) in data if st_ == setting and arm == "off" and (setting, f, s) in data)
    a = np.array([data[(setting, "off", s)][metric] for s in seeds], dtype=float)
    b = np.array([data[(setting, f, s)][metric] for s in seeds], dtype=float)
    ok = np.isfinite(a) & np.isfinite(b)
    a, b = a[ok], b[ok]
    kept = [s for s, k in zip(seeds, ok) if k]
    ev = None
    if metric == ACC:  # within-run variance of the repeated final evaluation, per seed (both arms)
        ev = np.array([np.mean([np.var(data[(setting, arm, s)]["reps"], ddof=1)
                                if len(data[(setting, arm, s)]["reps"]) > 1 else np.nan
                                for arm in ("off", f)]) for s in kept], dtype=float)
        if not np.isfinite(ev).all():
            ev = None
    est = _stats(a, b, ev)
    n = len(a)
    row = {"setting": setting, "fix": f, "metric": metric, "n": n, **est}
    _bootstrap(row, a, b, ev, boot, rng)
    for k, sd in (("n_paired", est["sd_paired"]), ("n_paired_lo", row["sd_paired_lo"]),
                  ("n_paired_hi", row["sd_paired_hi"])):
        row[k] = seeds_paired(delta, sd) if metric in ACCS else -1
    half = (float(st.t.ppf(0.975, n - 1)) * est["sd_paired"] / math.sqrt(n)) if n > 1 else float("nan")
    row["effect_lo"], row["effect_hi"] = est["effect"] - half, est["effect"] + half
    row["se"] = est["sd_paired"] / math.sqrt(n) if n > 1 else float("nan")
    for k in ("final_eval_s", "eval_s", "run_s"):
        times = [data[(setting, arm, s)][k] for s in kept for arm in ("off", f)]
        row[k] = float(np.nanmean(times)) if times else float("nan")
    return row


def summarise(data: dict, which: list[str], fixes: list[str], *, delta: float, boot: int, seed: int = 0) -> list[dict]:
    """The table's rows (see the module docstring), each setting's effect checked against ``fast``'s."""
    rng = np.random.default_rng(seed)
    rows = [_row(data, setting, f, metric, delta=delta, boot=boot, rng=rng)
            for setting in which for f in fixes for metric in (*ACCS, FIXES[f][1])]
    fast = {(r["fix"], r["metric"]): r for r in rows if r["setting"] == "fast"}
    for r in rows:
        t = fast.get((r["fix"], r["metric"]))
        if t is None or r["setting"] == "fast":
            r["agrees_with_fast"] = "-" if r["setting"] == "fast" else "n/a"
            continue
        se = math.hypot(r["se"], t["se"])
        z = (r["effect"] - t["effect"]) / se if se > 0 else float("nan")
        r["agrees_with_fast"] = "n/a" if not np.isfinite(z) else ("yes" if abs(z) < 1.96 else f"no (z={z:+.1f})")
    return rows


def _f(x, digits: int = 2) -> str:
    return "n/a" if not isinstance(x, (int, float)) or not np.isfinite(x) else f"{x:.{digits}f}"


def _ci(r: dict, k: str, digits: int = 2) -> str:
    return f"{_f(r[k], digits)} [{_f(r[f'{k}_lo'], digits)}, {_f(r[f'{k}_hi'], digits)}]"


def markdown(rows: list[dict], header: str) -> str:
    lines = [header, "",
             ("| setting | fix | metric | n | sd | sd_paired | r | eval_share | n_paired | effect | agrees_with_fast "
              "| final eval s | other eval s | run s |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        def seeds(n: int) -> str:
            return str(n) if n > 0 else "n/a"

        npd = ("-" if r["metric"] not in ACCS else
               f"{seeds(r['n_paired'])} [{seeds(r['n_paired_lo'])}, {seeds(r['n_paired_hi'])}]")
        lines.append(
            f"| {r['setting']} | {r['fix']} | {r['metric']} | {r['n']} | {_ci(r, 'sd')} | {_ci(r, 'sd_paired')} | "
            f"{_ci(r, 'r')} | {_ci(r, 'eval_share') if r['metric'] == ACC else '-'} | {npd} | {_ci(r, 'effect')} | "
            f"{r['agrees_with_fast']} | {_f(r['final_eval_s'])} | {_f(r['eval_s'])} | {_f(r['run_s'], 1)} |")
    return "\n".join(lines) + "\n"


def write(rows: list[dict], out: Path, header: str) -> tuple[Path, Path]:
    import csv

    out.mkdir(parents=True, exist_ok=True)
    md, cs = out / "verdict_cost.md", out / "verdict_cost.csv"
    md.write_text(markdown(rows, header))
    with open(cs, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(COLUMNS), extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return md, cs


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, default=12, help="seeds per arm and setting (default 12)")
    p.add_argument("--first-seed", type=int, default=0,
                   help="the first seed (default 0): seeds first..first+seeds-1; a later block adds seeds to the runs")
    p.add_argument("--late-k", type=int, default=2,
                   help="late_acc: the mean accuracy of the last K evaluations (default 2; eval.endpoint=last_k_mean)")
    p.add_argument("--jobs", type=int, default=1, help="runs side by side (default 1; one torch thread each)")
    p.add_argument("--steps", type=int, default=30, help="rollout steps per run (default 30, the toy's)")
    p.add_argument("--repeats", type=int, default=2, help="extra final evaluations per run (eval noise; default 2)")
    p.add_argument("--fixes", default=",".join(FIXES), help=f"comma-separated, of {', '.join(FIXES)}")
    p.add_argument("--settings", default="fast,precise,keyed,both", help="comma-separated settings")
    p.add_argument("--final-problems", type=int, default=FINAL_PROBLEMS,
                   help=f"the precise final evaluation's problems (default {FINAL_PROBLEMS})")
    p.add_argument("--final-samples", type=int, default=FINAL_SAMPLES,
                   help=f"the precise final evaluation's samples per problem (default {FINAL_SAMPLES})")
    p.add_argument("--delta", type=float, default=5.0, help="difference to detect, in points (default 5)")
    p.add_argument("--boot", type=int, default=2000, help="bootstrap replicates (default 2000)")
    p.add_argument("--out", default=None, help="results directory (default sweeps/results/<date>-verdict-cost)")
    p.add_argument("--runs", default=None, help="run directories (default multirun/verdict_cost[_quick])")
    p.add_argument("--quick", action="store_true",
                   help="smoke mode: the shrunken toy, 2 seeds, 2 steps, 1 repeat (unless given)")
    p.add_argument("--analyse-only", action="store_true", help="train nothing; summarise the finished runs")
    return p


def _header(a: argparse.Namespace, fixes: list[str], which: list[str]) -> str:
    load = os.getloadavg()
    return (f"# verdict_cost: {a.seeds} seeds ({a.first_seed}-{a.first_seed + a.seeds - 1}) x 2 arms per fix and "
            f"setting, {a.steps} steps, {a.repeats} repeats of "
            f"the final evaluation{' (--quick: the shrunken toy)' if a.quick else ''}\n\n"
            f"The toy (fixes=grpo), fixes {', '.join(fixes)}; settings: "
            + "; ".join(f"{s} = {' '.join(settings(a.quick, a.final_problems, a.final_samples)[s]) or 'defaults'}"
                        for s in which)
            + f". {LATE}: the mean held-out accuracy of the last {a.late_k} evaluations (eval.endpoint=last_k_mean, "
            f"eval.endpoint_k={a.late_k}). n_paired: seeds per arm at delta = {a.delta:g} points, power 0.8, alpha 0.05; intervals: "
            f"bootstrap over seeds ({a.boot} replicates, percentile) for sd, sd_paired, r, eval_share, n_paired; "
            f"t interval for the effect (on - off). Accuracy in points. Load average at the end "
            f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}.")


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    a = p.parse_args(argv)
    if a.quick:
        given = set(argv if argv is not None else sys.argv[1:])
        a.seeds = a.seeds if "--seeds" in given else 2
        a.steps = a.steps if "--steps" in given else 2
        a.repeats = a.repeats if "--repeats" in given else 1
        a.boot = a.boot if "--boot" in given else 200
    fixes = [f for f in a.fixes.split(",") if f]
    which = ["fast" if s == "today" else s for s in a.settings.split(",") if s]  # today: the former name
    bad = [f for f in fixes if f not in FIXES] + [s for s in which if s not in settings(a.quick)]
    if bad:
        p.error(f"unknown fix or setting: {', '.join(bad)}")
    if "fast" not in which:
        which = ["fast", *which]  # the reference every setting is compared with
    day = datetime.date.today().isoformat()
    out = Path(a.out or ROOT / "sweeps" / "results" / f"{day}-verdict-cost{'-quick' if a.quick else ''}")
    # the run directories' root names what every run shares, so that other sizes never resume these runs
    runs = (Path(a.runs or ROOT / "multirun" / ("verdict_cost_quick" if a.quick else "verdict_cost"))
            / f"steps{a.steps}-rep{a.repeats}-final{a.final_problems}x{a.final_samples}")
    todo = jobs(runs=runs, seeds=a.seeds, first_seed=a.first_seed, steps=a.steps, repeats=a.repeats, fixes=fixes, which=which, quick=a.quick,
                final_problems=a.final_problems, final_samples=a.final_samples)
    load = os.getloadavg()
    print(f"[verdict_cost] {len(todo)} runs ({sum(j.done() for j in todo)} finished already) in {runs}, "
          f"{a.jobs} at a time; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
    failed = []
    if not a.analyse_only:
        with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
            for i, (job, rc, how) in enumerate(pool.map(run_job, todo), 1):
                if rc:
                    failed.append(job)
                print(f"[verdict_cost] {i}/{len(todo)} {job.setting} {job.arm} seed {job.seed}: "
                      f"{'failed (rc ' + str(rc) + ', see ' + str(job.out / 'verdict_cost.log') + ')' if rc else how}",
                      flush=True)
    # a run that failed now is left out, even where an earlier finished summary of other overrides is there
    rows = summarise(collect([j for j in todo if j not in failed], fixes, a.late_k), which, fixes, delta=a.delta,
                     boot=a.boot)
    header = _header(a, fixes, which)
    md, cs = write(rows, out, header)
    print(markdown(rows, header))
    print(f"[verdict_cost] written {md} and {cs}")
    if failed:
        print(f"[verdict_cost] {len(failed)} runs failed; run the command again to retry them", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
