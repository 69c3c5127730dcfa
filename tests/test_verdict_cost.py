"""The verdict-cost benchmark (python -m dapo_exp.benchmarks.verdict_cost): its statistics on known
numbers, and a smoke run at minimal size that prints its columns and reuses finished runs."""

import csv
import math

import numpy as np
import pytest

from dapo_exp.benchmarks import verdict_cost as vc

HEADER = ("| setting | fix | metric | n | sd | sd_paired | r | eval_share | n_paired | effect | agrees_with_fast "
          "| final eval s | other eval s | run s |")


def _data(shift_keyed: float):
    rng = np.random.default_rng(0)
    data = {}
    for setting, shift in (("fast", 0.0), ("keyed", shift_keyed)):
        for s in range(12):
            base = 40 + 5 * rng.standard_normal()
            for arm, eff in (("off", 0.0), ("clip_higher", 3.0 + shift)):
                acc = base + eff + rng.standard_normal()
                reps = [acc, acc + 1.0, acc - 1.0]  # within-run variance 1
                data[(setting, arm, s)] = {vc.ACC: acc, vc.LATE: acc - 1.0, "reps": reps, "diag/style_step": acc / 100,
                                           "final_eval_s": 2.0, "eval_s": 0.5, "run_s": 20.0}
    return data


def test_statistics_on_known_numbers():
    data = _data(0.0)
    rows = vc.summarise(data, ["fast", "keyed"], ["clip_higher"], delta=5.0, boot=200)
    r = next(x for x in rows if x["setting"] == "fast" and x["metric"] == vc.ACC)
    a = np.array([data[("fast", "off", s)][vc.ACC] for s in range(12)])
    b = np.array([data[("fast", "clip_higher", s)][vc.ACC] for s in range(12)])
    assert r["n"] == 12
    assert math.isclose(r["sd_paired"], np.std(b - a, ddof=1))
    late = next(x for x in rows if x["setting"] == "fast" and x["metric"] == vc.LATE)
    assert math.isclose(late["effect"], np.mean(b - a)) and late["n_paired"] == r["n_paired"]
    assert math.isclose(r["r"], np.corrcoef(a, b)[0, 1]) and r["r"] > 0.8  # the seed's shared part
    assert math.isclose(r["eval_share"], 2 * 1.0 / np.var(b - a, ddof=1))
    assert r["sd_paired_lo"] < r["sd_paired"] < r["sd_paired_hi"]
    assert r["n_paired_lo"] <= r["n_paired"] <= r["n_paired_hi"] and r["n_paired"] >= 2
    assert r["effect_lo"] < r["effect"] < r["effect_hi"]
    k = next(x for x in rows if x["setting"] == "keyed" and x["metric"] == vc.ACC)
    assert k["agrees_with_fast"] == "yes"
    moved = vc.summarise(_data(10.0), ["fast", "keyed"], ["clip_higher"], delta=5.0, boot=50)
    assert next(x for x in moved if x["setting"] == "keyed" and x["metric"] == vc.ACC)[
        "agrees_with_fast"].startswith("no")


def test_jobs_are_interleaved_and_settings_override_last(tmp_path):
    jobs = vc.jobs(runs=tmp_path, seeds=2, steps=3, repeats=1, fixes=["clip_higher"], which=["fast", "precise"],
                   quick=True)
    assert [(j.seed, j.setting, j.arm) for j in jobs[:4]] == [
        (0, "fast", "off"), (0, "fast", "clip_higher"), (0, "precise", "off"), (0, "precise", "clip_higher")]
    precise = jobs[2].overrides
    assert "task.arith_n_eval=16" in precise and "task.arith_n_eval=8" not in precise
    assert "clip_higher=enabled" in jobs[3].overrides and "seed=0" in jobs[3].overrides
    assert "train.randomness=stream" in jobs[0].overrides  # the stream sampler named, whatever the default
    big = vc.settings(quick=False)["batch2x"]  # twice the prompts per step, the same 4 updates per step
    assert "train.prompts_per_step=32" in big and "train.mini_batch_size=64" in big
    precise_sizes = {o for o in vc.settings(quick=False)["precise"] if o.startswith(("eval.", "task."))}
    assert precise_sizes <= set(big) and "eval.final_problems=512" in precise_sizes
    fast = vc.settings(quick=False)["fast"]  # the fast regime's sizes named, whatever the defaults
    assert set(vc.FAST) <= set(fast) and "train.prompts_per_step=16" in fast
    later = vc.jobs(runs=tmp_path, seeds=2, first_seed=12, steps=3, repeats=1, fixes=["clip_higher"],
                    which=["fast"], quick=True)
    assert [j.seed for j in later] == [12, 12, 13, 13] and later[0].out == tmp_path / "today" / "off" / "seed12"  # the fast runs were made as today


