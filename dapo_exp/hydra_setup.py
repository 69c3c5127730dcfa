"""Hydra glue: the resolvers the config tree uses and the job's output directory.

Importing :mod:`dapo_exp.config` registers the typed schema in Hydra's ConfigStore.
"""

from __future__ import annotations

import os

from omegaconf import OmegaConf

import dapo_exp.config  # noqa: F401  (registers the `schema` node)


def _dirname(override_dirname: str) -> str:
    # `hydra.job.override_dirname` is empty when a job has no override; name it "default".
    # "/" would nest directories (hydra/launcher=...), so it becomes "~".
    return override_dirname.replace("/", "~") if override_dirname else "default"


def register_resolvers() -> None:
    """Register ``${dirname:...}`` (idempotent)."""
    if not OmegaConf.has_resolver("dirname"):
        OmegaConf.register_new_resolver("dirname", _dirname)


def job_output_dir() -> str:
    """The running Hydra job's output directory (``hydra.runtime.output_dir``), or the cwd."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return HydraConfig.get().runtime.output_dir
    return os.getcwd()


def dry_run_sweep(argv: list[str], config_dir: str) -> bool:
    """Print the config of every job of a sweep: ``run.py -m --cfg job|hydra|all [overrides]``.

    With ``--cfg job`` and a ``hydra/launcher=...`` override, the launcher's settings
    (SLURM partition, GPUs, time, ...) are printed once before the jobs.

    Hydra itself refuses ``--multirun`` together with ``--cfg``. This expands the
    sweep with Hydra's own override parser and its basic sweeper's cartesian
    product, composes each job's config exactly as a run would, and prints it
    under a ``#i : overrides`` header. Returns False (nothing done) when ``argv``
    is not such a call, so the caller goes on to ``@hydra.main``.
    """
    flags_m = {"-m", "--multirun"}
    if not flags_m & set(argv) or not any(a == "--cfg" or a.startswith("--cfg=") or a == "-c" for a in argv):
        return False
    from hydra import compose, initialize_config_dir
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    rest, what, i = [], "job", 0
    while i < len(argv):
        a = argv[i]
        if a in flags_m:
            pass
        elif a in ("--cfg", "-c"):
            what, i = argv[i + 1], i + 1
        elif a.startswith("--cfg="):
            what = a.split("=", 1)[1]
        elif a in ("--resolve",):
            pass
        else:
            rest.append(a)
        i += 1
    if what not in ("job", "hydra", "all"):
        raise SystemExit(f"--cfg must be one of job, hydra, all; got {what!r}")
    register_resolvers()
    parsed = OverridesParser.create().parse_overrides(rest)
    jobs = BasicSweeper.split_arguments(parsed, None)[0]
    print(f"[dry run] {len(jobs)} jobs")
    with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
        if what == "job" and any(a.startswith(("hydra/launcher=", "hydra.launcher.")) for a in rest):
            # the launcher is what a sweep dry run is usually checked for: show its settings once
            first = compose("config", overrides=jobs[0], return_hydra_config=True)
            launcher = OmegaConf.to_container(first.hydra.launcher, resolve=False)
            print(OmegaConf.to_yaml({"hydra": {"launcher": launcher}}))
        for n, job in enumerate(jobs):
            cfg = compose("config", overrides=job, return_hydra_config=what != "job")
            if what == "hydra":
                cfg = OmegaConf.create({"hydra": OmegaConf.to_container(cfg.hydra, resolve=False)})
            print(f"#{n} : {' '.join(job)}")
            print(OmegaConf.to_yaml(cfg))
    return True


def record_failure(out_dir: str, exc: BaseException) -> None:
    """Make sure a failed job's directory says so (``summary.json``, status ``failed``).

    ``train`` writes it itself once it has started; this covers failures before that
    (a bad config value, a missing dataset), so the analysis can list the job.
    """
    import json
    from pathlib import Path

    path = Path(out_dir) / "summary.json"
    try:
        if path.exists() and json.loads(path.read_text()).get("status") == "failed":
            return
    except (OSError, ValueError):
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"status": "failed", "error": f"{type(exc).__name__}: {exc}"}, indent=1))
