"""Benchmark: dapo-exp's trainer against verl's, at identical work, one after another on this machine.

The work is :mod:`dapo_exp.benchmarks.vs_trl`'s (``--prompts`` x ``--responses`` responses of exactly
``--tokens`` new tokens per step, token-mean loss, clip 0.2 / 0.28, no KL, one optimizer update per step over
micro-batches of ``--micro-batch``), on the toy or on an experiment preset's model and task
(``--experiment smollm2_add2``: SmolLM2-135M-Instruct from its wheel, on its chat task):

- dapo-exp runs in this process, as ``vs_trl`` runs it (its rollout step without the loop's logging), EOS
  suppressed by ``min_new_tokens``;
- verl runs as ``python run.py backend=verl train.device=cpu`` would launch it (verl 0.9.1's trainer in
  ``.venv-verl``, vLLM's CPU build generating, FSDP2 updating; Ray and vLLM started per run), with
  ``actor_rollout_ref.rollout.ignore_eos=true`` so that every response is ``--tokens`` long, no validation
  before training, and ``--warmup`` + ``--steps`` + 1 steps: its first ``--warmup`` steps are untimed as
  dapo-exp's are, and its last is left out because it validates and checkpoints. A step's time is verl's own
  ``timing_s/step`` (generation, rewards, log-probs, advantages, the update).

Order: dapo-exp's block, verl's, dapo-exp's again (A B A), so that a drift of the machine's speed shows as a
difference between dapo-exp's two blocks. dapo-exp's responses, generated tokens and optimizer updates are
checked equal to the plan, and verl's response lengths (each exactly ``--tokens``). Printed: per-system median s/step, the ratio verl / dapo-exp (dapo-exp's median over both
its blocks), each block's median, verl's time outside its steps (start-up, closing validation), load averages
before and after, date, commit and versions.

    python -m dapo_exp.benchmarks.vs_verl --experiment smollm2_add2 --prompts 2 --responses 8 --tokens 24 \\
        --micro-batch 8 --steps 3 --warmup 1 --threads 1

verl's processes take torch's thread count from ``OMP_NUM_THREADS`` (set to ``--threads`` for the launch).
Timing figures are only worth reporting from a quiet machine. Each block's times are printed as the block
ends, the summary at the end; :mod:`dapo_exp.benchmarks.three_engines` runs this and the TRL benchmark together.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dapo_exp import rundir
from dapo_exp.benchmarks import vs_trl

ROOT = Path(__file__).resolve().parents[2]


def verl_overrides(args: argparse.Namespace, *, model_path: str, out: Path) -> list[str]:
    """``run.py``'s overrides for verl's side: dapo-exp's work (:func:`vs_trl.dapo_overrides`) on
    ``backend=verl train.device=cpu``, EOS ignored, no validation but verl's closing one, no W&B."""
    return [*vs_trl.dapo_overrides(args, model_path=model_path, out=out), f"hydra.run.dir={out}", "backend=verl",
            f"train.steps={args.warmup + args.steps + 1}", "eval.before_training=false", "eval.every=0",
            "eval.problems=null", "eval.final_problems=null", "eval.final_samples=null", "checkpoint.every=0",
            "backend.extra=['actor_rollout_ref.rollout.ignore_eos=true']"]


def verl_steps(rows: list[dict[str, Any]], *, warmup: int, steps: int) -> list[dict[str, float]]:
    """verl's timed steps from its metrics log (``verl_metrics.jsonl`` rows ``{"step", "data"}``): steps
    ``warmup + 1`` to ``warmup + steps``, each a dict of its figures; an error naming what is missing."""
    by_step = {r["step"]: r.get("data", {}) for r in rows if isinstance(r.get("step"), int)}
    wanted = range(warmup + 1, warmup + steps + 1)
    missing = [s for s in wanted if "timing_s/step" not in by_step.get(s, {})]
    if missing:
        raise AssertionError(f"verl's metrics lack timing_s/step for step(s) {missing} (logged: {sorted(by_step)})")
    return [by_step[s] for s in wanted]


def check_verl_work(args: argparse.Namespace, timed: list[dict[str, float]]) -> None:
    """Every timed verl step's responses were exactly ``tokens`` tokens long (mean, min and max)."""
    for row in timed:
        length = (row.get("response_length/mean"), row.get("response_length/min"), row.get("response_length/max"))
        if length != (args.tokens,) * 3:
            raise AssertionError(f"verl's responses were not all {args.tokens} tokens long: (mean, min, max) = "
                                 f"{length}")


