"""Per-process CPU log: with this folder on PYTHONPATH, every Python process that exits normally appends one line
to ``$DAPO_PROC_LOG``: its pid, parent pid, own CPU seconds, its waited-for children's CPU seconds, wall seconds
and command line (tab-separated). A process killed by a signal or ending in ``os._exit`` writes nothing.

Over a fresh-clone CI run (the 2026-11-30 run of ab94174 in sweeps/results/2026-11-29-ci-cpu/README.md)::

    PYTHONPATH=$PWD/sweeps/checks/proc_log DAPO_PROC_LOG=/tmp/procs.tsv bash .ci/run
    python sweeps/checks/proc_log/summary.py /tmp/procs.tsv

Unlike process accounting (``accton``, sweeps/checks/cpu_by_command.py), it names each process by its whole command
line (which test's ``python run.py``, which pip install), not by a 15-character command name."""

import atexit
import os
import sys
import time

_START = time.time()


def _log() -> None:
    path = os.environ.get("DAPO_PROC_LOG")
    if not path:
        return
    try:
        t = os.times()
        argv = " ".join(sys.argv)[:300].replace("\t", " ").replace("\n", " ")
        line = (f"{os.getpid()}\t{os.getppid()}\t{t.user + t.system:.2f}\t{t.children_user + t.children_system:.2f}"
                f"\t{time.time() - _START:.1f}\t{argv}\n")
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)  # one write: lines of processes never mix
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except Exception:  # a measurement never breaks the process it measures
        pass


atexit.register(_log)
