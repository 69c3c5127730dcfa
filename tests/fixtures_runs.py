"""Fabricate synthetic run directories that follow the contract of dapo_exp/rundir.py.

Used by the analysis tests and the notebook test; no model, no training. Every
value is a simple deterministic function of (preset, seed, step), and
:func:`make_run` returns the values it wrote so that a test can recompute the
table by hand.

    from fixtures_runs import make_sweep, STANDARD_SWEEP
    runs = make_sweep(tmp_path / "multirun" / "demo", STANDARD_SWEEP)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from dapo_exp import fixes, rundir
from dapo_exp.hydra_setup import preset_switches

STEPS = 6
EVAL_EVERY = 3
BATCH = 64  # rollouts trained per step (prompts_per_step 16 x n 4)

# The standard synthetic sweep: (preset, seed, final eval accuracy, status).
#   grpo       seeds 0,1,2                    -> the baseline
#   clip       seeds 0,1 finished, 2 failed   -> the failed run is excluded; Welch vs grpo
#   clip_ds    seeds 0,1,2                    -> paired difference vs grpo
#   full       seeds 0,1 finished, 2 killed   -> a seed missing (killed: no summary.json)
#   full_no_ds seed 0 only                    -> n = 1: CI n/a
STANDARD_SWEEP: list[tuple[str, int, float, str]] = [
    ("grpo", 0, 0.30, "finished"),
    ("grpo", 1, 0.34, "finished"),
    ("grpo", 2, 0.32, "finished"),
    ("clip", 0, 0.40, "finished"),
    ("clip", 1, 0.36, "finished"),
    ("clip", 2, 0.00, "failed"),
    ("clip_ds", 0, 0.41, "finished"),
    ("clip_ds", 1, 0.44, "finished"),
    ("clip_ds", 2, 0.45, "finished"),
    ("full", 0, 0.50, "finished"),
    ("full", 1, 0.46, "finished"),
    ("full", 2, 0.00, "killed"),
    ("full_no_ds", 0, 0.48, "finished"),
]

LADDER_SWEEP: list[tuple[str, int, float, str]] = [
    (name, seed, 0.30 + 0.03 * i + 0.01 * seed, "finished")
    for i, name in enumerate(
        ["paper_1_grpo", "paper_2_of", "paper_3_clip", "paper_4_sop", "paper_5_tl", "paper_6_dapo"]
    )
    for seed in (0, 1)
] + [("grpo", 0, 0.31, "finished"), ("full", 0, 0.55, "finished")]


def switches_of(preset: str) -> dict[str, bool]:
    return dict(preset_switches(preset))


def algo_of(sw: dict[str, bool]) -> dict[str, Any]:
    """``algo`` config values that give the switch states ``sw``."""
    return {
        "eps_low": 0.2,
        "eps_high": 0.28 if sw["clip_higher"] else 0.2,
        "dynamic_sampling": sw["dynamic_sampling"],
        "loss_agg": "token-mean" if sw["token_level_loss"] else "seq-mean-token-mean",
        "overlong_punishment": "soft" if sw["overlong_punishment"] else "none",
        "overlong_filtering": sw["overlong_filtering"],
        "kl_coef": 0.0,
    }


def resolved_config(preset: str, seed: int, sweep: str = "demo") -> dict[str, Any]:
    """A resolved-config-like dict whose algo values give the preset's switches."""
    return {
        "seed": seed,
        "preset": preset,
        "sweep": sweep,
        "out_dir": ".",
        "algo": algo_of(switches_of(preset)),
        "model": {"name": "tiny", "path": "tiny"},
        "task": {"name": "arith"},
        "rollout": {"engine": "hf", "n": 4, "max_response_len": 48},
        "train": {"steps": STEPS, "prompts_per_step": 16},
        "logger": {"backend": "wandb", "tags": ["synthetic", preset]},
    }


def train_line(preset: str, seed: int, step: int, cum: dict[str, float]) -> dict[str, float]:
    sw = switches_of(preset)
    rounds = 1 + (step % 2 if sw["dynamic_sampling"] else 0)
    resp_len = 20.0 + step + seed
    cum["rollouts"] += BATCH * rounds
    cum["tokens"] += BATCH * rounds * resp_len
    return {
        "step": step,
        rundir.ENTROPY: round(1.0 - 0.05 * step + 0.01 * seed + (0.1 if sw["clip_higher"] else 0.0), 6),
        rundir.RESP_LEN: resp_len,
        rundir.RESP_LEN_MAX: 48.0,
        rundir.TRUNC: round(0.01 * step, 6),
        rundir.CLIP_HIGH: round(0.001 * step * (0.5 if sw["clip_higher"] else 1.0), 6),
        rundir.CLIP_LOW: round(0.002 * step, 6),
        rundir.ZERO_VAR: round(0.1 + 0.01 * step + 0.01 * seed, 6),
        rundir.GEN_ROUNDS: float(rounds),
        rundir.ROLLOUTS_PER_TRAINED: float(rounds),
        rundir.CUM_ROLLOUTS: cum["rollouts"],
        rundir.CUM_TOKENS: cum["tokens"],
        "actor/pg_loss": 0.1 * seed - 0.01 * step,
    }


