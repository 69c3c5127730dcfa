"""``hydra/sweeper=sequential`` (issue 37): seeds in rounds until each comparison is decided.

The rule is tested with a launcher that writes synthetic runs (tests/fixtures_runs.py) whose endpoint is
chosen per configuration and seed, so each decision is known in advance; the real path (``run.py -m``
with the toy, a kill -9 and the resume) is tested at the end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from fixtures_runs import make_run
from hydra.core.utils import JobReturn, JobStatus

from dapo_exp.analysis import sequential_sweep as ss

ROOT = Path(__file__).resolve().parents[1]


class FakeLauncher:
    """Writes a finished synthetic run per job into the job's directory; ``acc(preset, seed)`` its endpoint."""

    def __init__(self, config, acc) -> None:
        self.config, self.acc, self.launched = config, acc, []

    def launch(self, jobs, initial_job_idx):
        from dapo_exp.analysis.callback import job_dir

        out = []
        for job in jobs:
            kv = dict(o.split("=", 1) for o in job)
            preset, seed = kv["fixes"], int(kv["seed"])
            make_run(job_dir(self.config, job), preset, seed, self.acc(preset, seed))
            self.launched.append(tuple(job))
            r = JobReturn()
            r.status, r._return_value = JobStatus.COMPLETED, None
            out.append(r)
        return out


def _sweeper(tmp_path: Path, acc, **rule):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from dapo_exp.hydra_setup import CONFIG_DIR, register_resolvers
    from hydra_plugins.dapo_exp_sweeper.sequential_sweeper import SequentialSweeper

    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("config", overrides=[f"hydra.sweep.dir={tmp_path}", "hydra/sweeper=sequential"],
                      return_hydra_config=True)
    sweeper = SequentialSweeper(**rule)
    sweeper.config, sweeper.hydra_context = cfg, SimpleNamespace(config_loader=None)
    sweeper.launcher = FakeLauncher(cfg, acc)
    return sweeper


ARM = {"grpo": 0, "clip": 1, "clip_ds": 2, "full": 3}


def _noise(preset: str, seed: int, sd: float) -> float:
    """Independent noise per configuration and seed (a paired difference of zero spread would be decided at once)."""
    return float(np.random.default_rng([ARM[preset], seed]).normal(0.0, sd))


def test_a_large_effect_is_decided_different_in_a_few_rounds(tmp_path, capsys):
    sweeper = _sweeper(tmp_path, lambda p, s: 0.30 + (0.20 if p == "clip" else 0.0) + _noise(p, s, 0.01))
    sweeper.sweep(["fixes=grpo,clip"])
    rec = ss.record_of(tmp_path)
    last = rec["rounds"][-1]["comparisons"]
    assert rec["done"] and [c["state"] for c in last] == ["different"] and last[0]["lo"] > 0
    assert (last[0]["label_a"], last[0]["label_b"]) == ("clip", "grpo")
    assert len(sweeper.launcher.launched) < 2 * sweeper.rule.max_seeds  # stopped before the budget
    out = capsys.readouterr().out
    assert "[sequential] 2 configurations; seeds in rounds: 3 per configuration first" in out
    assert "[sequential] round 1 | clip vs grpo: 3 seeds, diff +2" in out and ": different" in out


def test_a_null_effect_with_little_noise_is_decided_equivalent(tmp_path):
    sweeper = _sweeper(tmp_path, lambda p, s: 0.30 + _noise(p, s, 0.004) + (0.001 if p == "clip" else 0.0))
    sweeper.sweep(["fixes=grpo,clip"])
    last = ss.record_of(tmp_path)["rounds"][-1]["comparisons"][0]
    assert last["state"] == "equivalent" and -5.0 < last["lo"] < 0 < last["hi"] < 5.0


def test_a_noisy_comparison_spends_its_budget_and_ends_undecided(tmp_path, capsys):
    sweeper = _sweeper(tmp_path, lambda p, s: 0.30 + _noise(p, s, 0.08), max_seeds=5)
    sweeper.sweep(["fixes=grpo,clip"])
    rec = ss.record_of(tmp_path)
    assert rec["done"] and rec["rounds"][-1]["comparisons"][0]["state"] == "undecided"
    assert len(sweeper.launcher.launched) == 10 and len(rec["rounds"]) == 3  # 3 seeds, then 1 and 1
    assert rec["rounds"][-1]["seeds"] == {"fixes=grpo": [0, 1, 2, 3, 4], "fixes=clip": [0, 1, 2, 3, 4]}
    assert "undecided (seed budget spent)" in capsys.readouterr().out


