"""Run one job on verl (``backend=verl``): translate, export the data, launch verl's trainer, bring
the results home into the run directory the analysis reads.

``launch(cfg)``, in order, each step before any compute of the next:

1. :func:`dapo_exp.backends.verl.translate` (a value verl cannot honour fails here, naming its key),
   the task and model sources checked as natively, verl's interpreter (``backend.python``) found;
2. the data exported with the native loaders (:func:`export_data`: the same deduplication, template
   and eval limit) to ``<run>/verl_data/{train,eval}.parquet`` in verl's schema;
3. ``config.json`` written (as a native run's, plus the verl command line, its environment and
   the keys that needed no verl key) and, with ``backend.launch=slurm``, the sbatch script
   ``<run>/verl_job.sbatch`` (:mod:`dapo_exp.backends.verl_slurm`); ``backend.dry_run=true`` stops
   here and prints the command (and the script);
4. ``backend.launch=local``: ``<backend.python> -m verl.trainer.main_ppo <overrides>`` runs here in
   its own process group (verl's ``ray.init()`` starts a local Ray, or joins ``RAY_ADDRESS``), its
   output in ``<run>/verl.log`` (the terminal gets its progress bar, and the log's end when it fails),
   its file logger in ``<run>/verl_metrics.jsonl`` (an earlier
   attempt's file is kept as ``verl_metrics.<n>.jsonl``: verl's file logger truncates on open);
   ``backend.launch=slurm``: the script is submitted with ``sbatch`` (the job id goes to
   ``config.json`` and ``summary.json``, status ``submitted``), and the job runs the same command on
   its first node, between ``python -m dapo_exp.backends.verl_launch prepare <run>`` and ``finish``;
5. ``metrics.jsonl`` translated from verl's rows (:func:`dapo_exp.backends.verl.metric_rows`) and
   ``summary.json`` written (status, final / best / base evaluations), as a native run does.

A finished run is skipped, and so is one whose SLURM job is still queued or running; one writer per
run directory (:class:`dapo_exp.rundir.RunLock`); a re-run resumes (``trainer.resume_mode=auto`` from
``<run>/checkpoints``). SIGTERM / SIGINT are passed on to verl's process group; the summary then says
``stopped``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

import dapo_exp.backends.verl as verl
import dapo_exp.backends.verl_slurm as verl_slurm
from dapo_exp import fixes, rundir
from dapo_exp.config import ConfigError
from dapo_exp.preflight import REPO, resolve_python

VERL_METRICS = "verl_metrics.jsonl"
VERL_LOG = "verl.log"
STATUS_SUBMITTED = "submitted"  # backend.launch=slurm: the job is in SLURM's queue


def export_data(cfg: DictConfig, out: Path) -> dict[str, int]:
    """The task's train and eval problems, loaded by :func:`dapo_exp.tasks.load_task` as natively, written
    to ``<out>/verl_data/{train,eval}.parquet`` in verl's RL dataset schema (the problem's messages, one user
    message unless the task gives a system message or few-shot turns; the ground truth under
    ``reward_model``). Returns the row counts."""
    import pandas as pd

    from dapo_exp.tasks import load_task

    data = load_task(cfg.task)
    target = out / verl.DATA_DIR
    target.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split, problems in (("train", data.train), ("eval", data.eval)):
        rows = [{"data_source": verl.DATA_SOURCE, "prompt": p.conversation(),
                 "ability": "MATH", "reward_model": {"ground_truth": p.answer, "style": "rule"},
                 "extra_info": {"index": i, "id": p.id, "split": split}} for i, p in enumerate(problems)]
        tmp = target / f".{split}.parquet.tmp"
        pd.DataFrame(rows).to_parquet(tmp, index=False)
        os.replace(tmp, target / f"{split}.parquet")
        counts[split] = len(rows)
    return counts


# the toy's prompts as the native trainer renders them without a chat template (dapo_exp.tasks.base.render_prompt):
# the BOS token, then the problem's text
RAW_PROMPT_TEMPLATE = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"


def export_tiny_model(cfg: DictConfig, out: Path) -> tuple[Path, Path]:
    """``model.path=tiny``'s warm start (shipped, cached or built, as natively) as verl loads a model:
    its weights and configs copied to ``<out>/verl_model``, with the same vocabulary in the form
    ``AutoTokenizer`` rebuilds for a ``qwen2`` checkpoint (:func:`dapo_exp.models.build_qwen_char_tokenizer`:
    same ids, a newline one token, EOS named ``<|im_end|>`` for verl's turn handling) and a chat template
    that renders the prompt as the native trainer does (BOS, then the text), so both engines feed the
    policy the same ids. Returns the export and the warm start it was made from."""
    from dapo_exp.models import build_qwen_char_tokenizer
    from dapo_exp.tasks.arith_warmstart import ensure_tiny_checkpoint

    source = Path(ensure_tiny_checkpoint(cfg.model, cfg.task, cfg.rollout.max_response_len))
    target = out / verl.MODEL_DIR
    tmp = out / f".{verl.MODEL_DIR}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copy2(source / name, tmp / name)
    build_qwen_char_tokenizer(chat_template=RAW_PROMPT_TEMPLATE).save_pretrained(tmp)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    return target, source


def _preflight(cfg: DictConfig) -> tuple[verl.VerlJob, str]:
    from dapo_exp import compose
    from dapo_exp.config import validate
    from dapo_exp.models import check_model_source
    from dapo_exp.tasks import check_task_sources

    validate(cfg)
    compose.check(cfg.algo, compose.run_info(cfg))  # GRPO's values, each fix's and their combination, as natively
    job = verl.translate(cfg)
    check_model_source(cfg.model.path)
    check_task_sources(cfg.task)
    # a dry run prints the command even where verl is not installed
    python = resolve_python(cfg.backend.python, must_exist=not cfg.backend.dry_run)
    if cfg.backend.dry_run and not Path(python).exists():
        print(f"[dapo-exp] note: backend.python={cfg.backend.python} ({python}) does not exist here; the command "
              "(and sbatch script) below name it: install it with `bash .ci/install-verl` before launching", flush=True)
    if not cfg.backend.dry_run:
        _check_launch(cfg.backend)
        _check_device(cfg)
    return job, python


def _check_device(cfg: DictConfig) -> None:
    """A local launch on ``cuda`` / ``auto`` needs a GPU here (verl's GPU mode would wait for one forever);
    ``train.device=cpu`` is verl's CPU mode."""
    if cfg.backend.launch != "local" or cfg.train.device == "cpu" or _has_cuda():
        return
    from dapo_exp.preflight import no_gpu

    raise ConfigError(no_gpu(cfg.train.device))


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _check_launch(backend: DictConfig) -> None:
    """What the launch needs from this machine: ``sbatch`` (slurm), or a Ray cluster to join when a
    local launch asks for several nodes (verl's ``ray.init()`` joins ``RAY_ADDRESS`` when it is set)."""
    if backend.launch == "slurm":
        verl_slurm.sbatch_path()
    elif backend.nnodes > 1 and not os.environ.get("RAY_ADDRESS"):
        raise ConfigError(f"backend.nnodes={backend.nnodes} with backend.launch=local: a local Ray has this machine's "
                          "GPUs only; use backend.launch=slurm, or start a Ray cluster over the nodes and set "
                          "RAY_ADDRESS to its head")


def _environment(job: verl.VerlJob, out: Path) -> dict[str, str]:
    """The verl process's environment: the translated W&B settings, verl's file logger, and this
    checkout on PYTHONPATH (verl's workers import the Overlong Filtering extension from it)."""
    paths = [str(REPO), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    return {**job.env, "VERL_FILE_LOGGER_PATH": str(out / VERL_METRICS), "WANDB_DIR": str(out),
            "PYTHONPATH": os.pathsep.join(dict.fromkeys(p for p in paths if p))}


def launch(cfg: DictConfig, claim: Path | None = None) -> dict[str, Any]:
    """Run ``cfg`` on verl; returns the summary (also ``<out_dir>/summary.json``). ``claim``: the run directory,
    already claimed by the caller (``run.py``); without it the directory is locked here."""
    t0 = time.perf_counter()
    job, python = _preflight(cfg)
    out = Path(cfg.out_dir).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    previous = rundir.read_summary(out) or {}
    if previous.get("status") == rundir.STATUS_FINISHED:
        print(f"[dapo-exp] {out} already finished; skipping (delete summary.json to re-run)")
        return previous
    state = None if cfg.backend.dry_run else verl_slurm.job_state(previous.get("slurm_job_id"))
    if state:
        print(f"[dapo-exp] {out}: its SLURM job {previous['slurm_job_id']} is {state}; skipping")
        return previous
    with contextlib.nullcontext() if claim is not None else rundir.RunLock(out):
        return _launch_locked(cfg, job, python, out, t0)


def _launch_locked(cfg: DictConfig, job: verl.VerlJob, python: str, out: Path, t0: float) -> dict[str, Any]:
    from dapo_exp.hydra_setup import run_label
    from dapo_exp.runner import base_model

    env = _environment(job, out)
    argv = verl.command(job, python) + verl.ray_env_overrides(env)
    label, switches = run_label(cfg), fixes.switches(cfg.algo)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    record = {"config": resolved, "git_commit": rundir.git_commit(), "label": label, "switches": switches,
              "backend": "verl", "verl": {"version": verl.VERL_VERSION, "command": argv, "env": env,
                                          "not_translated": job.not_translated}}
    script = None
    if cfg.backend.launch == "slurm":
        script = out / verl_slurm.SBATCH
        rundir.write_text_atomic(script, verl_slurm.sbatch_script(cfg, argv, env, out=out, dapo_python=sys.executable,
                                                                  label=label))
        record["verl"]["sbatch"] = str(script)
    rundir.write_json(out / rundir.CONFIG, record)
    if cfg.backend.dry_run:
        _print_dry_run(argv, script)
        return {"status": "dry_run", "label": label, "command": argv, "env": env, "sbatch": script and str(script)}
    summary = {"status": rundir.STATUS_RUNNING, "label": label, "preset": cfg.preset, "switches": switches,
               "seed": cfg.seed, "config": resolved, "git_commit": record["git_commit"], "backend": "verl",
               "error": None}
    summary["data"] = export_data(cfg, out)
    exported_from = None
    if cfg.model.path == "tiny":
        target, exported_from = export_tiny_model(cfg, out)
        summary["model"] = str(target)
    if script is not None:
        return _submit(script, out, record, summary)
    # the base weights verl loads, identified as a native run identifies them (the analysis' base column); here,
    # in the process that runs verl (a SLURM job's would be hashed on the submitting host: not recorded there yet)
    summary["base_model"] = base_model(str(summary.get("model") or job.values["actor_rollout_ref.model.path"]))
    if exported_from is not None:  # the toy's export: the same weights as the warm start, its tokenizer rebuilt
        summary["base_model"]["exported_from"] = base_model(str(exported_from))
    _keep_previous_attempt(out)
    # a local launch starts its own Ray: never join a cluster it finds on this machine (another job's, e.g. a
    # SLURM job's head), unless RAY_ADDRESS names one on purpose
    own_ray = {} if os.environ.get("RAY_ADDRESS") else {"RAY_ADDRESS": "local"}
    rc, stopped = _run(argv, {**os.environ, **env, **own_ray}, out)
    summary = _finish(cfg, out, summary, rc=rc, stopped=stopped, wall_time_s=time.perf_counter() - t0)
    if summary["status"] == rundir.STATUS_FAILED:
        raise RuntimeError(summary["error"])
    _print_end(summary, out)
    return summary


def _print_end(summary: dict[str, Any], out: Path) -> None:
    """A local run ends as a native one does: its summary screen and where it was written (a stopped run:
    one line saying so)."""
    from dapo_exp.runner import print_summary

    if summary["status"] == rundir.STATUS_FINISHED:
        print_summary(summary, out)
    else:
        print(f"[dapo-exp] run {summary['label']} seed {summary['seed']}: {summary['status']}, {summary['error']}; "
              f"written to {out}")


def _print_dry_run(argv: list[str], script: Path | None) -> None:
    print("[dapo-exp] verl command (backend.dry_run=true, not launched):")
    print(" ".join(_quote(a) for a in argv))
    if script is not None:
        print(f"[dapo-exp] sbatch script {script} (backend.launch=slurm; not submitted):")
        print(script.read_text(), end="")


def _submit(script: Path, out: Path, record: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    """``sbatch`` the run's script; the job id goes to ``config.json`` and ``summary.json``."""
    job_id = verl_slurm.submit(script)
    print(f"[dapo-exp] submitted {script} as SLURM job {job_id}")
    record["slurm"] = {"job_id": job_id, "script": str(script)}
    rundir.write_json(out / rundir.CONFIG, record)
    summary.update(status=STATUS_SUBMITTED, slurm_job_id=job_id)
    rundir.write_json(out / rundir.SUMMARY, summary)
    return summary


def _finish(cfg: DictConfig, out: Path, summary: dict[str, Any], *, rc: int, stopped: str | None,
            wall_time_s: float, error: str | None = None) -> dict[str, Any]:
    """verl's metrics (every attempt) as ``metrics.jsonl``, and ``summary.json`` with the status."""
    rows = verl.metric_rows(_attempts(out), prompts_per_step=cfg.train.prompts_per_step, group_size=cfg.rollout.n,
                            max_response_len=cfg.rollout.max_response_len)
    (out / rundir.METRICS).unlink(missing_ok=True)
    rundir.JsonlWriter(out / rundir.METRICS).write(rows)
    summary.update(verl.summary_fields(rows), wall_time_s=wall_time_s, return_code=rc, error=None)
    if stopped:
        summary.update(status=rundir.STATUS_STOPPED, error=f"stopped by {stopped}; it resumes from its last "
                       "checkpoint when requeued or re-run")
    elif error or rc != 0:
        summary.update(status=rundir.STATUS_FAILED, error=error or f"verl exited with {rc}; see {out / VERL_LOG}")
    else:
        summary["status"] = rundir.STATUS_FINISHED
    rundir.write_json(out / rundir.SUMMARY, summary)
    return summary


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def _keep_previous_attempt(out: Path) -> None:
    """verl's file logger truncates its file: keep an earlier attempt's as ``verl_metrics.<n>.jsonl``."""
    current = out / VERL_METRICS
    if current.exists():
        n = len(list(out.glob("verl_metrics.*.jsonl")))
        current.rename(out / f"verl_metrics.{n}.jsonl")


def _attempts(out: Path) -> list[dict[str, Any]]:
    """verl's file-logger rows of every attempt, oldest first."""
    files = sorted(out.glob("verl_metrics.*.jsonl"), key=lambda p: int(p.name.split(".")[1])) + [out / VERL_METRICS]
    return [row for f in files for row in rundir.read_jsonl(f)]


# verl's lines that reach the terminal (all of them go to <run>/verl.log): its per-step progress bar
CONSOLE_LINE = re.compile(r"Training Progress: *\d+%")
TAIL_ON_FAILURE = 40  # lines of verl.log printed when verl fails


def _run(argv: list[str], env: dict[str, str], out: Path) -> tuple[int, str | None]:
    """Run verl in its own process group, its output in ``verl.log``: the terminal gets verl's progress
    bar (one line per step) and, when verl fails, the log's last lines; SIGTERM / SIGINT are passed on
    to the group. Returns (exit code, the signal's name if one stopped it)."""
    stopped: list[str] = []
    print(f"[dapo-exp] verl is running; its output: {out / VERL_LOG}", flush=True)
    with open(out / VERL_LOG, "ab") as log:
        proc = subprocess.Popen(argv, cwd=out, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)

        def forward(signum: int, frame: Any) -> None:
            stopped.append(signal.Signals(signum).name)
            os.killpg(proc.pid, signum)

        old = {}
        if _main_thread():
            old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            for line in proc.stdout:
                log.write(line)
                text = line.decode(errors="replace")
                if CONSOLE_LINE.search(text):
                    print(f"[dapo-exp] verl: {text.split('Training Progress:')[-1].strip()}", flush=True)
            rc = proc.wait()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            with contextlib.suppress(ProcessLookupError, PermissionError):  # what verl left of its group
                os.killpg(proc.pid, signal.SIGKILL)
    if rc != 0 and not stopped:
        lines = (out / VERL_LOG).read_text(errors="replace").splitlines()[-TAIL_ON_FAILURE:]
        print("\n".join(["[dapo-exp] verl failed; the end of its log:", *lines]), file=sys.stderr, flush=True)
    return rc, (stopped[0] if stopped else None)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


# --------------------------------------------------------------------------- #
# The steps of the sbatch job (backend.launch=slurm), around verl's trainer     #
# --------------------------------------------------------------------------- #
def prepare(out: Path) -> dict[str, Any]:
    """Before verl, in each attempt of the job: keep an earlier attempt's verl metrics (verl's file logger
    truncates its file) and mark the run ``running`` with its SLURM job id and restart count."""
    summary = rundir.read_summary(out) or {}
    _keep_previous_attempt(out)
    summary.update(status=rundir.STATUS_RUNNING, error=None, attempt_started=time.time(),
                   slurm_job_id=os.environ.get("SLURM_JOB_ID", summary.get("slurm_job_id")),
                   slurm_restarts=int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0))
    rundir.write_json(out / rundir.SUMMARY, summary)
    return summary


def finish(out: Path, *, rc: int, stopped: str | None = None, error: str | None = None) -> dict[str, Any]:
    """After verl (or instead of it, when the Ray cluster did not come up): the results home, as a local
    launch writes them; the config is the one ``config.json`` recorded at submission."""
    record = rundir.read_json(out / rundir.CONFIG)
    if not record or "config" not in record:
        raise FileNotFoundError(f"{out / rundir.CONFIG}: no recorded config; is {out} a backend=verl run directory?")
    summary = rundir.read_summary(out) or {}
    started = summary.pop("attempt_started", None)
    wall = time.time() - started if started else 0.0
    if stopped and not stopped.startswith("SIG"):
        stopped = f"SIG{stopped}"
    return _finish(OmegaConf.create(record["config"]), out, summary, rc=rc, stopped=stopped, error=error,
                   wall_time_s=wall)


def main(argv: list[str] | None = None) -> int:
    """``python -m dapo_exp.backends.verl_launch prepare|finish <run> ...`` (the sbatch script's steps)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m dapo_exp.backends.verl_launch", description=main.__doc__)
    sub = parser.add_subparsers(dest="step", required=True)
    sub.add_parser("prepare", help="before verl: keep an earlier attempt's metrics, mark the run running").add_argument(
        "run", type=Path)
    fin = sub.add_parser("finish", help="after verl: metrics.jsonl and summary.json")
    fin.add_argument("run", type=Path)
    fin.add_argument("--return-code", type=int, required=True, help="verl's exit code")
    fin.add_argument("--stopped", help="the signal that stopped verl (USR1, TERM)")
    fin.add_argument("--error", help="why the job failed before or around verl")
    args = parser.parse_args(argv)
    out = args.run.expanduser().resolve()
    if args.step == "prepare":
        prepare(out)
    else:
        summary = finish(out, rc=args.return_code, stopped=args.stopped, error=args.error)
        print(f"[dapo-exp] {out.name}: {summary['status']}" + (f" ({summary['error']})" if summary["error"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