def eval_acc(final_acc: float, step: int, steps: int = STEPS, base: float = 0.1) -> float:
    return round(base + (final_acc - base) * step / steps, 6)


def _samples(step: int, acc: float, train: bool = False) -> list[dict[str, Any]]:
    out = []
    n_correct = round(acc * 8)
    for i in range(8):
        problem, sample = i // 2, i % 2
        length = 10 + 5 * i + step
        truncated = i == 7
        correct = i < n_correct and not truncated
        d = {
            "step": step,
            "problem_id": f"p{problem}",
            "sample": sample,
            "prompt": f"What is {problem} + {problem}?",
            "response": ("Let me think. " * (i + 1)) + (f"Answer: {2 * problem}" if correct else "Answer: 7"),
            "answer": str(2 * problem),
            "pred": str(2 * problem) if correct else "7",
            "correct": bool(correct),
            "length": length,
            "truncated": truncated,
        }
        if train:
            d.update({"reward": 1.0 if correct else -1.0, "group": problem})
        out.append(d)
    return out


def make_run(
    run_dir: str | Path,
    preset: str,
    seed: int,
    final_acc: float,
    status: str = "finished",
    *,
    steps: int = STEPS,
    sweep: str = "demo",
    wall_time_s: float | None = None,
    config_overrides: dict[str, Any] | None = None,
    overrides: list[str] | None = None,
) -> dict[str, Any]:
    """Write one run directory; return what was written (config, summary, history lines).

    status ``finished`` or ``failed``: a summary.json; ``killed``: no summary.json,
    metrics up to half the steps and Hydra's ``.hydra/config.yaml``.
    ``config_overrides``: dotted config keys set in the resolved config (``{"train.steps": 0}``);
    ``overrides``: the job's Hydra overrides, written to ``.hydra/overrides.yaml`` as Hydra does.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = resolved_config(preset, seed, sweep)
    for key, value in (config_overrides or {}).items():
        node = cfg
        *parents, leaf = key.split(".")
        for k in parents:
            node = node.setdefault(k, {})
        node[leaf] = value
    last = steps if status != "killed" else steps // 2
    cum = {"rollouts": 0.0, "tokens": 0.0}
    lines: list[dict[str, Any]] = []
    evals: list[dict[str, Any]] = []
    for step in range(0, last + 1):
        if step > 0:
            lines.append(train_line(preset, seed, step, cum))
        if step % EVAL_EVERY == 0 and (status == "finished" or step < last):
            acc = eval_acc(final_acc, step, steps)
            ev = {"step": step, rundir.EVAL_ACC: acc, rundir.EVAL_PASS: min(1.0, acc + 0.2)}
            evals.append(ev)
            lines.append(ev)
    with open(run_dir / rundir.METRICS, "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
    with open(run_dir / rundir.EVAL_SAMPLES, "w") as f:
        for ev in evals:
            for s in _samples(ev["step"], ev[rundir.EVAL_ACC]):
                f.write(json.dumps(s) + "\n")
    with open(run_dir / rundir.TRAIN_SAMPLES, "w") as f:
        for step in range(1, last + 1):
            for s in _samples(step, 0.5, train=True)[:4]:
                f.write(json.dumps(s) + "\n")
    (run_dir / ".hydra").mkdir(exist_ok=True)
    OmegaConf.save(OmegaConf.create(cfg), run_dir / ".hydra" / "config.yaml")
    if overrides is not None:
        OmegaConf.save(OmegaConf.create(list(overrides)), run_dir / ".hydra" / "overrides.yaml")
    summary = None
    if status != "killed":
        from dapo_exp.hydra_setup import run_label

        oc = OmegaConf.create(cfg)
        best = max(evals, key=lambda e: e[rundir.EVAL_ACC])
        summary = {
            "status": status,
            "label": run_label(oc),
            "preset": preset,
            "switches": fixes.switches(oc.algo),
            "seed": seed,
            "config": cfg,
            "git_commit": "0" * 40,
            "wall_time_s": wall_time_s if wall_time_s is not None else 100.0 + 10 * seed,
            # the machine's load at the start (and end, below), the threads and CPU the run used
            "environment": {"load_avg_1m": 0.5 + seed, "torch_threads": 1, "cpu": "AMD EPYC / AVX512"},
            "load_avg_end": 1.5 + seed,
            "steps_done": last,
            "final": {k: v for k, v in evals[-1].items() if k != "step"},
            "best": {k: v for k, v in best.items() if k != "step"},
            "base": {k: v for k, v in evals[0].items() if k != "step"},
            "error": "RuntimeError: synthetic failure" if status == "failed" else None,
        }
        if status == "failed":
            # a failed run's numbers must never reach the table
            summary["final"] = {rundir.EVAL_ACC: final_acc}
        (run_dir / rundir.SUMMARY).write_text(json.dumps(summary, indent=1))
    return {"dir": run_dir, "config": cfg, "summary": summary, "lines": lines, "status": status}


def make_sweep(root: str | Path, spec=STANDARD_SWEEP, sweep: str = "demo") -> list[dict[str, Any]]:
    """A Hydra-like sweep directory: ``<root>/fixes=<preset>,seed=<seed>/`` per run."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / "multirun.yaml").write_text("hydra: {}\n")
    return [make_run(root / f"fixes={p},seed={s}", p, s, acc, st, sweep=sweep) for p, s, acc, st in spec]