def test_a_ladder_is_judged_rung_by_rung_with_the_error_rate_shared(tmp_path):
    effect = {"grpo": 0.0, "clip": 0.25, "clip_ds": 0.25}  # the second rung adds nothing
    sweeper = _sweeper(tmp_path, lambda p, s: 0.30 + effect[p] + _noise(p, s, 0.004))
    sweeper.sweep(["fixes=grpo,clip,clip_ds"])
    last = ss.record_of(tmp_path)["rounds"][-1]["comparisons"]
    assert [(c["label_a"], c["label_b"], c["state"]) for c in last] == [
        ("clip", "grpo", "different"), ("clip_ds", "clip", "equivalent")]
    assert all(c["alpha"] == pytest.approx(0.025) for c in last)


def test_a_configuration_whose_comparisons_are_decided_gets_no_more_seeds(tmp_path):
    # full vs grpo is decided at once; clip vs grpo is noisy and runs to the budget: full stops early
    def acc(p, s):
        return 0.30 + {"grpo": 0.0, "clip": 0.0, "full": 0.3}[p] + _noise(p, s, 0.002 if p != "clip" else 0.1)

    sweeper = _sweeper(tmp_path, acc, max_seeds=6)
    sweeper.sweep(["fixes=grpo,clip,full"])
    seeds = ss.record_of(tmp_path)["rounds"][-1]["seeds"]
    assert len(seeds["fixes=full"]) < len(seeds["fixes=clip"]) == len(seeds["fixes=grpo"]) == 6


def test_a_rerun_replays_the_rounds_and_launches_nothing_finished(tmp_path, capsys):
    acc = lambda p, s: 0.30 + (0.05 if p == "clip" else 0.0) + _noise(p, s, 0.02)  # noqa: E731
    first = _sweeper(tmp_path, acc, max_seeds=8)
    first.sweep(["fixes=grpo,clip"])
    before = ss.record_of(tmp_path)
    again = _sweeper(tmp_path, acc, max_seeds=8)
    again.sweep(["fixes=grpo,clip"])
    assert again.launcher.launched == [] and ss.record_of(tmp_path) == before
    assert "already finished: not run again" in capsys.readouterr().out


@pytest.mark.parametrize("change", [{"margin": 40.0}, {"alpha": 0.2}, {"max_seeds": 10}])
def test_a_recorded_decision_is_never_rewritten_a_rerun_under_another_rule_is_refused_naming_it(tmp_path, change):
    """Re-running a finished sequential sweep with another rule would replay it to another decision: refused
    before any run, naming the recorded rule and each changed key; the record keeps every byte."""
    from hydra.errors import HydraException

    acc = lambda p, s: 0.30 + (0.05 if p == "clip" else 0.0) + _noise(p, s, 0.02)  # noqa: E731
    _sweeper(tmp_path, acc, max_seeds=8).sweep(["fixes=grpo,clip"])
    before = (tmp_path / ss.RECORD).read_bytes()
    again = _sweeper(tmp_path, acc, **{"max_seeds": 8, **change})
    (key, value), = change.items()
    recorded = ss.record_of(tmp_path)["rule"][key]
    with pytest.raises(HydraException, match=rf"records a decision under another rule \({key}: {recorded!r} -> "
                                             rf"{value!r}\).*\(hydra.sweeper.alpha=0.05 hydra.sweeper.margin=5.0"):
        again.sweep(["fixes=grpo,clip"])
    assert again.launcher.launched == [] and (tmp_path / ss.RECORD).read_bytes() == before


def test_a_record_of_other_configurations_is_refused_naming_them(tmp_path):
    from hydra.errors import HydraException

    acc = lambda p, s: 0.30 + _noise(p, s, 0.02)  # noqa: E731
    _sweeper(tmp_path, acc, max_seeds=4).sweep(["fixes=grpo,clip"])
    before = (tmp_path / ss.RECORD).read_bytes()
    with pytest.raises(HydraException, match=r"records another sweep \(fixes=clip, fixes=grpo; this command: fixes=full, fixes=grpo\)"):
        _sweeper(tmp_path, acc, max_seeds=4).sweep(["fixes=grpo,full"])
    assert (tmp_path / ss.RECORD).read_bytes() == before


