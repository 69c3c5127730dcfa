"""Per-composition CPU log: with this folder on PYTHONPATH, every Python process that exits normally appends one
line per Hydra composition it made (Hydra's ``ConfigLoaderImpl.load_configuration``: ``python run.py``'s own, the
Compose API's, the launch check's) to ``$DAPO_COMPOSE_LOG``: its pid, the pytest test it ran in
(``PYTEST_CURRENT_TEST``, ``-`` outside one), its CPU seconds and its overrides (tab-separated). A measurement
tool, not the package's: it wraps a private Hydra method, and imports Hydra into every process it runs in.

Over the main suite (the 2026-12-01 measurement in sweeps/results/2026-11-29-ci-cpu/README.md)::

    PYTHONPATH=$PWD/sweeps/checks/compose_log DAPO_COMPOSE_LOG=/tmp/compose.tsv DAPO_SKIP_SLURM=1 \\
        .venv/bin/python -m pytest -q -n 2 --dist loadscope -m "not vllm" \\
        --ignore tests/test_slurm_sweeps.py --ignore tests/test_verl_run.py
    python -c "import pandas as pd; t = pd.read_csv('/tmp/compose.tsv', sep='\\t', names=['pid', 'test', 'cpu', \\
        'overrides']); print(len(t), t.cpu.sum(), t.overrides.duplicated().sum()); \\
        print(t.groupby(t.test.str.split('[').str[0]).cpu.agg(['count', 'sum']).sort_values('sum').tail(15))"
"""

import atexit
import os
import time

_LINES: list[str] = []


def _install() -> None:
    if not os.environ.get("DAPO_COMPOSE_LOG"):
        return
    try:
        from hydra._internal.config_loader_impl import ConfigLoaderImpl
    except ImportError:  # an interpreter without Hydra (pip's, a build backend's)
        return
    load = ConfigLoaderImpl.load_configuration

    def timed(self, config_name, overrides, *args, **kwargs):
        start = time.process_time()
        try:
            return load(self, config_name, overrides, *args, **kwargs)
        finally:
            test = os.environ.get("PYTEST_CURRENT_TEST", "-").split(" ")[0]
            text = " ".join(str(o) for o in overrides or []).replace("\t", " ").replace("\n", " ")
            _LINES.append(f"{os.getpid()}\t{test}\t{time.process_time() - start:.3f}\t{text}\n")

    ConfigLoaderImpl.load_configuration = timed


def _write() -> None:
    path = os.environ.get("DAPO_COMPOSE_LOG")
    if not path or not _LINES:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, "".join(_LINES).encode())
    finally:
        os.close(fd)


_install()
atexit.register(_write)
