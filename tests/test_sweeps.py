"""How runs and sweeps end (issue 24), and the thread count a run picks.

- a multirun whose jobs failed finishes the others, prints their table, names the failed jobs and exits 1;
- ``sweep=../../x`` (anything outside ``multirun/``) is refused in one line before anything is written;
- a second SIGTERM ends a run with one line, not a traceback (exit 128 + 15);
- torch's thread count: ``DAPO_THREADS`` / ``OMP_NUM_THREADS`` kept, one thread for the toy, else the
  free cores; stated in the run's log.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from dapo_exp.analysis.callback import failed_jobs
from dapo_exp.config import ConfigError
from dapo_exp.hydra_setup import (
    GC_YOUNG,
    SMALL_MODEL_PARAMS,
    check_repeated_overrides,
    check_sweep_name,
    choose_threads,
    compose_config,
    model_params_estimate,
    set_gc,
)

REPO = Path(__file__).resolve().parents[1]


def load_run_py():
    spec = importlib.util.spec_from_file_location("run_py", REPO / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- #
# sweep names                                                                   #
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("arg", ["sweep=clip_vs_grpo", "sweep=study/a", "sweep='fixes=grpo,clip+seed=0,1'",
                                 "seed=0", "hydra.sweep.dir=/tmp/elsewhere"])
def test_sweep_names_inside_the_root_are_accepted(arg):
    check_sweep_name(["-m", arg])


@pytest.mark.parametrize("arg", ["sweep=../../x", "sweep=..", "sweep=/tmp/x", "+sweep=a/../../b", "sweep=ok,../x",
                                 "sweep=''", "sweep=~/x", "sweep=a/../b"])
def test_sweep_names_leaving_the_root_are_refused(arg):
    with pytest.raises(ConfigError, match=r"must stay inside multirun/ .*hydra.sweep.dir"):
        check_sweep_name(["-m", "seed=0,1", arg])


def test_a_sweep_name_is_checked_as_resolved(monkeypatch):
    """``sweep=${oc.env:SW}`` is checked as the folder Hydra would write, not as its literal text."""
    monkeypatch.setenv("SW", "../../x")
    with pytest.raises(ConfigError, match=r"sweep=../../x: a sweep name must stay inside multirun/"):
        check_sweep_name(["-m", "seed=0", "sweep=${oc.env:SW}"])
    monkeypatch.setenv("SW", "study/a")
    check_sweep_name(["-m", "seed=0", "sweep=${oc.env:SW}"])
    check_sweep_name(["-m", "seed=0", "sweep=study_${now:%Y}"])  # Hydra's resolvers too
    monkeypatch.delenv("SW")
    with pytest.raises(ConfigError, match=r"cannot resolve it before the sweep starts"):
        check_sweep_name(["-m", "seed=0", "sweep=${oc.env:SW}"])


def test_run_py_refuses_an_escaping_sweep_in_one_line_writing_nothing():
    name = f"escape_{uuid.uuid4().hex[:8]}"
    out = subprocess.run([sys.executable, "run.py", "-m", f"sweep=../../{name}", "seed=0,1", "logger=none"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [
        f"error: sweep=../../{name}: a sweep name must stay inside multirun/ (a relative name without '..', "
        "e.g. sweep=clip_vs_grpo); to write a sweep elsewhere set hydra.sweep.dir=<dir>"]
    assert not (REPO.parent / name).exists() and not (REPO / "multirun" / ".." / ".." / name).exists()


@pytest.mark.parametrize("argv", [["fixes=gspo", "fixes=cispo"], ["-m", "seed=0,1", "experiment=toy_fast",
                                                                   "+experiment=toy_clip"], ["fixes=full", "~fixes"]])
def test_fixes_or_experiment_given_twice_is_refused_naming_both(argv):
    """Issue 34: ``fixes=gspo fixes=cispo`` trained cispo without a word (Hydra keeps the last one)."""
    key = argv[-1].lstrip("+~").partition("=")[0]
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}= is given twice on the command line"):
        check_repeated_overrides(argv)
    check_repeated_overrides(["-m", "fixes=gspo,cispo", "seed=0", "--cfg", "job"])  # once each: fine
    # other keys: the last one wins, as the sweep scripts' "$@" after their own settings relies on
    check_repeated_overrides(["-m", "hydra/launcher=parallel", "fixes=grpo", "hydra/launcher=basic", "seed=0", "seed=1"])


def test_run_py_refuses_a_repeated_fixes_in_one_line():
    out = subprocess.run([sys.executable, "run.py", "fixes=gspo", "fixes=cispo", "logger=none"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [
        "error: fixes= is given twice on the command line (fixes=gspo, fixes=cispo): Hydra would keep the last "
        "one silently. Give it once (to sweep over both: fixes=<a>,<b> with -m)"]


# --------------------------------------------------------------------------- #
# failed jobs                                                                   #
# --------------------------------------------------------------------------- #
def test_failed_jobs_are_this_sweeps_failures_only(tmp_path):
    def job(name, status, mtime=None):
        (tmp_path / name).mkdir()
        path = tmp_path / name / "summary.json"
        path.write_text(json.dumps({"status": status, "error": "ValueError: bad\n value"}))
        if mtime is not None:
            os.utime(path, (mtime, mtime))

    start = time.time()
    job("old_failure", "failed", mtime=start - 3600)  # an earlier run of the same sweep directory
    job("finished", "finished")
    job("failed_now", "failed")
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "summary.json").write_text("{")
    assert failed_jobs(str(tmp_path), start) == [(str(tmp_path / "failed_now"), "ValueError: bad value")]
    assert len(failed_jobs(str(tmp_path), 0.0)) == 2


@pytest.mark.slow
def test_a_sweep_with_a_failed_job_finishes_the_others_prints_the_table_and_exits_1(tmp_path, warm_cache):
    """rollout.n=1 fails in validation (train.mini_batch_size=8 does not divide its 4 rollouts); rollout.n=4 trains."""
    from helpers import NO_FIGURES, SMALL

    small = [a for a in SMALL if not a.startswith("rollout.n=")]
    args = [sys.executable, "run.py", "-m", "fixes=full", "rollout.n=1,4", "seed=0", f"hydra.sweep.dir={tmp_path}",
            NO_FIGURES, *small, f"model.cache_dir={warm_cache}"]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "DAPO_THREADS")}
    out = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-3000:]
    statuses = {p.parent.name: json.loads(p.read_text())["status"] for p in tmp_path.glob("*/summary.json")}
    assert sorted(statuses.values()) == ["failed", "finished"], statuses
    assert "[analysis]" in out.stdout and "1 job(s) of this sweep FAILED" in out.stdout  # the table, then them
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: 1 job(s) of the sweep failed, 1 finished: ") and "rollout.n=1" in last
    logs = [p.read_text() for p in tmp_path.glob("*/run.log")]
    assert len(logs) == 2 and all("[run][INFO] - torch threads: 1 (a small model (0.3" in t for t in logs), logs


def _line_with(proc: subprocess.Popen, text: str, timeout: float) -> list[str]:
    """The stderr lines of ``proc`` up to the first holding ``text`` (fails after ``timeout`` s)."""
    import selectors

    sel, lines, deadline = selectors.DefaultSelector(), [], time.monotonic() + timeout
    sel.register(proc.stderr, selectors.EVENT_READ)
    while time.monotonic() < deadline:
        if sel.select(timeout=1.0):
            lines.append(proc.stderr.readline())
            if text in lines[-1] or not lines[-1]:
                break
    assert lines and text in lines[-1], "".join(lines)[-3000:]
    return lines


@pytest.mark.slow
def test_the_same_sweep_started_twice_at_once_trains_each_run_once_and_both_succeed(tmp_path, warm_cache):
    """The second command meets the job the first is running (held there, stopped, until the second says it
    waits): it waits for it, then finds the run finished and skips it; both commands exit 0 with the table,
    and the run is trained once (issue 34, item 8)."""
    from helpers import NO_FIGURES, SMALL

    args = [sys.executable, "run.py", "-m", "seed=0", f"hydra.sweep.dir={tmp_path}",
            NO_FIGURES, *SMALL, f"model.cache_dir={warm_cache}"]
    first = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not list(tmp_path.glob("*/metrics.jsonl")) and time.monotonic() < deadline:  # its job trains
        assert first.poll() is None, first.communicate()[1][-2000:]
        time.sleep(0.05)
    os.kill(first.pid, signal.SIGSTOP)  # holding the run's lock
    try:
        second = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        said = _line_with(second, "waiting for it to end", timeout=300)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert f"is in use by pid {first.pid}" in said[-1]
    out_first, err_first = first.communicate(timeout=600)
    out_second, err_second = second.communicate(timeout=600)
    assert first.returncode == 0, err_first[-3000:]
    assert second.returncode == 0, err_second[-3000:]
    assert "already finished; skipping" in out_second
    assert "[analysis]" in out_first and "[analysis]" in out_second
    (summary,) = [json.loads(p.read_text()) for p in tmp_path.glob("*/summary.json")]
    assert summary["status"] == "finished"
    (metrics,) = tmp_path.glob("*/metrics.jsonl")
    keys = [(r["step"], "reward/mean" in r) for r in map(json.loads, metrics.read_text().splitlines())]
    assert len(keys) == len(set(keys))  # each step logged once: trained once
    assert (tmp_path / "analysis" / "table.md").is_file()


# --------------------------------------------------------------------------- #
# a second signal                                                               #
# --------------------------------------------------------------------------- #
def test_a_second_signal_is_one_line_with_the_signals_exit_code(capsys):
    run_py = load_run_py()
    assert run_py.interrupted(KeyboardInterrupt("second signal (SIGTERM): stopping at once")) == 143
    assert capsys.readouterr().err.strip().splitlines() == [
        "[dapo-exp] stopped at once by a second SIGTERM: a run under way is recorded as failed with its "
        "checkpoints kept; re-run the same command to resume"]
    assert run_py.interrupted(KeyboardInterrupt()) == 130  # Ctrl-C before the loop


@pytest.mark.slow
def test_sigterm_twice_ends_the_run_with_one_line(tmp_path, warm_cache):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "run.py", "logger=none", "train.steps=500", "checkpoint.every=100",
           f"model.cache_dir={warm_cache}", f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (run_dir / "metrics.jsonl").is_file() and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    for line in proc.stdout:  # the first signal's handler has run: the second one is a second one
        if "SIGTERM: stopping after this step" in line:
            break
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith(
        "[dapo-exp] stopped at once by a second SIGTERM"), err[-3000:]
    assert len(err.strip().splitlines()) <= 3, err
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"


# --------------------------------------------------------------------------- #
# threads                                                                       #
# --------------------------------------------------------------------------- #
def test_the_toys_size_is_estimated_and_small():
    params = model_params_estimate(compose_config([]).model)
    assert 300_000 < params < 360_000 and params < SMALL_MODEL_PARAMS  # the toy's ~0.33M parameters
    assert model_params_estimate(compose_config(["model=qwen2.5-0.5b"]).model) is None


@pytest.mark.parametrize("params, cores, load, env, expected", [
    (330_000, 16, 0.0, {}, 1),  # the toy: one thread however many cores
    (None, 16, 0.2, {}, 16),  # a real model on an idle machine: every core
    (None, 16, 9.6, {}, 6),  # ... on a busy one: the free cores
    (None, 2, 7.0, {}, 1),  # never below one
    (None, 4, None, {}, 4),  # no load average
    (330_000, 16, 0.0, {"OMP_NUM_THREADS": "4"}, 4),  # the user's (or the parallel launcher's) count
    (330_000, 16, 0.0, {"OMP_NUM_THREADS": ""}, 1),  # empty: unset
    (None, 16, 0.0, {"DAPO_THREADS": "3", "OMP_NUM_THREADS": "4"}, 3),  # DAPO_THREADS first
])
def test_choose_threads(params, cores, load, env, expected):
    n, why = choose_threads(params, cores, load, env)
    assert n == expected and why


@pytest.mark.parametrize("env, recorded, expected, said", [
    ({"OMP_NUM_THREADS": "2"}, 1, 1, "the count this run started with, kept on resume"),  # the launcher offers 2
    ({}, 4, 4, "the count this run started with"),  # a toy that would get 1 resumes with its own 4
    ({"DAPO_THREADS": "3", "OMP_NUM_THREADS": "2"}, 1, 3, "the run started with 1: its numbers will differ"),
    ({"OMP_NUM_THREADS": "2"}, None, 2, "OMP_NUM_THREADS=2"),  # nothing to resume: the launcher's count
])
def test_a_resumed_run_keeps_its_thread_count_unless_dapo_threads_says_otherwise(env, recorded, expected, said):
    n, why = choose_threads(330_000, 2, 0.0, env, recorded=recorded)
    assert n == expected and said in why, why


def test_a_bad_thread_count_is_refused():
    with pytest.raises(ConfigError, match="DAPO_THREADS=0: must be a positive integer"):
        choose_threads(None, 2, 0.0, {"DAPO_THREADS": "0"})


def test_set_gc_raises_the_collectors_young_threshold_and_keeps_a_higher_one():
    import gc

    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)  # CPython 3.11's default
        set_gc()
        assert gc.get_threshold() == (GC_YOUNG, 10, 10)
        gc.set_threshold(50_000, 5, 7)  # a user's own, higher: kept
        set_gc()
        assert gc.get_threshold() == (50_000, 5, 7)
    finally:
        gc.set_threshold(*saved)


def test_run_py_sets_the_collectors_threshold_before_it_composes(tmp_path):
    """``python run.py`` (here ``--cfg job``: composed and printed, nothing trained) raises the threshold in its
    ``__main__`` block, before the launch check's composition."""
    code = ("import gc, runpy, sys\nsys.argv = ['run.py', '--cfg', 'job', 'logger=none']\n"
            "import run_py_probe\n"  # the module below: the threshold once the launch check composes
            "try:\n    runpy.run_path('run.py', run_name='__main__')\nfinally:\n"
            "    print('at compose', run_py_probe.SEEN, 'at exit', gc.get_threshold()[0])\n")
    probe = ("import gc\nimport dapo_exp.preflight as p\nSEEN = []\n_pre = p.precheck\n"
             "def precheck(*a, **k):\n    SEEN.append(gc.get_threshold()[0])\n    return _pre(*a, **k)\n"
             "p.precheck = precheck\n")
    (tmp_path / "run_py_probe.py").write_text(probe)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])})
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"at compose [{GC_YOUNG}] at exit {GC_YOUNG}" in out.stdout, out.stdout[-500:]