def test_the_writer_refuses_to_rewrite_a_recorded_round(tmp_path):
    rule = ss.Rule()
    first = [{"round": 1, "seeds": {"a": [0, 1, 2]}, "comparisons": []}]
    ss.write_record(tmp_path, rule, first, done=False)
    ss.write_record(tmp_path, rule, first + [{"round": 2, "seeds": {"a": [0, 1, 2, 3]}, "comparisons": []}], done=True)
    before = (tmp_path / ss.RECORD).read_bytes()
    ss.write_record(tmp_path, rule, first, done=False)  # a re-run replaying round 1: the record stands
    with pytest.raises(ValueError, match="round 1 would be rewritten"):
        ss.write_record(tmp_path, rule, [{"round": 1, "seeds": {"a": [0, 1]}, "comparisons": []}], done=True)
    with pytest.raises(ValueError, match="records another rule"):
        ss.write_record(tmp_path, ss.Rule(margin=40.0), first, done=True)
    assert (tmp_path / ss.RECORD).read_bytes() == before


def test_the_table_states_the_rule_the_sequential_sweep_used(tmp_path):
    """With hydra.sweeper.margin=40 the equivalence the table states is the record's ±40 pp, never the fixed
    design's default ±5; the caption gives no TOST margin (a fixed-sample test, not given here)."""
    from dapo_exp.analysis.report import run_analysis

    _sweeper(tmp_path, lambda p, s: 0.30 + _noise(p, s, 0.02), max_seeds=6, margin=40.0).sweep(["fixes=grpo,clip"])
    last = ss.record_of(tmp_path)["rounds"][-1]["comparisons"][0]
    assert last["state"] == "equivalent" and not -5 < last["lo"] < last["hi"] < 5  # decided by the wide margin
    t = run_analysis(tmp_path, out=tmp_path / "analysis", figures=False).table
    assert t.loc["clip", "d_margin"] == 40.0 and t.loc["clip", "d_equivalence"].startswith("equivalent within ±40 pp")
    assert "±40 pp" in t.attrs["caption"] and "±5 pp" not in t.attrs["caption"], t.attrs["caption"]


@pytest.mark.parametrize("args, rule, message", [
    (["fixes=grpo,clip", "seed=0,1"], {}, "chooses the seeds itself"),
    (["fixes=clip"], {}, "at least two"),
    (["fixes=grpo,clip"], {"first_seeds": 1}, "first_seeds=1"),
    (["fixes=grpo,clip"], {"alpha": 1.5}, "alpha=1.5"),
    (["fixes=grpo,clip"], {"max_seeds": 2}, "max_seeds=2"),
    (["fixes=grpo,clip"], {"round_seeds": 0}, "round_seeds=0"),
    (["fixes=grpo,clip"], {"round_seeds": "abc"}, "round_seeds='abc'"),
    (["fixes=grpo,clip"], {"round_seeds": 1.5}, "round_seeds=1.5"),
    (["fixes=grpo,clip"], {"first_seeds": 2.5}, "first_seeds=2.5"),
    (["fixes=grpo,clip"], {"max_seeds": True}, "max_seeds=True"),
    (["fixes=grpo,clip"], {"margin": float("nan")}, "margin=nan"),
    (["fixes=grpo,clip"], {"phi": float("inf")}, "phi=inf"),
])
def test_bad_input_is_refused_naming_it_before_any_run(tmp_path, args, rule, message):
    from hydra.errors import HydraException

    with pytest.raises(HydraException, match=message):
        _sweeper(tmp_path, lambda p, s: 0.3, **rule).sweep(args)
    assert not list(tmp_path.glob("*/summary.json"))


