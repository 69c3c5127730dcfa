"""Where a machine's CPU went, daemons included: process accounting's records grouped by command.

``python sweeps/checks/cpu_by_command.py PACCT [--top 25]`` reads a process-accounting file (Debian's ``acct``:
``accton on`` before the work, ``accton off`` after; ``dump-acct`` prints its records) and prints two markdown
tables: CPU seconds (user + system) per group of commands (Ray's and vLLM's processes of the verl runs, Python
processes, SLURM's daemons and commands, W&B's service, compilers, the rest), then per command name (the 15
characters the kernel keeps). Unlike the test command's per-test log (``DAPO_TEST_CPU_LOG``, tests/suite_hooks.py),
which counts a test's worker and the children it waited for, this counts every process that ended while
accounting was on: Ray's actors, vLLM's engine, SLURM's jobs and daemons, installs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections import defaultdict

# (group, prefixes of the command name), first match wins
GROUPS = (
    ("verl: Ray's and vLLM's processes", ("ray::", "ray-dashboard", "gcs_server", "raylet", "VLLM::")),
    ("Python (test workers, run.py, verl's driver, pip, notebooks' kernels)", ("python", "pip")),
    ("SLURM (daemons, jobs' steps, commands) and its database", ("slurm", "munged", "mariadb", "sbatch", "srun",
                                                                 "scontrol", "squeue", "sacct", "scancel", "sinfo")),
    ("W&B's service", ("wandb",)),
    ("compilers (gcc, ld)", ("cc1", "gcc", "g++", "ld", "as", "collect2")),
    ("package installs (apt, dpkg)", ("apt", "dpkg", "http", "gpgv")),
)


def records(pacct: str) -> list[tuple[str, float]]:
    """``(command, CPU seconds)`` of each process in ``pacct`` (``dump-acct``: times in centiseconds)."""
    out = subprocess.run(["dump-acct", pacct], capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        f = [x.strip() for x in line.split("|")]
        if len(f) >= 5:
            rows.append((f[0], (float(f[2]) + float(f[3])) / 100.0))
    return rows


def group_of(command: str) -> str:
    return next((g for g, prefixes in GROUPS if command.startswith(prefixes)), "other")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pacct", help="a process-accounting file (e.g. /var/log/account/pacct)")
    ap.add_argument("--top", type=int, default=25, help="commands listed in the second table")
    args = ap.parse_args(argv)
    rows = records(args.pacct)
    total = sum(cpu for _, cpu in rows) or 1.0
    by_group: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    by_command: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for command, cpu in rows:
        for table, key in ((by_group, group_of(command)), (by_command, command)):
            table[key][0] += 1
            table[key][1] += cpu
    print(f"{len(rows)} processes, {total:.0f} CPU-s\n")
    print("| group | processes | CPU-s | share |\n|---|---|---|---|")
    for g, (n, cpu) in sorted(by_group.items(), key=lambda kv: -kv[1][1]):
        print(f"| {g} | {n} | {cpu:.0f} | {cpu / total:.1%} |")
    print("\n| command | processes | CPU-s | share |\n|---|---|---|---|")
    for c, (n, cpu) in sorted(by_command.items(), key=lambda kv: -kv[1][1])[: args.top]:
        print(f"| `{c}` | {n} | {cpu:.0f} | {cpu / total:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