def log_run_to_wandb(run: dict[str, Any], project: str = "dapo-exp-test", group: str = "demo") -> None:
    """Replay a fabricated run into an offline W&B run with the project's own tracker.

    The trainer's convention assumed here: W&B config = the resolved config; every
    metrics.jsonl line logged with its step; the summary.json fields (without the
    config) set in the W&B summary; ``finish(exit_code=1)`` for a failed run, no
    finish for a killed one.
    """
    from dapo_exp.tracking import start_tracker

    cfg = run["config"]
    tracker = start_tracker(
        "wandb",
        out_dir=str(run["dir"]),
        config=cfg,
        project=project,
        group=group,
        name=Path(run["dir"]).name,
        tags=list(cfg["logger"]["tags"]),
        mode="offline",
    )
    assert tracker.backend == "wandb", "W&B offline tracker did not start"
    for line in run["lines"]:
        tracker.log({k: v for k, v in line.items() if k != "step"}, step=line["step"])
    if run["summary"] is None:
        return  # killed: neither summary nor finish (the next start_tracker closes it)
    tracker.summary({k: v for k, v in run["summary"].items() if k != "config"})
    tracker.finish(exit_code=1 if run["status"] == "failed" else 0)


def make_switch_run(
    run_dir: str | Path,
    switches: dict[str, bool],
    seed: int,
    correct,
    *,
    sweep: str = "design",
) -> dict[str, Any]:
    """A finished run with the given switch states whose final eval is ``correct`` (problems x k, 0/1).

    Writes summary.json (final accuracy = the mean of ``correct``, as the trainer computes avg@k),
    a two-line metrics.jsonl (eval at step 0 and at the end) and eval_samples.jsonl with every sample
    of the final eval, so the bootstrap sees exactly the samples behind the summary.
    """
    import numpy as np

    from dapo_exp.hydra_setup import run_label

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    correct = np.asarray(correct, dtype=bool)
    cfg = resolved_config("grpo", seed, sweep)
    cfg["preset"] = "custom"
    cfg["algo"] = algo_of(switches)
    acc = float(correct.mean())
    evals = [{"step": 0, rundir.EVAL_ACC: 0.1}, {"step": STEPS, rundir.EVAL_ACC: acc}]
    with open(run_dir / rundir.METRICS, "w") as f:
        for line in evals:
            f.write(json.dumps(line) + "\n")
    with open(run_dir / rundir.EVAL_SAMPLES, "w") as f:
        for p, row in enumerate(correct):
            for j, c in enumerate(row):
                f.write(json.dumps({"step": STEPS, "problem_id": f"p{p:03d}", "sample": j, "correct": bool(c),
                                    "length": 10, "truncated": False}) + "\n")
    oc = OmegaConf.create(cfg)
    summary = {
        "status": "finished", "label": run_label(oc), "preset": "custom", "switches": fixes.switches(oc.algo),
        "seed": seed, "config": cfg, "git_commit": "0" * 40, "wall_time_s": 1.0, "steps_done": STEPS,
        "final": {rundir.EVAL_ACC: acc}, "best": {rundir.EVAL_ACC: max(acc, 0.1)},
        "base": {rundir.EVAL_ACC: 0.1}, "error": None,
    }
    (run_dir / rundir.SUMMARY).write_text(json.dumps(summary))
    return {"dir": run_dir, "config": cfg, "summary": summary, "lines": evals, "status": "finished"}