def test_the_intervals_are_the_anytime_valid_ones_of_the_paired_differences(tmp_path):
    from dapo_exp.analysis import sequential as seq

    acc = lambda p, s: 0.30 + (0.03 if p == "clip" else 0.0) + _noise(p, s, 0.02)  # noqa: E731
    sweeper = _sweeper(tmp_path, acc, max_seeds=4)
    sweeper.sweep(["fixes=grpo,clip"])
    last = ss.record_of(tmp_path)["rounds"][-1]["comparisons"][0]
    d = [100 * (round(acc("clip", s), 6) - round(acc("grpo", s), 6)) for s in last["seeds"]]  # runs keep 6 decimals
    iv = seq.interval(d, alpha=0.05, phi=0.1, margin=5.0)
    assert (last["n"], last["mean"], last["lo"], last["hi"]) == pytest.approx((iv.n, iv.mean, iv.lo, iv.hi))


def _finished(sweep_dir: Path) -> dict[str, float]:
    """The finished runs of a sweep directory and their summary's modification time."""
    out = {}
    for p in sweep_dir.glob("*/summary.json"):
        try:
            if json.loads(p.read_text()).get("status") == "finished":
                out[p.parent.name] = p.stat().st_mtime_ns
        except (OSError, ValueError):  # being written
            pass
    return out


@pytest.mark.slow
def test_the_toy_sweep_runs_rounds_and_resumes_after_kill_9_without_rerunning_a_finished_run(tmp_path, warm_cache):
    """The acceptance command at the toy's smallest size: rounds until decided or out of budget, one line per
    comparison per round; killed (-9) in its first round, the same command finishes it, running no finished
    run again."""
    from helpers import NO_FIGURES, SMALL

    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "run.py", "-m", "fixes=grpo,clip", "hydra/sweeper=sequential", "experiment=toy_fast",
           *SMALL, "hydra.sweeper.max_seeds=4", f"hydra.sweep.dir={sweep}", f"model.cache_dir={warm_cache}",
           NO_FIGURES]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while len(_finished(sweep)) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        first_out = proc.communicate()[0]
    before = _finished(sweep)
    assert 2 <= len(before) < 6, (before, first_out[-3000:])  # killed inside the first round (6 runs)
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    after = _finished(sweep)
    assert all(after[name] == mtime for name, mtime in before.items())  # not run again
    assert f"[sequential] {len(before)} run(s) of this round already finished: not run again" in out.stdout
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("[sequential] round ")]
    assert lines[0].startswith("[sequential] round 1 | clip vs grpo: 3 seeds, "), out.stdout[-3000:]
    rec = ss.record_of(sweep)
    assert rec["done"] and len(lines) == len(rec["rounds"])  # one line per comparison per round
    state = rec["rounds"][-1]["comparisons"][0]["state"]
    assert state != "undecided" or rec["rounds"][-1]["seeds"]["fixes=clip"] == [0, 1, 2, 3]
    assert len(after) == 2 * len(rec["rounds"][-1]["seeds"]["fixes=clip"])


def test_the_analysis_of_a_sequential_sweep_gives_its_anytime_valid_intervals_labelled(tmp_path):
    from dapo_exp.analysis.report import run_analysis

    effect = {"grpo": 0.0, "clip": 0.04, "clip_ds": 0.04}
    _sweeper(tmp_path, lambda p, s: 0.30 + effect[p] + _noise(p, s, 0.01), max_seeds=6).sweep(
        ["fixes=grpo,clip,clip_ds"])
    rec = ss.record_of(tmp_path)
    res = run_analysis(tmp_path, out=tmp_path / "analysis", figures=False)
    t = res.table
    assert t.loc["clip", "d_test"] == "anytime-valid (sequential)" and t.loc["grpo", "d_test"] == "baseline"
    assert "anytime-valid" in t.attrs["caption"] and "alpha 0.05 over 2 comparison(s)" in t.attrs["caption"]
    assert np.isnan(t.loc["clip", "d_final_acc_mde"]) and np.isnan(t.loc["clip", "d_final_acc_p"])
    rungs = {(c["label_a"], c["label_b"]): c for c in rec["rounds"][-1]["comparisons"]}
    con = res.contrasts.set_index("rung")
    for (a, b), c in rungs.items():  # the contrasts are the sweeper's own last intervals
        assert con.loc[a, "vs"] == b
        assert (con.loc[a, "lo"], con.loc[a, "hi"]) == pytest.approx((c["lo"], c["hi"]))
    assert "anytime-valid" in (tmp_path / "analysis" / "contrasts.md").read_text()
    # the same runs without the record: a fixed sweep's t intervals (Welch: grpo stopped a seed before clip)
    (tmp_path / ss.RECORD).unlink()
    fixed = run_analysis(tmp_path, out=tmp_path / "fixed", figures=False).table
    assert fixed.loc["clip", "d_test"] in ("paired t", "Welch t") and "anytime-valid" not in fixed.attrs["caption"]


