"""Hydra glue: the resolvers the config tree uses, the job's output directory, a sweep's jobs and
their directory names (Hydra's basic sweeper and ``override_dirname``, from its public override API),
the sweep dry run, and the run label (which needs the presets as Hydra composes them).

Importing :mod:`dapo_exp.config` registers the typed schema in Hydra's ConfigStore.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

import dapo_exp.config  # noqa: F401  (registers the `schema` node)
from dapo_exp import fixes

if TYPE_CHECKING:
    from hydra.core.override_parser.types import Override

# the config tree of this checkout (run.py's config_path)
CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "conf")


MAX_DIRNAME = 120  # longer job directory names keep a readable prefix and a hash of the whole


def _short(name: str) -> str:
    import hashlib

    if len(name) <= MAX_DIRNAME:
        return name
    return f"{name[:MAX_DIRNAME - 10]}~{hashlib.sha1(name.encode()).hexdigest()[:8]}"


def run_dirname(override_dirname: str) -> str:
    """A job's directory name from its overrides: empty -> ``default``; ``/`` (which would nest
    directories, ``hydra/launcher=...``) -> ``~``; the backslashes of Hydra's escapes (a sweep's job
    writes ``backend.slurm.time=00\\:30\\:00``) dropped, since ``sbatch`` strips them from the
    ``#SBATCH --chdir`` / ``--output`` lines that name the directory; over :data:`MAX_DIRNAME` characters
    -> a prefix and a hash (the job's overrides are recorded in full in its ``.hydra/overrides.yaml``
    and ``config.json``)."""
    return _short(override_dirname.replace("\\", "").replace("/", "~")) if override_dirname else "default"


def default_sweep_name(argv: list[str]) -> str | None:
    """The ``sweep=`` name of a multirun command that gives none: its swept overrides
    (those with a comma list), e.g. ``fixes=grpo,clip,clip_ds,full``; None for a single run,
    for a command that names its sweep, and for a dry run."""
    if not {"-m", "--multirun"} & set(argv) or any(a.startswith(("sweep=", "--cfg", "-c")) for a in argv):
        return None
    swept = sorted(a for a in argv if "=" in a and "," in a.split("=", 1)[1] and not a.startswith("hydra"))
    return _short("+".join(swept).replace("/", "~")) if swept else None


def register_resolvers() -> None:
    """Register ``${dirname:...}`` (idempotent)."""
    if not OmegaConf.has_resolver("dirname"):
        OmegaConf.register_new_resolver("dirname", run_dirname)


def job_output_dir() -> str:
    """The running Hydra job's output directory (``hydra.runtime.output_dir``), or the cwd."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return HydraConfig.get().runtime.output_dir
    return os.getcwd()


# --------------------------------------------------------------------------- #
# a sweep's jobs and their directory names, from Hydra's public override API    #
# --------------------------------------------------------------------------- #
def expand_sweep(overrides: Iterable[Override]) -> list[list[str]]:
    """The jobs of a sweep as Hydra's basic sweeper runs them: the cartesian product of the parsed
    ``overrides`` (``a=1,2``, ``range(...)``, ``choice(...)``; ``glob(...)`` where the parser was given a
    config loader), each job as its list of ``key=value`` overrides, the first override varying slowest.
    A key given twice keeps the place of its first mention and the value of its last, so that a command's
    ``seed=`` replaces the sweeper's default seeds where they stood. ``interval(...)`` is refused as the
    basic sweeper refuses it (it has no list of values to run).

    The preflight, the dry run, the analysis and the sequential sweeper must list the jobs the launched
    sweep will run; this is the basic sweeper's expansion written against Hydra's public ``Override``
    (the sweeper itself is internal to Hydra; tests/test_hydra_setup.py checks the two agree)."""
    import itertools

    from hydra.errors import HydraException

    choices: dict[str, list[str]] = {}
    for override in overrides:
        key = override.get_key_element()  # with its +, ~ or @package: ``+a=1`` and ``a=1`` are two keys
        if not override.is_sweep_override():
            choices[key] = [f"{key}={override.get_value_element_as_str()}"]
        elif override.is_discrete_sweep():
            choices[key] = [f"{key}={value}" for value in override.sweep_string_iterator()]
        else:
            raise HydraException(f"BasicSweeper does not support sweep type : {override.value_type.name}")
    return [list(job) for job in itertools.product(*choices.values())]