def run_verl(args: argparse.Namespace, *, model_path: str, out: Path) -> tuple[list[dict[str, float]], float]:
    """verl's run (a subprocess of ``run.py``); its timed steps, and the seconds of the launch outside its
    steps (translation, export, Ray's, vLLM's and FSDP's start-up, the closing validation, the shutdown)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads or torch.get_num_threads())}
    cmd = [sys.executable, str(ROOT / "run.py"), *verl_overrides(args, model_path=model_path, out=out)]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"verl's run failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}")
    rows = rundir.read_jsonl(out / "verl_metrics.jsonl")
    timed = verl_steps(rows, warmup=args.warmup, steps=args.steps)
    check_verl_work(args, timed)
    return timed, wall - sum(r["data"]["timing_s/step"] for r in rows if "timing_s/step" in r.get("data", {}))


def run_dapo_block(args: argparse.Namespace, *, model_path: str, out: Path) -> tuple[list[float], vs_trl.Tally]:
    """A block of dapo-exp: ``--warmup`` untimed steps, then ``--steps`` timed ones, on a fresh run."""
    from dapo_exp.hydra_setup import compose_config

    tally = vs_trl.Tally()
    side = vs_trl.DapoSide(compose_config(vs_trl.dapo_overrides(args, model_path=model_path, out=out)), args.tokens,
                           tally)
    try:
        tally.warmup = side.steps(args.warmup)
        tally.counting = True
        timed = side.steps(args.steps)
    finally:
        side.close()
    tally.seconds = [timed]
    vs_trl.check_work("dapo-exp", tally, args, args.steps)
    tally.decode = side.run.engine.decode_used
    return timed, tally


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m dapo_exp.benchmarks.vs_verl", description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=3, help="timed steps per block")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first, in each block")
    ap.add_argument("--prompts", type=int, default=2, help="prompts per step")
    ap.add_argument("--responses", type=int, default=8, help="responses per prompt (the group size)")
    ap.add_argument("--tokens", type=int, default=24, help="new tokens per response, exactly")
    ap.add_argument("--micro-batch", type=int, default=8, help="responses per forward/backward pass")
    ap.add_argument("--threads", type=int, default=None, help="torch threads of both (default: torch's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache-dir", default=None, help="warm-start cache (default: model.cache_dir's)")
    ap.add_argument("--experiment", default=None, help="an experiment preset whose model and task both run "
                                                       "(smollm2_add2: the real model); default: the toy's")
    args = ap.parse_args(argv)
    args.decode, args.no_share_prompts, args.train_compile = "auto", False, False  # dapo-exp's defaults
    if min(args.steps, args.warmup, args.prompts, args.tokens, args.micro_batch) < 1:
        ap.error("--steps, --warmup, --prompts, --tokens and --micro-batch must be >= 1")
    if args.responses < 2 or (args.prompts * args.responses) % args.micro_batch:
        ap.error(f"need --responses >= 2 and --micro-batch dividing prompts x responses = "
                 f"{args.prompts * args.responses}")
    return args


def verl_versions() -> str:
    """verl's, vLLM's and torch's versions in verl's environment (``backend.python``'s default)."""
    from dapo_exp.config import BackendConfig
    from dapo_exp.preflight import resolve_python

    python = resolve_python(BackendConfig.python, must_exist=False)
    code = "import verl, vllm, torch; print(f'verl {verl.__version__}, vllm {vllm.__version__}, torch {torch.__version__}')"
    try:
        got = subprocess.run([python, "-c", code], capture_output=True, text=True)
    except OSError as e:
        return f"(versions unreadable: {e})"
    return got.stdout.strip() or f"(versions unreadable: {python} printed none)"


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    threads, before = torch.get_num_threads(), os.getloadavg()
    model_path = vs_trl.bench_model_path(args)
    fmt = " ".join
    with tempfile.TemporaryDirectory(prefix="vs_verl-") as tmp:
        # each block's figures are printed as it ends, so that a failure later loses none of them
        a1, tally = run_dapo_block(args, model_path=model_path, out=Path(tmp) / "dapo1")
        print(f"[vs_verl] dapo-exp block 1: {fmt(f'{x:.2f}' for x in a1)} s/step", flush=True)
        verl, overhead = run_verl(args, model_path=model_path, out=Path(tmp) / "verl")
        verl_s = [r["timing_s/step"] for r in verl]
        print(f"[vs_verl] verl: {fmt(f'{x:.2f}' for x in verl_s)} s/step", flush=True)
        a2, _ = run_dapo_block(args, model_path=model_path, out=Path(tmp) / "dapo2")
        print(f"[vs_verl] dapo-exp block 2: {fmt(f'{x:.2f}' for x in a2)} s/step", flush=True)
    after = os.getloadavg()
    dapo_med, verl_med = float(np.median(a1 + a2)), float(np.median(verl_s))
    print(f"# dapo-exp vs verl's trainer at identical work ({datetime.datetime.now().isoformat(timespec='seconds')})")
    print(f"commit {rundir.git_commit()}; {platform.platform()}, {os.cpu_count()} CPUs, torch threads {threads}; "
          f"dapo-exp: torch {torch.__version__}; verl's environment: {verl_versions()}")
    print(f"load average (1, 5, 15 min) before: {fmt(f'{x:.2f}' for x in before)}; after: "
          f"{fmt(f'{x:.2f}' for x in after)}")
    print(f"model and task: {args.experiment or 'the toy (model.path=tiny, task=arith)'}; work per step: "
          f"{args.prompts} prompts x {args.responses} responses x {args.tokens} new tokens, micro-batch "
          f"{args.micro_batch}, one update; {args.warmup} warm-up step(s) then {args.steps} timed, per block; order "
          f"dapo-exp, verl, dapo-exp; dapo-exp samples with rollout.decode={tally.decode}, verl with vLLM (CPU)")
    print(f"dapo-exp  blocks 1 and 2: {fmt(f'{x:.2f}' for x in a1)} | {fmt(f'{x:.2f}' for x in a2)} s; "
          f"median {dapo_med:.2f} s/step (block medians {np.median(a1):.2f}, {np.median(a2):.2f})")
    print(f"verl      steps {fmt(f'{x:.2f}' for x in verl_s)} s; median {verl_med:.2f} s/step (generation "
          f"{np.median([r.get('timing_s/gen', np.nan) for r in verl]):.2f} s, update "
          f"{np.median([r.get('timing_s/update_actor', np.nan) for r in verl]):.2f} s); outside its steps (start-up "
          f"of Ray, vLLM and FSDP, closing validation, shutdown) {overhead:.0f} s")
    print(f"ratio verl / dapo-exp (time per step, medians): {verl_med / dapo_med:.3f}")
    return {"dapo_s": a1 + a2, "verl_s": verl_s, "dapo_median_s": dapo_med, "verl_median_s": verl_med,
            "ratio": verl_med / dapo_med, "load_before": before,
            "load_after": after, "threads": threads}


if __name__ == "__main__":
    main()