def test_late_mean_is_the_last_k_trained_evaluations():
    rows = [{"step": 0, "eval/acc_avg": 0.1}, {"step": 1, "reward/mean": 0.3}, {"step": 10, "eval/acc_avg": 0.5},
            {"step": 20, "eval/acc_avg": 0.7}, {"step": 30, "eval/acc_avg": 0.6}]
    assert math.isclose(vc._late_mean(rows, 2), 0.65) and math.isclose(vc._late_mean(rows, 3), 0.6)
    assert math.isnan(vc._late_mean(rows, 4))  # step 0 (the untrained policy) never counts


@pytest.mark.slow
def test_smoke_run_prints_its_columns_and_reuses_finished_runs(tmp_path, capsys):
    """The fast setting's two runs (off, clip_higher; one seed, one step) trained through ``run.py``, their
    table and CSV; a second call trains nothing; a call naming another setting adds the fast one as its
    reference (``--analyse-only`` on the same runs: the other setting's rows are printed, from no runs).
    The other setting is not trained here: its two runs through ``run.py`` were half of this test's cost (two
    more processes' imports); train.randomness=keyed trains in tests/test_keyed.py, a setting's overrides are
    tests/test_verdict_cost.py::test_jobs_are_interleaved_and_settings_override_last's, and the comparison
    with the fast setting (agrees_with_fast) is test_statistics_on_known_numbers's."""
    common = ["--quick", "--fixes", "clip_higher", "--seeds", "1", "--steps", "1", "--boot", "10", "--late-k", "1",
              "--out", str(tmp_path / "out"), "--runs", str(tmp_path / "runs")]
    argv = [*common, "--settings", "fast"]
    assert vc.main(argv) == 0
    out = capsys.readouterr().out
    assert "[verdict_cost] 2 runs (0 finished already)" in out and HEADER in out
    for metric in (vc.ACC, vc.LATE, "diag/style_step"):
        assert f"| fast | clip_higher | {metric} | 1 |" in out
    with open(tmp_path / "out" / "verdict_cost.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 3 and set(vc.COLUMNS) <= set(rows[0])
    assert vc.main(argv) == 0  # a second call trains nothing
    assert capsys.readouterr().out.count(": reused") == 2
    assert vc.main([*common, "--settings", "keyed", "--analyse-only"]) == 0  # the fast reference added
    out = capsys.readouterr().out
    assert "[verdict_cost] 4 runs (2 finished already)" in out and HEADER in out
    for metric in (vc.ACC, vc.LATE, "diag/style_step"):
        assert f"| fast | clip_higher | {metric} | 1 |" in out and f"| keyed | clip_higher | {metric} | 0 |" in out


def test_a_finished_run_is_reused_only_when_trained_from_the_same_overrides(tmp_path):
    """A finished run of other overrides (an older `today` run, a changed default) is not taken as done:
    run.py then compares the resolved configurations, reusing or refusing it."""
    import json

    job = vc.jobs(runs=tmp_path, seeds=1, steps=3, repeats=1, fixes=["clip_higher"], which=["fast"], quick=True)[0]
    (job.out / ".hydra").mkdir(parents=True)
    (job.out / "summary.json").write_text(json.dumps({"status": "finished"}))
    assert not job.done()  # no record of its overrides
    (job.out / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in reversed(job.overrides)))
    assert job.done()
    (job.out / ".hydra" / "overrides.yaml").write_text("- fixes=grpo\n- train.randomness=stream\n- seed=0\n")
    assert not job.done()
