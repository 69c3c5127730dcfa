"""How soon the local SLURM cluster (``.ci/slurm``) runs a requeued job again: the guarantee
``tests/test_slurm_cluster.py`` holds without a clock (the job runs again by itself) and
``docs/how-to/slurm-sweep.md`` quotes as a figure, measured here.

    python3 sweeps/checks/requeue_latency.py [--repeats 5]      # as root, SLURM installed (bash .ci/slurm install)

It brings the cluster up if it is down (and down again after), submits one job per repeat that writes
``run <restart count> <epoch seconds>`` when it starts and then sleeps, requeues it once it has started
(``scontrol requeue``) and times the requeue command to the second start's line. Prints each latency, their median
and range, and the machine's load average before and after (a figure is only comparable with its load).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
JOB = 'echo "run ${SLURM_RESTART_COUNT:-0} $(date +%s.%N)"; sleep 300'


def slurm(*args: str) -> str:
    out = subprocess.run(["bash", str(ROOT / ".ci" / "slurm"), *args], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"bash .ci/slurm {' '.join(args)} failed: {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout


def wait(what: str, ready, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > end:
            sys.exit(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def starts(path: Path) -> dict[int, float]:
    text = path.read_text() if path.exists() else ""
    return {int(n): float(t) for n, t in re.findall(r"^run (\d+) ([0-9.]+)$", text, re.M)}


def one(env: dict[str, str], scratch: Path, i: int) -> float:
    out = scratch / f"requeue{i}.out"
    jid = subprocess.run(["sbatch", "--parsable", "-o", str(out), "--open-mode=append", "--wrap", JOB], env=env,
                         capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
    try:
        wait(f"job {jid}'s first start", lambda: 0 in starts(out), 120)
        asked = time.time()
        subprocess.run(["scontrol", "requeue", jid], env=env, check=True, capture_output=True)
        wait(f"job {jid} to run again", lambda: 1 in starts(out), 300)
        return starts(out)[1] - asked
    finally:
        subprocess.run(["scancel", jid], env=env, capture_output=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the local cluster's daemons run as root (.ci/slurm)")
    was_up = subprocess.run(["bash", str(ROOT / ".ci" / "slurm"), "status"], capture_output=True).returncode == 0
    conf = slurm("up").strip().removeprefix("export SLURM_CONF=")
    env = {**os.environ, "SLURM_CONF": conf}
    load_before = os.getloadavg()
    try:
        with tempfile.TemporaryDirectory() as scratch:
            latencies = []
            for i in range(args.repeats):
                latencies.append(one(env, Path(scratch), i))
                print(f"requeue {i + 1}: ran again {latencies[-1]:.1f} s after scontrol requeue", flush=True)
    finally:
        if not was_up:
            slurm("down")
    load_after = os.getloadavg()
    print(f"requeue latency: median {statistics.median(latencies):.1f} s, range {min(latencies):.1f}-"
          f"{max(latencies):.1f} s over {len(latencies)} requeues (load average {load_before[0]:.2f} / "
          f"{load_before[1]:.2f} / {load_before[2]:.2f} before, {load_after[0]:.2f} / {load_after[1]:.2f} / "
          f"{load_after[2]:.2f} after)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
