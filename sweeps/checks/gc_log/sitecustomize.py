"""Per-process garbage-collector log: with this folder on PYTHONPATH, every Python process that exits normally
appends one line to ``$DAPO_GC_LOG``: its pid, its command (cut to 100 characters), its CPU seconds, the CPU seconds
its cyclic garbage collector took (timed by ``gc.callbacks``), by generation, and the number of collections of each
(tab-separated). A measurement tool, not the package's.

The 2026-12-01 measurement in sweeps/results/2026-11-29-ci-cpu/README.md ("The garbage collector"), e.g.::

    PYTHONPATH=$PWD/sweeps/checks/gc_log DAPO_GC_LOG=/tmp/gc.tsv OMP_NUM_THREADS=1 \\
        .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_family.py
    PYTHONPATH=$PWD/sweeps/checks/gc_log DAPO_GC_LOG=/tmp/gc.tsv OMP_NUM_THREADS=1 \\
        .venv/bin/python run.py logger=none train.steps=2 eval.every=0 eval.final_problems=8 hydra.run.dir=/tmp/gc-run
    column -t -s $'\\t' /tmp/gc.tsv
"""

import atexit
import gc
import os
import sys
import time

_SPENT = [0.0, 0.0, 0.0]
_COUNT = [0, 0, 0]
_START = [0.0]


def _timed(phase: str, info: dict) -> None:
    if phase == "start":
        _START[0] = time.process_time()
    else:
        _SPENT[info["generation"]] += time.process_time() - _START[0]
        _COUNT[info["generation"]] += 1


def _write() -> None:
    cpu = time.process_time()
    command = " ".join(sys.argv).replace("\t", " ").replace("\n", " ")[:100]
    gens = " ".join(f"{s:.2f}" for s in _SPENT)
    with open(os.environ["DAPO_GC_LOG"], "a") as f:
        f.write(f"{os.getpid()}\t{command}\tcpu {cpu:.2f}\tgc {sum(_SPENT):.2f}\tby generation {gens}\t"
                f"collections {' '.join(map(str, _COUNT))}\tthreshold {gc.get_threshold()[0]}\n")


if os.environ.get("DAPO_GC_LOG"):
    gc.callbacks.append(_timed)
    atexit.register(_write)