def sweep_jobs(overrides: Iterable[str], params: Mapping[str, Any] | None = None) -> list[list[str]]:
    """The jobs of a sweep command's ``overrides`` (:func:`expand_sweep`), the sweeper's ``params``
    (``hydra.sweeper.params``: the default seeds) applied first, as the basic sweeper applies them, so
    that the command's own ``seed=`` replaces them."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    args = [f"{k}={v}" for k, v in (params or {}).items()] + list(overrides)
    return expand_sweep(OverridesParser.create().parse_overrides(args))


def overrides_dirname(overrides: Iterable[Override], exclude_keys: Iterable[str] = (), item_sep: str = ",",
                      kv_sep: str = "=") -> str:
    """``hydra.job.override_dirname`` of a job with the parsed ``overrides``, as Hydra computes it: the
    overrides as typed, those of an excluded key left out (``hydra.job.config.override_dirname.exclude_keys``,
    the key without its ``+``/``~``), sorted, joined with ``item_sep``, every ``=`` written ``kv_sep``.
    Where a sweep's jobs will write (a re-run skips the finished ones) must be known before they start."""
    exclude = set(exclude_keys)
    lines = sorted(str(o.input_line) for o in overrides if o.key_or_group not in exclude)
    return item_sep.join(lines).replace("=", kv_sep)


def dry_run_sweep(argv: list[str], config_dir: str) -> bool:
    """Print the config of every job of a sweep: ``run.py -m --cfg job|hydra|all [overrides]``.

    With ``--cfg job`` and a ``hydra/launcher=...`` override, the launcher's settings
    (SLURM partition, GPUs, time, ...) are printed once before the jobs.

    Hydra itself refuses ``--multirun`` together with ``--cfg``. This expands the
    sweep with Hydra's own override parser and the basic sweeper's cartesian
    product (:func:`sweep_jobs`), composes each job's config exactly as a run would, and prints it
    under a ``#i : overrides`` header. Returns False when ``argv`` is not such a call, so the
    caller goes on to ``@hydra.main`` (``run.py`` checks the run or sweep first:
    :func:`dapo_exp.preflight.precheck`).
    """
    flags_m = {"-m", "--multirun"}
    if not flags_m & set(argv) or not any(a == "--cfg" or a.startswith("--cfg=") or a == "-c" for a in argv):
        return False
    from hydra import compose, initialize_config_dir
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
    jobs = expand_sweep(OverridesParser.create().parse_overrides(rest))
    with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
        # the sweeper's own parameters (the default seeds) come first, as the basic sweeper applies them
        params = compose("config", overrides=jobs[0], return_hydra_config=True).hydra.sweeper.get("params") or {}
        jobs = sweep_jobs(rest, params)
        print(f"[dry run] {len(jobs)} jobs")
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


