"""``backend.launch=slurm``: one sbatch job per run, a Ray cluster over its nodes, verl's trainer on it.

:func:`sbatch_script` renders the committed template ``verl_sbatch.sh.j2`` (beside this file) for one
run: the ``#SBATCH`` lines from the layout (``backend.nnodes`` x ``backend.gpus_per_node``) and the
site settings (``backend.slurm.*``), the verl command line and environment the launcher built, and
the run directory. What the script does is written at its top: Ray head on the first node, one Ray
worker per other node (``srun``), a wait until the cluster holds every GPU, verl's trainer on the
first node with ``trainer.resume_mode=auto``, then ``python -m dapo_exp.backends.verl_launch finish``
for the results; USR1 before the time limit stops verl and requeues the job.

:func:`submit` runs ``sbatch --parsable`` and returns the job id; :func:`job_state` asks ``squeue``
whether a recorded job is still queued or running (so that a re-run does not submit it twice).
No verl import: this runs on the submitting machine, in dapo-exp's environment.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

from dapo_exp.config import ConfigError

SBATCH = "verl_job.sbatch"  # under the run directory
TEMPLATE = Path(__file__).with_name("verl_sbatch.sh.j2")
OUTPUT = "slurm-%j.out"  # SLURM's log of the job (Ray's start-up, the script's own lines), in the run directory
QUEUED = ("PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING",
          "RESIZING", "SUSPENDED", "STOPPED", "SIGNALING")  # squeue states of a job that is not over


def _sbatch_lines(cfg: Any, out: Path, label: str) -> list[str]:
    """The ``#SBATCH`` options: the layout, the site settings, requeue and the USR1 warning."""
    b, s = cfg.backend, cfg.backend.slurm
    # train.device=cpu: no GPU asked of SLURM (a CPU node has none; the job's Ray declares logical ones)
    gpus = [] if cfg.train.device == "cpu" else [f"--gpus-per-node={b.gpus_per_node}"]
    lines = [f"--job-name=dapo-{label}-s{cfg.seed}", f"--nodes={b.nnodes}", "--ntasks-per-node=1",
             *gpus, f"--time={s.time}",
             f"--chdir={out}", f"--output={str(out).replace('%', '%%')}/{OUTPUT}",  # %j: the job id
             "--open-mode=append", "--requeue", f"--signal=B:USR1@{s.signal_s}"]
    optional = {"partition": s.partition, "account": s.account, "qos": s.qos, "cpus-per-task": s.cpus_per_node,
                "mem": None if s.mem_gb is None else f"{s.mem_gb}G"}
    lines += [f"--{k}={v}" for k, v in optional.items() if v is not None]
    lines += ["--exclusive"] if s.exclusive else []
    return lines + list(s.sbatch_args)


def _check_path(out: Path) -> None:
    """SLURM reads ``#SBATCH`` lines word by word: a run directory with white space cannot be named there."""
    if re.search(r"\s", str(out)):
        raise ConfigError(f"out_dir={str(out)!r}: backend.launch=slurm needs a run directory without white space "
                          "(its #SBATCH --chdir / --output lines name it)")


def sbatch_script(cfg: Any, argv: list[str], env: dict[str, str], *, out: Path, dapo_python: str,
                  label: str) -> str:
    """The sbatch script of the run ``cfg`` (resolved config) in ``out``: ``argv`` is verl's command line
    and ``env`` its environment, exactly as the launcher built them; ``dapo_python`` runs this package's
    ``prepare`` / ``finish`` steps on the job's first node."""
    import jinja2

    from dapo_exp.backends.verl import CPU_RAY_CPUS

    _check_path(out)
    b, s = cfg.backend, cfg.backend.slurm
    template = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                                  comment_start_string="{##", comment_end_string="##}",
                                  autoescape=False).from_string(TEMPLATE.read_text())
    q = shlex.quote
    return template.render(
        label=label, nnodes=b.nnodes, gpus_per_node=b.gpus_per_node, signal_s=s.signal_s,
        max_requeues=s.max_requeues, ray_port=s.ray_port, ray_wait_s=s.ray_wait_s,
        # train.device=cpu: the logical CPUs verl's CPU mode needs (verl.CPU_RAY_CPUS), whatever the node has
        ray_cpus=CPU_RAY_CPUS if cfg.train.device == "cpu" else None,
        sbatch_lines=_sbatch_lines(cfg, out, label), setup=list(s.setup),
        run=q(str(out)), verl_python=q(argv[0]), dapo_python=q(dapo_python),
        env=[(k, q(v)) for k, v in env.items()], verl_command=" \\\n    ".join(q(a) for a in argv))


def sbatch_path() -> str:
    """``sbatch`` on PATH, or a :class:`ConfigError` saying what to do instead (before anything runs)."""
    found = shutil.which("sbatch")
    if not found:
        raise ConfigError("backend.launch=slurm: no `sbatch` on PATH; submit from a SLURM login node, or write "
                          "the script only with backend.dry_run=true (<run>/verl_job.sbatch) and submit it there")
    return found


def submit(script: Path) -> str:
    """``sbatch --parsable <script>``; returns the job id (``<id>`` or ``<id>;<cluster>``: the id)."""
    res = subprocess.run([sbatch_path(), "--parsable", str(script)], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"sbatch {script} failed ({res.returncode}): {res.stderr.strip() or res.stdout.strip()}")
    job_id = res.stdout.strip().split(";")[0]
    if not job_id:
        raise RuntimeError(f"sbatch {script} printed no job id: {res.stdout!r}")
    return job_id


def job_state(job_id: str | None) -> str | None:
    """The SLURM state of ``job_id`` while it is queued or running; None when it is over, unknown,
    or there is no ``squeue`` here."""
    squeue = shutil.which("squeue")
    if not job_id or not squeue:
        return None
    res = subprocess.run([squeue, "--noheader", "--jobs", str(job_id), "--format=%T"], capture_output=True, text=True)
    states = res.stdout.split() if res.returncode == 0 else []
    return states[0] if states and states[0] in QUEUED else None