@pytest.mark.parametrize("arg, message", [
    ("seed=0,1", "error: hydra/sweeper=sequential chooses the seeds itself"),
    ("hydra.sweeper.alpha=2", "error: hydra/sweeper=sequential: bad alpha=2.0 (must be in (0, 1))"),
    ("hydra.sweeper.phi=abc", "error: hydra.sweeper.phi='abc': must be a number (float)"),
    ("hydra.sweeper.round_seeds=0", "error: hydra.sweeper.round_seeds=0: must be >= 1, or null"),
    ("hydra.sweeper.round_seeds=abc", "error: hydra.sweeper.round_seeds='abc': must be a whole number"),
    ("hydra.sweeper.first_seeds=2.5", "error: hydra.sweeper.first_seeds=2.5: must be a whole number"),
    ("hydra.sweeper.margin=nan", "error: hydra.sweeper.margin=nan: must be a finite number"),
])
def test_run_py_refuses_a_bad_sequential_sweep_in_one_line_before_anything_is_written(tmp_path, arg, message):
    out = subprocess.run([sys.executable, "run.py", "-m", "fixes=grpo,clip", "hydra/sweeper=sequential", arg,
                          f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr[-2000:]
    assert out.stderr.startswith(message), out.stderr[-2000:]
    assert not (tmp_path / "sweep").exists()


def test_run_py_refuses_a_rerun_under_another_rule_in_one_line_naming_the_recorded_rule(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    ss.write_record(sweep, ss.Rule(), [{"round": 1, "seeds": {"fixes=clip": [0, 1, 2], "fixes=grpo": [0, 1, 2]},
                                        "comparisons": []}], done=True)
    before = {p.name: p.read_bytes() for p in sweep.iterdir()}
    out = subprocess.run([sys.executable, "run.py", "-m", "fixes=grpo,clip", "hydra/sweeper=sequential",
                          "hydra.sweeper.margin=40", f"hydra.sweep.dir={sweep}"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr[-2000:]
    assert out.stderr.startswith(f"error: hydra/sweeper=sequential: {sweep / ss.RECORD} records a decision under "
                                 "another rule (margin: 5.0 -> 40.0)"), out.stderr
    assert {p.name: p.read_bytes() for p in sweep.iterdir()} == before


def test_the_one_mean_case_of_the_regression_form_is_the_paired_sequence():
    from dapo_exp.analysis import sequential as seq

    n = np.arange(2, 40)
    assert np.allclose(seq.regression_multiplier(n - 1, n, 0.05, 0.1), seq.multiplier(n, 0.05, 0.1), equal_nan=True)


def test_a_sequential_sweeps_effects_are_anytime_valid_and_say_so(tmp_path):
    """The effects of a sequential sweep (here Clip-Higher's main effect, grpo against clip) get the regression
    form's anytime-valid intervals (wider than the t intervals of the same runs), no p-values, and a note."""
    from dapo_exp.analysis.effects import fit_effects
    from dapo_exp.analysis.runs import load_runs

    effect = {"grpo": 0.0, "clip": 0.05}
    _sweeper(tmp_path, lambda p, s: 0.30 + effect[p] + _noise(p, s, 0.01), max_seeds=5).sweep(["fixes=grpo,clip"])
    data = load_runs(tmp_path)
    assert data.sequential is not None
    eff = fit_effects(data)
    anytime = eff.table.set_index("term")
    assert any("anytime-valid" in n for n in eff.notes)
    data.sequential = None
    fixed = fit_effects(data).table.set_index("term")
    est = anytime.index[anytime["status"] == "estimated"]
    assert len(est) and (anytime.loc[est, "effect"] == fixed.loc[est, "effect"]).all()
    assert ((anytime.loc[est, "hi"] - anytime.loc[est, "lo"]) > (fixed.loc[est, "hi"] - fixed.loc[est, "lo"])).all()
    assert anytime.loc[est, "p"].isna().all() and fixed.loc[est, "p"].notna().all()