def compose_config(overrides: list[str]) -> DictConfig:
    """``conf/config.yaml`` composed with ``overrides``, as a run would get it.

    Inside a Hydra app (or a test's ``initialize_config_dir``) Hydra's own instance is
    used; otherwise this checkout's ``conf/`` is initialised for the call.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_resolvers()
    if GlobalHydra.instance().is_initialized():
        return compose("config", overrides=overrides)
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("config", overrides=overrides)


@functools.cache
def preset_algo(name: str) -> DictConfig | None:
    """The ``algo`` section that ``fixes=<name>`` composes to; None if there is no such preset."""
    if not (Path(CONFIG_DIR) / "fixes" / f"{name}.yaml").is_file():
        return None
    return compose_config([f"fixes={name}"]).algo


def preset_switches(name: str) -> dict[str, bool] | None:
    """The switch state of the preset ``conf/fixes/<name>.yaml`` (None if there is none)."""
    algo = preset_algo(name)
    return None if algo is None else fixes.switches(algo)


def run_label(cfg: Any) -> str:
    """The label of a run: its preset's name when the run's switches are the preset's,
    else the first preset with the run's switches, else ``clip+ds+...`` (:func:`dapo_exp.fixes.label`).

    The presets are composed one at a time, in :data:`dapo_exp.fixes.PRESETS` order, up to the first whose
    switches are the run's (each composition of the whole config costs 0.25-0.6 CPU-s, by the machine: a study's
    ``fixes=grpo clip_higher=enabled`` arm, labelled ``clip``, composes two presets, not all of them)."""
    state = fixes.switches(cfg.algo)
    preset = getattr(cfg, "preset", None)
    own = preset_switches(preset) if preset else None
    if own is not None and own == state:
        return str(preset)
    for name in fixes.PRESETS:
        if (s := preset_switches(name)) is not None and s == state:
            return name
    return fixes.label(state)


# --------------------------------------------------------------------------- #
# the job's record, written once the run directory is ours                      #
# --------------------------------------------------------------------------- #
HYDRA_RECORD = ".hydra"


def write_hydra_record(out_dir: str | os.PathLike, task_cfg: DictConfig) -> None:
    """Write what Hydra writes into ``<run>/.hydra/`` (``config.yaml``, ``hydra.yaml``, ``overrides.yaml``).

    conf/config.yaml sets ``hydra.output_subdir: null``, so Hydra itself writes nothing into the run
    directory before the job function runs: ``run.py`` first locks the directory and checks the config
    recorded there (:func:`dapo_exp.runner.claimed`), then calls this. A second writer that is refused,
    or a re-run refused for another configuration, so leaves the live run's record as it was."""
    from hydra.core.hydra_config import HydraConfig

    from dapo_exp.rundir import write_text_atomic

    record = Path(out_dir) / HYDRA_RECORD
    record.mkdir(parents=True, exist_ok=True)
    write_text_atomic(record / "config.yaml", OmegaConf.to_yaml(task_cfg))
    if HydraConfig.initialized():
        write_text_atomic(record / "hydra.yaml", OmegaConf.to_yaml(HydraConfig.instance().cfg))
        write_text_atomic(record / "overrides.yaml", OmegaConf.to_yaml(HydraConfig.get().overrides.task))


def move_log_files(old_dir: str | os.PathLike, new_dir: str | os.PathLike) -> None:
    """Point the logging file handlers Hydra opened in ``old_dir`` (the job's ``<name>.log``) at
    ``new_dir``: a branched run (``run.on_config_change=branch``) logs into its own directory. The
    handlers open their file at the first line (``delay: true`` in conf/config.yaml), so nothing was
    written in ``old_dir``."""
    import logging

    old, new = Path(old_dir).resolve(), Path(new_dir)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).parent == old:
            handler.close()
            handler.baseFilename = str(new / Path(handler.baseFilename).name)


# --------------------------------------------------------------------------- #
# sweep names stay inside the sweep root                                        #
# --------------------------------------------------------------------------- #
SWEEP_ROOT = "multirun"  # conf/config.yaml: hydra.sweep.dir = multirun/${sweep}


def check_sweep_name(argv: list[str]) -> None:
    """Refuse (:class:`~dapo_exp.config.ConfigError`) a ``sweep=`` on the command line that would put the
    sweep outside ``multirun/``: an absolute path or one with a ``..`` component (``sweep=../../x``).
    Called before Hydra starts, so nothing is written. ``hydra.sweep.dir=<dir>`` stays the way to
    write a sweep elsewhere on purpose."""
    import posixpath

    from dapo_exp.config import ConfigError

    for arg in argv:
        key, eq, raw = arg.partition("=")
        if not eq or key.lstrip("+~") != "sweep":
            continue
        try:
            from hydra.core.override_parser.overrides_parser import OverridesParser

            override = OverridesParser.create().parse_overrides([arg])[0]
            values = list(override.sweep_iterator()) if override.is_sweep_override() else [override.value()]
        except Exception:  # noqa: BLE001 - an unparsable override is Hydra's to report
            values = [raw.strip("'\"")]
        for name in values:
            name = _resolved_sweep_name(str(name))
            parts = name.replace("\\", "/").split("/")
            inside = posixpath.normpath(posixpath.join(SWEEP_ROOT, name))
            if not name.strip() or name.startswith(("/", "~")) or ".." in parts \
                    or not inside.startswith(SWEEP_ROOT + "/"):
                raise ConfigError(
                    f"sweep={name}: a sweep name must stay inside {SWEEP_ROOT}/ (a relative name without '..', "
                    f"e.g. sweep=clip_vs_grpo); to write a sweep elsewhere set hydra.sweep.dir=<dir>")


