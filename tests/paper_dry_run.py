"""The acceptance dry run of ``backend=verl``: the paper's six-row ladder at 32B, typed as a user types it

    python run.py -m backend=verl experiment=dapo_32b_paper fixes=paper_1_grpo,...,paper_6_dapo \\
        backend.dry_run=true task.train_source=<parquet> task.eval_source=<parquet>

and its output read back per job: the verl command line it printed, the sbatch script it printed and
wrote, and what config.json recorded. Shared by tests/test_backend.py (the main environment) and
tests/test_verl_backend.py (verl's, where the commands are composed against verl's own config).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
LADDER = ["paper_1_grpo", "paper_2_of", "paper_3_clip", "paper_4_sop", "paper_5_tl", "paper_6_dapo"]
COMMAND_HEADER = "[dapo-exp] verl command (backend.dry_run=true, not launched):"
SCRIPT_HEADER = "[dapo-exp] sbatch script "


@dataclass
class DryJob:
    out: Path  # the job's run directory
    command: list[str]  # the verl command line as printed
    script: str  # the sbatch script as printed (and as written to <out>/verl_job.sbatch)
    record: dict  # config.json


def small_parquet(path: Path) -> Path:
    """Five problems, each twice, in the DAPO-Math-17k / AIME columns."""
    rows = [{"data_source": "math_dapo", "prompt": [{"role": "user", "content": f"What is {i} + {i}? Answer:"}],
             "ability": "MATH", "reward_model": {"ground_truth": str(2 * i), "style": "rule"},
             "extra_info": {"index": f"i{i}-{rep}"}} for rep in range(2) for i in range(5)]
    pd.DataFrame(rows).to_parquet(path)
    return path


def paper_dry_run(tmp: Path, *extra: str) -> tuple[list[DryJob], str]:
    """Run the dry run in a subprocess (cwd ``tmp``, sweep directory ``tmp/sweep``); its jobs, parsed from
    its output, and the output."""
    data = small_parquet(tmp / "math.parquet")
    argv = [sys.executable, str(ROOT / "run.py"), "-m", "backend=verl", "experiment=dapo_32b_paper",
            "fixes=" + ",".join(LADDER), "backend.dry_run=true", f"task.train_source={data}",
            f"task.eval_source={data}", f"hydra.sweep.dir={tmp / 'sweep'}", *extra]
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    res = subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return parse(res.stdout), res.stdout


def parse(stdout: str) -> list[DryJob]:
    """Each job's printed command (the line after its header) and script (the text after its header,
    checked to be the file the header names)."""
    jobs = []
    parts = stdout.split(COMMAND_HEADER + "\n")[1:]
    for part in parts:
        command_line, rest = part.split("\n", 1)
        assert rest.startswith(SCRIPT_HEADER), f"no sbatch script after the command: {rest[:200]!r}"
        header, body = rest.split("\n", 1)
        path = Path(header[len(SCRIPT_HEADER):].split(" (backend.launch=slurm", 1)[0])
        script = path.read_text()
        assert body.startswith(script), f"the printed script is not {path}"
        record = json.loads((path.parent / "config.json").read_text())
        jobs.append(DryJob(out=path.parent, command=shlex.split(command_line), script=script, record=record))
    return jobs