# --------------------------------------------------------------------------- #
# a sweep without seed= runs the default seeds                                  #
# --------------------------------------------------------------------------- #
def _multirun_config(launcher: list[str], task_overrides: list[str]):
    """The config a multirun's callback sees: composed with ``launcher``, the command line in
    ``hydra.overrides.task`` (compose itself refuses sweep overrides)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    from dapo_exp.hydra_setup import CONFIG_DIR, register_resolvers

    register_resolvers()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("config", overrides=launcher, return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.overrides.task = task_overrides
    return cfg


def test_launch_plan_counts_the_default_seeds_and_estimates_the_toys_wall_time():
    from dapo_exp.analysis.callback import launch_plan, sweep_jobs

    headline = _multirun_config([], ["fixes=grpo,clip,clip_ds,full"])
    jobs = sweep_jobs(headline)
    assert len(jobs) == 20 and {o for j in jobs for o in j if o.startswith("seed=")} == {f"seed={i}" for i in range(5)}
    line = launch_plan(headline, cores=2, load=0.0)
    assert line.startswith("[sweep] 20 runs: 4 configuration(s) x 5 seed(s) (seed= not given")
    # 64 prompts: 3.4x a fast run
    assert "expected wall time 28-40 min for 20 run(s), 1 at a time on 2 core(s) at load 0.0: 2 free" in line
    assert "; 5 seeds per arm detect about 5 points of final accuracy at power 0.8 on the toy; " in line
    # the launch line says what the regime can show (issue 33, item 4)
    assert line.endswith("; on this regime no DAPO fix has the job the paper gives it, so a rung shows what a fix "
                         "costs or breaks, not the benefit the paper reports (experiment=toy_dapo gives each fix its job)")
    assert "seeds detect 5)" not in line  # not "5 seeds detect about 5 points ... (5 seeds detect 5)"
    given = launch_plan(_multirun_config([], ["fixes=grpo,clip", "seed=0,1"]), cores=2, load=0.0)
    assert given.startswith("[sweep] 4 runs: 2 configuration(s) x 2 seed(s) (seed= given)")
    parallel = launch_plan(_multirun_config(["hydra/launcher=parallel", "hydra.launcher.jobs=2"],
                                            ["fixes=grpo", "hydra/launcher=parallel", "hydra.launcher.jobs=2"]),
                           cores=2, load=0.0)
    assert "5 runs" in parallel and "2 at a time" in parallel and "expected wall time 4-6 min" in parallel
    fast = launch_plan(_multirun_config(["experiment=toy_fast"], ["experiment=toy_fast", "fixes=grpo,clip"]),
                       cores=2, load=0.0)
    assert "10 runs" in fast and "expected wall time 4-6 min" in fast
    assert ("5 seeds per arm detect about 7 points of the mean accuracy of the last 3 evaluations at power 0.8 on "
            "the toy (8 seeds detect 5)") in fast
    clip = launch_plan(_multirun_config(["experiment=toy_clip"], ["experiment=toy_clip", "fixes=grpo,clip"]))
    assert "of the last 3 evaluations (at experiment=toy_fast's spread)" in clip and "on this regime" not in clip
    dapo = launch_plan(_multirun_config(["experiment=toy_dapo"], ["experiment=toy_dapo", "fixes=grpo,clip"]))
    assert dapo.endswith("; on this regime each DAPO fix has its job in the same run: each rung's mechanism metric "
                         "says whether the fix did it (docs/explanation/testbed.md)")
    fast_final = launch_plan(_multirun_config(["experiment=toy_fast", "eval.endpoint=final"], []))
    assert "detect about 13 points of final accuracy at power 0.8" in fast_final
    from dapo_exp.analysis.callback import default_regime

    assert default_regime(_multirun_config([], []))
    assert not default_regime(_multirun_config(["experiment=toy_clip"], []))  # another regime's warm start
    big = ["train.prompts_per_step=64", "train.mini_batch_size=128", "task.arith_n_eval=256", "eval.problems=64",
           "eval.final_problems=256", "eval.final_samples=8"]
    assert not default_regime(_multirun_config(["experiment=toy_clip", *big], []))  # with the default's sizes too
    assert not default_regime(_multirun_config(["task.arith_n_eval=64"], []))  # a 64 x 8 final evaluation
    assert not default_regime(_multirun_config(["train.mini_batch_size=32"], []))
    hub = launch_plan(_multirun_config(["model.path=some/model"], ["model.path=some/model", "fixes=grpo,full"]))
    assert hub.startswith("[sweep] 10 runs") and "wall time" not in hub and "GPU-hours" not in hub  # no estimate


def test_the_toys_estimate_is_the_machines_its_cores_less_their_load():
    """Runs share the cores with the load already there: each of k runs gets cores / (load + k) of a core."""
    from dapo_exp.analysis.callback import launch_plan

    cfg = _multirun_config(["hydra/launcher=parallel"], ["hydra/launcher=parallel", "fixes=grpo,clip,clip_ds,full"])
    idle = launch_plan(cfg, cores=2, load=0.0)
    assert "expected wall time 14-20 min for 20 run(s), 2 at a time on 2 core(s) at load 0.0: 2 free;" in idle
    busy = launch_plan(cfg, cores=2, load=4.0)  # the load: 50 min measured, against 14-20 said
    assert "expected wall time 43-60 min for 20 run(s), 2 at a time on 2 core(s) at load 4.0: 1 free, so 3.0x " \
           "slower than on idle cores;" in busy
    big = launch_plan(cfg, cores=16, load=4.0)  # 16 cores: 16 runs at once, 12 cores free
    assert "16 at a time on 16 core(s) at load 4.0: 12 free, so 1.2x slower" in big
    unknown = launch_plan(cfg, cores=2, load=None)
    assert "2 core(s), load unknown: as if idle" in unknown and "14-20 min" in unknown


def _finish(cfg, jobs, status="finished"):
    from dapo_exp.analysis.callback import job_dir

    for job in jobs:
        d = job_dir(cfg, job)
        d.mkdir(parents=True, exist_ok=True)
        (d / "summary.json").write_text(json.dumps({"status": status}))


def test_a_resumed_sweep_counts_and_costs_only_the_runs_left(tmp_path):
    from dapo_exp.analysis.callback import launch_plan, sweep_jobs

    cfg = _multirun_config([f"hydra.sweep.dir={tmp_path}", "hydra/launcher=parallel"],
                           ["hydra/launcher=parallel", "fixes=grpo,clip,clip_ds,full", "sweep='fixes=grpo,clip'"])
    jobs = sweep_jobs(cfg)
    _finish(cfg, jobs[:12])
    _finish(cfg, jobs[12:14], status="running")  # interrupted: resumed, so counted
    line = launch_plan(cfg, cores=2, load=0.0)
    assert "[sweep] 20 runs: 4 configuration(s) x 5 seed(s)" in line
    assert "; 12 finished, 8 left to run (a re-run skips finished runs); expected wall time 6-8 min for 8 run(s)" in line
    assert (tmp_path / "fixes=grpo,seed=0" / "summary.json").is_file()  # the directories Hydra gives the jobs
    _finish(cfg, jobs)
    assert launch_plan(cfg).endswith("; 20 finished, 0 left to run (a re-run skips finished runs)")
    gpu = _multirun_config([f"hydra.sweep.dir={tmp_path / 'gpu'}", "experiment=qwen0.5b_gsm8k"],
                           ["experiment=qwen0.5b_gsm8k", "fixes=grpo,clip,clip_ds,full"])
    _finish(gpu, sweep_jobs(gpu)[:10])
    assert "10 finished, 10 left to run (a re-run skips finished runs); estimated cost ~18 GPU-hours for 10 run(s)" \
        in launch_plan(gpu)


def test_a_gpu_presets_launch_line_states_runs_seeds_and_gpu_hours():
    from dapo_exp.analysis.callback import launch_plan

    line = launch_plan(_multirun_config(["experiment=qwen0.5b_gsm8k"],
                                        ["experiment=qwen0.5b_gsm8k", "fixes=grpo,clip,clip_ds,full"]))
    assert line == (
        "[sweep] 20 runs: 4 configuration(s) x 5 seed(s) (seed= not given: experiment=qwen0.5b_gsm8k's seeds, its "
        "hydra.sweeper.params.seed; seed=0 runs one, seed=0,1,... others); estimated cost ~37 GPU-hours for 20 "
        "run(s) x 200 steps x ~33 GPU-s per step (experiment=qwen0.5b_gsm8k's arithmetic estimate, "
        "notes.gpu_s_per_step; not a measurement)")
    one = launch_plan(_multirun_config(["experiment=qwen1.5b_dapo_math"],
                                       ["experiment=qwen1.5b_dapo_math", "fixes=grpo,clip,clip_ds,full", "seed=0"]))
    assert one.startswith("[sweep] 4 runs: 4 configuration(s) x 1 seed(s) (seed= given); estimated cost ~24 GPU-hours")
    short = launch_plan(_multirun_config(["experiment=qwen0.5b_gsm8k", "train.steps=2"],
                                         ["experiment=qwen0.5b_gsm8k", "train.steps=2", "fixes=grpo", "seed=0"]))
    assert "estimated cost ~0.0 GPU-hours for 1 run(s) x 2 steps" in short  # a smoke test costs its steps
    paper = launch_plan(_multirun_config(["experiment=dapo_32b_paper"],
                                         ["experiment=dapo_32b_paper", "fixes=paper_1_grpo,paper_6_dapo"]))
    assert paper.startswith("[sweep] 2 runs: 2 configuration(s) x 1 seed(s) (seed= not given: "
                            "experiment=dapo_32b_paper's seeds") and "~130,000 GPU-hours" in paper


def test_every_model_preset_declares_its_seeds_and_its_cost_per_step():
    """A GPU preset declares GPU-seconds per step, a CPU preset of a real model (train.device: cpu) CPU-seconds;
    both declare the seeds a sweep that names none runs (the toy presets take the root config's)."""
    from omegaconf import OmegaConf

    from dapo_exp.hydra_setup import CONFIG_DIR

    for path in sorted(Path(CONFIG_DIR, "experiment").glob("*.yaml")):
        if path.stem.startswith("toy_"):
            continue
        preset = OmegaConf.load(path)
        assert OmegaConf.select(preset, "hydra.sweeper.params.seed") is not None, path.name
        key = "notes.cpu_s_per_step" if OmegaConf.select(preset, "train.device") == "cpu" else "notes.gpu_s_per_step"
        assert float(OmegaConf.select(preset, key)) > 0, (path.name, key)


def test_a_costly_sweep_on_default_seeds_is_refused_and_named_seeds_are_not(tmp_path):
    from dapo_exp.analysis.callback import cost_refusal, sweep_jobs

    math = ["experiment=qwen1.5b_dapo_math", f"hydra.sweep.dir={tmp_path}"]
    ablation = ["experiment=qwen1.5b_dapo_math", "fixes=grpo,clip,clip_ds,full"]
    why = cost_refusal(_multirun_config(math, ablation))
    assert why == ("this sweep is estimated at ~120 GPU-hours (20 run(s) left: 4 configuration(s) x 5 seed(s) a "
                   "default chose), over 100 GPU-hours: name the seeds on the command line to launch it, "
                   "seed=0,1,2,3,4 for these 5 or seed=0 for one (~24 GPU-hours)")
    assert cost_refusal(_multirun_config(math, [*ablation, "seed=0,1,2,3,4"])) is None  # named: the user chose
    assert cost_refusal(_multirun_config([*math, "backend.dry_run=true"], ablation)) is None  # launches nothing
    assert cost_refusal(_multirun_config(["experiment=qwen0.5b_gsm8k"], ["experiment=qwen0.5b_gsm8k",
                                                                         "fixes=grpo,clip,clip_ds,full"])) is None
    # the paper's preset runs one seed by default: nothing multiplied behind the command's back
    assert cost_refusal(_multirun_config(["experiment=dapo_32b_paper"], ["experiment=dapo_32b_paper",
                                                                         "fixes=paper_1_grpo,paper_6_dapo"])) is None
    cfg = _multirun_config(math, ablation)
    _finish(cfg, sweep_jobs(cfg)[:4])  # 16 left, ~96 GPU-hours: under the threshold
    assert cost_refusal(cfg) is None


def test_run_py_refuses_a_costly_sweep_in_one_line_before_anything_starts(tmp_path):
    out = subprocess.run([sys.executable, str(REPO / "run.py"), "-m", "experiment=qwen1.5b_dapo_math",
                          "fixes=grpo,clip,clip_ds,full", "logger=none"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [
        "error: this sweep is estimated at ~120 GPU-hours (20 run(s) left: 4 configuration(s) x 5 seed(s) a default "
        "chose), over 100 GPU-hours: name the seeds on the command line to launch it, seed=0,1,2,3,4 for these 5 or "
        "seed=0 for one (~24 GPU-hours)"]
    assert not (tmp_path / "multirun").exists() and out.stdout == ""


def test_precheck_refuses_a_config_error_of_every_job_and_lets_one_jobs_failure_through():
    from dapo_exp.hydra_setup import CONFIG_DIR
    from dapo_exp.preflight import precheck

    with pytest.raises(ConfigError, match="train.steps: must be >= 0"):
        precheck(["train.steps=-1"], CONFIG_DIR)
    with pytest.raises(ConfigError, match="train.steps: must be >= 0"):
        precheck(["-m", "fixes=grpo,clip", "train.steps=-1"], CONFIG_DIR)
    # rollout.n=1 fails validation, rollout.n=4 trains: the sweep runs, the one job fails and is recorded
    precheck(["-m", "fixes=full", "rollout.n=1,4", "train.mini_batch_size=8", "train.micro_batch_size=4",
              "train.prompts_per_step=4"], CONFIG_DIR)
    precheck(["--cfg", "job", "algo.clip_hgih=1"], CONFIG_DIR)  # a flag: Hydra's, as before
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException):  # an unknown option in one job: refused
        precheck(["-m", "fixes=grpo,ful"], CONFIG_DIR)