# the choices that decide what a run trains as a whole: given twice, one of them is a mistake
ONCE_ONLY = ("fixes", "experiment")


def check_repeated_overrides(argv: list[str]) -> None:
    """Refuse (:class:`~dapo_exp.config.ConfigError`) ``fixes=`` or ``experiment=`` given twice on the
    command line (``fixes=gspo fixes=cispo``): Hydra keeps the last one without a word, so the run would
    train one of the two values typed and say nothing of the other. Other keys keep Hydra's rule, the
    last one wins, which the sweep scripts use (their settings first, the user's overrides after them:
    ``bash sweeps/four_presets.sh hydra/launcher=basic``). Called before Hydra starts."""
    from dapo_exp.config import ConfigError

    seen: dict[str, str] = {}
    for arg in argv:
        key, eq, _ = arg.partition("=")
        if arg.startswith("-") or not (eq or arg.startswith("~")):  # options; a value of --cfg, -cn, ...
            continue
        key = key.lstrip("+~")
        if key in seen and key in ONCE_ONLY:
            raise ConfigError(
                f"{key}= is given twice on the command line ({seen[key]}, {arg}): Hydra would keep the last one "
                f"silently. Give it once (to sweep over both: {key}=<a>,<b> with -m)")
        seen[key] = arg


def _resolved_sweep_name(name: str) -> str:
    """A ``sweep=`` value as Hydra will use it: interpolations (``${oc.env:SW}``, ``${now:...}``) resolved,
    so that the check sees the folder that would be written, not the override's literal text."""
    if "${" not in name:
        return name
    from hydra.core.utils import setup_globals
    from omegaconf import OmegaConf

    from dapo_exp.config import ConfigError

    try:
        setup_globals()  # Hydra's own resolvers (now, ...), as the sweep will have them
        return str(OmegaConf.create({"sweep": name}).sweep)
    except Exception as exc:  # noqa: BLE001 - any resolver failure: refuse, naming it
        raise ConfigError(f"sweep={name}: cannot resolve it before the sweep starts ({exc}); give the sweep a "
                          "literal name, e.g. sweep=clip_vs_grpo") from None


# --------------------------------------------------------------------------- #
# torch's thread count                                                          #
# --------------------------------------------------------------------------- #
THREADS_ENV = "DAPO_THREADS"  # the override: a positive integer
SMALL_MODEL_PARAMS = 5_000_000  # below this, one step is bound by per-op overhead: one thread is fastest


