"""Benchmark: a toy run on a busy machine (not a test: it takes minutes and measures this machine).

The run is the fast regime's (``experiment=toy_fast``: 16 prompts per step, the toy's former default,
which the acceptance figures below and the committed results were measured on); the default, 64
prompts per step, takes about 3.3x as long: ``--regime default`` measures it.

    python -m dapo_exp.benchmarks.busy_machine            # on a quiet machine; ~10 minutes
    python -m dapo_exp.benchmarks.busy_machine --quick    # a smoke run at minimal size (seconds, not figures)

What it measures, each figure printed with the machine's load averages (1, 5 and 15 minutes, as
``uptime`` shows them) beside it:

1. **quiet**: the run's rollout step (``python run.py experiment=toy_fast train.steps=<steps>``, without
   ``experiment=`` under ``--regime default``), the median of its
   ``timing_s/step`` values in ``metrics.jsonl`` (a warm start, when the cache lacks one, is not in
   them);
2. **busy**: the same with another load on the machine. The benchmark starts ``--busy`` processes of
   its own (default: twice the cores, at least 4), each a pure-Python busy loop
   (``while True: pass``), in a session of their own as another program's work would be
   (``--busy-session same``: in the benchmark's session, where under the kernel's autogroup
   scheduling every thread competes with the run's, the worst case), waits until the 1-minute load average reaches ``--target-load`` (default 4,
   at most ``--settle-s`` seconds), and measures the same step under that load;
3. the ratio busy / quiet of the step time;
4. **cold under load**: the wall time of the whole run (``python run.py experiment=toy_fast``) from an empty
   warm-start cache, still under the busy processes: the fast regime starts from the warm start
   shipped with the package, so nothing is built (``--build-warmstart``: with
   ``model.warmstart_source=build``, the warm start built in the run, as before it shipped).

The runs get the caller's environment without ``OMP_NUM_THREADS`` and ``DAPO_THREADS`` (``--keep-threads``
keeps them), so that what is measured is the thread count a run picks by itself; the line ``torch
threads: ...`` of each run is printed. The busy processes are stopped (by their pids) at the end,
whatever happens. The exit status is 1 when a full run misses the acceptance figures (step ratio at
most :data:`MAX_RATIO`, cold run under :data:`COLD_BUDGET_S` seconds), 0 otherwise and with
``--quick``. The quiet figure is only a baseline when the machine is quiet: a 1-minute load above 1
at its start is said in a warning line.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dapo_exp.benchmarks import SHRUNKEN_TOY

ROOT = Path(__file__).resolve().parents[2]
MAX_RATIO = 2.0  # busy step / quiet step
COLD_BUDGET_S = 300.0  # the cold run under load
REGIMES = {"fast": ["experiment=toy_fast"], "default": []}  # --regime: the run measured
THREAD_VARS = ("OMP_NUM_THREADS", "DAPO_THREADS")
# --quick: the shrunken toy (4 prompts x 4 responses), 2 steps; a 5-step warm start
QUICK = ["logger=none", *SHRUNKEN_TOY]


def load_text() -> str:
    """The load averages as ``uptime`` prints them (1, 5, 15 minutes)."""
    return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def run_env(keep_threads: bool) -> dict[str, str]:
    env = dict(os.environ)
    if not keep_threads:
        for var in THREAD_VARS:
            env.pop(var, None)
    return env


def run(overrides: list[str], out_dir: Path, env: dict[str, str]) -> tuple[float, str]:
    """``python run.py <overrides> hydra.run.dir=<out_dir>``; returns (wall seconds, its output). Raises
    with the output's tail when it fails."""
    cmd = [sys.executable, "run.py", *overrides, f"hydra.run.dir={out_dir}"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{out[-3000:]}")
    return wall, out


def step_times(run_dir: Path) -> list[float]:
    """The ``timing_s/step`` of each training row of the run's ``metrics.jsonl``."""
    from dapo_exp import rundir

    return [float(r["timing_s/step"]) for r in rundir.read_jsonl(run_dir / rundir.METRICS) if "timing_s/step" in r]


def threads_line(output: str) -> str:
    found = re.search(r"torch threads: .*", output)
    return found.group(0) if found else "torch threads: (not logged)"


def start_busy(n: int, own_session: bool = True, nice: int = 0) -> list[subprocess.Popen]:
    """``n`` busy-loop processes (pure Python, one core each). ``own_session``: in a session of their own,
    as another program or user's work runs; else in the benchmark's session, beside its runs. ``nice``:
    their niceness (``--quick``: 19, so that a smoke run in a test suite takes next to no CPU from it). With
    the kernel's autogroup scheduling a session of its own is a scheduling group of its own, shared against the
    other sessions before any process's nice counts: ``os.nice`` alone would leave such a loop a whole core
    of two (measured: 9.96 CPU-s in 10 s beside two nice-0 loops), so the group's nice is set too
    (``/proc/self/autogroup``; measured after: 0.45 CPU-s in 10 s)."""
    group = f"try: open('/proc/self/autogroup', 'w').write('{nice}')\nexcept OSError: pass\n" if own_session else ""
    code = f"import os; os.nice({nice})\n{group}while True: pass" if nice else "while True: pass"
    return [subprocess.Popen([sys.executable, "-c", code], start_new_session=own_session) for _ in range(n)]


def autogroup() -> str:
    """Whether the kernel shares the CPU between sessions before threads (``sched_autogroup``)."""
    try:
        on = Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        return "kernel autogroup scheduling: unknown"
    return f"kernel autogroup scheduling: {'on' if on else 'off'}"


def stop_busy(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def wait_for_load(target: float, settle_s: float) -> float:
    """Wait until the 1-minute load average reaches ``target`` (at most ``settle_s`` seconds); returns it."""
    deadline = time.monotonic() + settle_s
    while os.getloadavg()[0] < target and time.monotonic() < deadline:
        time.sleep(2)
    return os.getloadavg()[0]


def say(text: str) -> None:
    print(f"[busy_machine] {text}", flush=True)


def measure_steps(name: str, overrides: list[str], out_dir: Path, env: dict[str, str]) -> float:
    """One step-time run: prints its median step with the load averages before and after; returns it."""
    before = load_text()
    _, out = run(overrides, out_dir, env)
    times = step_times(out_dir)
    if not times:
        raise RuntimeError(f"{out_dir}: no timing_s/step in metrics.jsonl")
    median = statistics.median(times)
    say(f"{name}: rollout step {median:.2f} s (median of {len(times)} steps; {threads_line(out)}); "
        f"{before} before, {load_text()} after")
    return median


def _parser(cores: int) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m dapo_exp.benchmarks.busy_machine", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="minimal sizes, no waiting for the load: a smoke run")
    ap.add_argument("--steps", type=int, default=None, help="rollout steps of the step-time runs (default 8; quick 2)")
    ap.add_argument("--busy", type=int, default=None,
                    help=f"busy-loop processes (default max(4, 2 x cores) = {max(4, 2 * cores)}; quick 1, at nice 19)")
    ap.add_argument("--target-load", type=float, default=4.0, help="1-minute load average to wait for (default 4)")
    ap.add_argument("--settle-s", type=float, default=None, help="longest wait for that load (default 180; quick 0)")
    ap.add_argument("--cache-dir", default=None,
                    help="warm-start cache of the step-time runs (default: the model's, ~/.cache/dapo_exp/warmstart)")
    ap.add_argument("--build-warmstart", action="store_true",
                    help="the cold run builds its warm start (model.warmstart_source=build) instead of the shipped one")
    ap.add_argument("--keep-threads", action="store_true", help=f"pass {' and '.join(THREAD_VARS)} to the runs")
    ap.add_argument("--busy-session", choices=("own", "same"), default="own",
                    help="the busy loops in a session of their own, as another program's work (default), or in "
                         "the benchmark's session, competing thread by thread with the runs (the worst case)")
    ap.add_argument("--regime", choices=sorted(REGIMES), default="fast",
                    help="fast: experiment=toy_fast (default; the acceptance figures' regime) | default: the defaults")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    return ap


def main(argv: list[str] | None = None) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    args = _parser(cores).parse_args(argv)
    steps = args.steps or (2 if args.quick else 8)
    n_busy = args.busy if args.busy is not None else (1 if args.quick else max(4, 2 * cores))
    settle = args.settle_s if args.settle_s is not None else (0.0 if args.quick else 180.0)
    base = [*REGIMES[args.regime], *(QUICK if args.quick else []), *args.overrides]
    step_run = [*base, f"train.steps={steps}", "checkpoint.every=0"]
    if args.cache_dir:
        step_run.append(f"model.cache_dir={args.cache_dir}")
    # quick: a 5-step warm start learns nothing, so no dynamic sampling (it would find no group to keep)
    cold_run = [*base, *(["train.steps=2", "model.warmstart_steps=5", "fixes=grpo"] if args.quick else []),
                *(["model.warmstart_source=build"] if args.build_warmstart else [])]
    env = run_env(args.keep_threads)

    say(f"{cores} cores; {load_text()} at the start" + (" (quick: minimal sizes, figures not meaningful)"
                                                          if args.quick else ""))
    if os.getloadavg()[0] > 1.0 and not args.quick:
        say("warning: the machine is not quiet (1-minute load above 1): the quiet figure is not a baseline")
    with tempfile.TemporaryDirectory(prefix="busy_machine-") as tmp:
        tmp = Path(tmp)
        quiet = measure_steps("quiet", step_run, tmp / "quiet", env)
        busy_procs = start_busy(n_busy, own_session=args.busy_session == "own", nice=19 if args.quick else 0)
        # SIGTERM ends the benchmark through the finally below, so the busy loops (in their own session, a
        # signal to ours does not reach them) are stopped too
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
        try:
            load = wait_for_load(args.target_load, settle)
            say(f"{n_busy} busy-loop processes started ({args.busy_session} session; {autogroup()}"
                + ("; nice 19: --quick, not a busy machine" if args.quick else "") + "); "
                f"1-minute load {load:.2f} (target {args.target_load:g})")
            busy = measure_steps("busy", step_run, tmp / "busy", env)
            ratio = busy / quiet
            say(f"busy/quiet rollout step: {ratio:.2f} (acceptance: at most {MAX_RATIO:g}); {load_text()}")
            before = load_text()
            cold, out = run([*cold_run, f"model.cache_dir={tmp / 'cold-cache'}"], tmp / "cold", env)
            how = "its warm start built in the run" if args.build_warmstart else "the shipped warm start, or one built"
            say(f"cold run under load: {cold:.0f} s wall, {how} ({threads_line(out)}; "
                f"acceptance: under {COLD_BUDGET_S:.0f} s); {before} before, {load_text()} after")
        finally:
            stop_busy(busy_procs)
    if args.quick:
        return 0
    return 0 if ratio <= MAX_RATIO and cold < COLD_BUDGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