def model_params_estimate(model: Any) -> int | None:
    """Parameters of the embedded toy (``model.path=tiny``) from its width and depth (12 L h^2 + the
    embeddings); None for any other model (its size is known only once loaded)."""
    try:
        if str(model.get("path")) != "tiny":
            return None
        h, layers = int(model.get("hidden_size")), int(model.get("num_layers"))
    except (AttributeError, TypeError, ValueError):
        return None
    return 12 * layers * h * h + 2 * 64 * h


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def choose_threads(params: int | None, cores: int, load: float | None,
                   env: dict | None = None, recorded: int | None = None) -> tuple[int, str]:
    """torch's intra-op thread count for a run and why:

    1. ``DAPO_THREADS=<n>`` is kept (said to differ from ``recorded`` when it does);
    2. ``recorded``: the count a resumed run started with (:func:`dapo_exp.rundir.recorded_threads`), whatever
       ``OMP_NUM_THREADS`` or the parallel launcher offers now: float reductions depend on the thread count, so
       only the same count resumes to the numbers of an uninterrupted run;
    3. ``OMP_NUM_THREADS=<n>`` (set and not empty: the user's, or the parallel launcher's per job) is kept;
    4. a small model (under :data:`SMALL_MODEL_PARAMS`, the 0.33M-parameter toy) gets one thread:
       its ops are too small to split, and more threads only contend with whatever else runs;
    5. otherwise the cores not busy: ``cores - round(1-minute load average)``, at least 1.
    """
    env = os.environ if env is None else env
    n = _thread_count(THREADS_ENV, env)
    if n is not None:
        differs = (f"; the run started with {recorded}: its numbers will differ from an uninterrupted run's in "
                   f"float rounding" if recorded is not None and recorded != n else "")
        return n, f"{THREADS_ENV}={n}{differs}"
    omp = _thread_count("OMP_NUM_THREADS", env)
    if recorded is not None:
        return recorded, ("the count this run started with, kept on resume so that it resumes to the same numbers"
                          + (f" (OMP_NUM_THREADS={omp} offered)" if omp not in (None, recorded) else "")
                          + f"; {THREADS_ENV}=<n> for another")
    if omp is not None:
        return omp, f"OMP_NUM_THREADS={omp}"
    if params is not None and params < SMALL_MODEL_PARAMS:
        return 1, (f"a small model ({params / 1e6:.2f}M parameters): 1 thread; set {THREADS_ENV}=<n> "
                   f"for another count")
    if load is None:
        return cores, f"{cores} cores (no load average here); set {THREADS_ENV}=<n> for another count"
    n = max(1, min(cores, cores - int(round(load))))
    return n, f"{cores} cores, load average {load:.2f}: {n} free; set {THREADS_ENV}=<n> for another count"


def _thread_count(var: str, env: Any) -> int | None:
    """The positive integer ``env[var]`` holds; None where it is unset or empty; refused otherwise."""
    value = str(env.get(var, "")).strip()
    if not value:
        return None
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        from dapo_exp.config import ConfigError

        raise ConfigError(f"{var}={value}: must be a positive integer (torch's thread count)")
    return n


# Python's cyclic garbage collector, for the processes that run the trainer: its youngest generation collected after
# 10,000 net allocations of container objects instead of CPython 3.11's and 3.12's 700 (3.13 took 2,000). At 700,
# the objects that torch, transformers and each Hydra composition create survive into the oldest generation in
# bulk, and each of the full collections that follow walks all of them: on this project's 2-core machine
# (2026-12-01), 1.08-1.35 of the 13.6-16.0 CPU-s of a 2-step toy `python run.py` (8 full collections) and 7.5 of the
# 58 CPU-s of `pytest tests/test_family.py` (26) went to the collector; at 10,000, 0.43-0.54 (1) and 3.0 (8), the
# latter's process 47 CPU-s. Six interleaved pairs of that toy run: 1.06 CPU-s less on average (median 1.50), peak
# memory 6 MB more of 517.
# sweeps/results/2026-11-29-ci-cpu/README.md has the measurement and its commands.
GC_YOUNG = 10_000


def set_gc() -> None:
    """Raise the collector's youngest threshold to :data:`GC_YOUNG` (a higher one, set by the user, is kept);
    called by ``run.py`` before it composes and in each job it runs (a launcher's worker process too), and by the
    test suite's processes."""
    import gc

    young, *older = gc.get_threshold()
    if young < GC_YOUNG:
        gc.set_threshold(GC_YOUNG, *older)


def set_threads(cfg: Any, recorded: int | None = None) -> tuple[int, str]:
    """Pick (:func:`choose_threads`; ``recorded``: the count of the run this one resumes) and set torch's thread
    count for the run of ``cfg``; returns (n, why)."""
    import torch

    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = None
    n, why = choose_threads(model_params_estimate(cfg.get("model")), available_cores(), load, recorded=recorded)
    torch.set_num_threads(n)
    return n, why
