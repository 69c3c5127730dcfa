"""The policy: the embedded tiny model (built and warm-started in code) or any HF causal LM.

``model.path=tiny`` builds a real ``transformers`` ``Qwen2ForCausalLM`` (~0.3M
parameters) with a character-level ``PreTrainedTokenizerFast``, warm-starts it by
a short supervised phase on ``arith`` solutions, saves it with ``save_pretrained``
to a cache directory keyed by the settings, and then loads it through exactly the
same code as any HF model id or local directory (``load_policy``). So the toy
exercises the real loading path.

The warm start is deliberately imperfect: a fraction of its training solutions end
with a wrong answer and a fraction ramble past the length cap, so the base policy
is neither hopeless nor perfect (held-out avg@k roughly 20-60%) and some samples
are truncated, which is what the overlong fixes act on. It uses its own fixed
seed, so every run of a sweep starts from the same base policy.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from dapo_exp.config import ConfigError

log = logging.getLogger(__name__)

WARMSTART_SEED = 20250317  # fixed: the base policy must not depend on the run seed
WARMSTART_VERSION = 3  # bump when the warm-start recipe changes (invalidates caches)
CHARS = "0123456789+-*/=()?:.,! \nabcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
CHAR_SPECIALS = ("<pad>", "<unk>", "<bos>", "<eos>")
_RAMBLE = ["hmm wait", "let me check", "check again", "not sure", "recount", "so far so good"]


# --------------------------------------------------------------------------- #
# Tokenizer                                                                     #
# --------------------------------------------------------------------------- #
def build_char_tokenizer(vocab_size: int | None = None):
    """A character-level ``PreTrainedTokenizerFast`` (one token per character of :data:`CHARS`).

    Ids: the :data:`CHAR_SPECIALS` first (``<pad>`` 0, ``<unk>`` 1, ``<bos>`` 2, ``<eos>`` 3), then
    the characters. ``vocab_size`` pads the vocabulary with ``<tN>`` filler tokens up to that size
    (the benchmarks' random models of a given vocabulary size use this).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokens = list(CHAR_SPECIALS) + list(CHARS)
    if vocab_size is not None:
        if vocab_size < len(tokens):
            raise ValueError(f"vocab_size must be >= {len(tokens)}, got {vocab_size}")
        tokens += [f"<t{i}>" for i in range(vocab_size - len(tokens))]
    tok = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(tokens)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<bos>",
        eos_token="<eos>",
        padding_side="left",
    )


def build_tiny_model(tokenizer: Any, hidden_size: int, num_layers: int, num_heads: int, seed: int):
    """A small ``Qwen2ForCausalLM`` with random weights (seeded)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 3,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=max(1, num_heads // 2),
        max_position_embeddings=256,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model


# --------------------------------------------------------------------------- #
# Warm start                                                                    #
# --------------------------------------------------------------------------- #
def _warmstart_key(model_cfg: Any, task_cfg: Any, max_response_len: int) -> str:
    keys = {
        "version": WARMSTART_VERSION,
        "chars": CHARS,
        "model": {
            k: getattr(model_cfg, k)
            for k in (
                "hidden_size",
                "num_layers",
                "num_heads",
                "warmstart_steps",
                "warmstart_lr",
                "warmstart_batch_size",
                "warmstart_long_frac",
                "warmstart_wrong_frac",
            )
        },
        "task": {
            k: getattr(task_cfg, k)
            for k in ("arith_seed", "arith_n_train", "arith_max_operand", "arith_n_operands_max", "arith_ops")
        },
        "max_response_len": max_response_len,
    }
    blob = json.dumps(keys, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _warmstart_text(rng: random.Random, problem: Any, long_frac: float, wrong_frac: float, cap: int) -> str:
    """A supervised target: the reference solution, sometimes wrong, sometimes rambling past the cap."""
    steps = list(problem.meta["steps"])
    answer = int(problem.answer)
    if rng.random() < wrong_frac:
        answer += rng.choice([-10, -2, -1, 1, 2, 10])
        steps[-1] = steps[-1].rsplit("=", 1)[0] + f"={answer}"
    from dapo_exp.tasks.arith import solution_text

    text = solution_text(steps, answer)
    if rng.random() < long_frac:
        ramble = []
        while sum(len(r) + 1 for r in ramble) < cap:
            ramble.append(rng.choice(_RAMBLE))
        text = "\n".join(ramble) + "\n" + text
    return text


def warm_start(model: Any, tokenizer: Any, model_cfg: Any, task_cfg: Any, max_response_len: int) -> dict[str, float]:
    """Supervised phase on (imperfect) solutions of the train problems; returns stats."""
    from dapo_exp.tasks.arith import load_arith

    data = load_arith(task_cfg)
    rng = random.Random(WARMSTART_SEED)
    torch.manual_seed(WARMSTART_SEED)
    opt = torch.optim.AdamW(model.parameters(), lr=model_cfg.warmstart_lr, weight_decay=0.0)
    steps = model_cfg.warmstart_steps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * max(0.05, 1 - s / max(1, steps)))
    model.train()
    bos, eos, pad = tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
    t0 = time.time()
    loss_val = float("nan")
    for _ in range(steps):
        batch = rng.sample(data.train, model_cfg.warmstart_batch_size)
        rows, labels = [], []
        for p in batch:
            prompt = [bos] + tokenizer(p.prompt, add_special_tokens=False)["input_ids"]
            target = tokenizer(
                _warmstart_text(
                    rng, p, model_cfg.warmstart_long_frac, model_cfg.warmstart_wrong_frac, max_response_len
                ),
                add_special_tokens=False,
            )["input_ids"]
            target = (target + [eos])[: max_response_len + 8]
            rows.append(prompt + target)
            labels.append([-100] * len(prompt) + target)
        width = max(len(r) for r in rows)
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
        lab = torch.tensor([lb + [-100] * (width - len(lb)) for lb in labels])
        att = (torch.arange(width)[None, :] < torch.tensor([len(r) for r in rows])[:, None]).long()
        loss = model(input_ids=ids, attention_mask=att, labels=lab).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        loss_val = loss.item()
    model.eval()
    return {"warmstart/loss": loss_val, "warmstart/seconds": time.time() - t0, "warmstart/steps": steps}


def ensure_tiny_checkpoint(model_cfg: Any, task_cfg: Any, max_response_len: int) -> str:
    """Path of the warm-started tiny model, building it on first use (cached, process-safe)."""
    from filelock import FileLock

    cache_root = Path(os.path.expanduser(model_cfg.cache_dir))
    cache_root.mkdir(parents=True, exist_ok=True)
    key = _warmstart_key(model_cfg, task_cfg, max_response_len)
    target = cache_root / f"tiny-{key}"
    with FileLock(str(cache_root / f"tiny-{key}.lock")):
        if (target / "config.json").exists():
            return str(target)
        log.info("building the warm-started tiny model (once; cached at %s)", target)
        n_threads = torch.get_num_threads()
        tokenizer = build_char_tokenizer()
        model = build_tiny_model(
            tokenizer, model_cfg.hidden_size, model_cfg.num_layers, model_cfg.num_heads, WARMSTART_SEED
        )
        stats = warm_start(model, tokenizer, model_cfg, task_cfg, max_response_len)
        torch.set_num_threads(n_threads)
        tmp = Path(tempfile.mkdtemp(dir=cache_root, prefix=".tmp-"))
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "warmstart.json").write_text(json.dumps(stats, indent=1))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
        log.info("warm start done in %.1fs (final loss %.3f)", stats["warmstart/seconds"], stats["warmstart/loss"])
    return str(target)


# --------------------------------------------------------------------------- #
# Loading (the same code for the tiny model and for any HF model)               #
# --------------------------------------------------------------------------- #
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_model_path(model_cfg: Any, task_cfg: Any, max_response_len: int) -> str:
    """``tiny`` -> the warm-started cache dir; anything else is an HF id or a local dir."""
    if model_cfg.path == "tiny":
        return ensure_tiny_checkpoint(model_cfg, task_cfg, max_response_len)
    return os.path.expanduser(model_cfg.path)


def load_tokenizer(path: str, trust_remote_code: bool = False):
    """``AutoTokenizer``, except for a local tokenizer saved as a plain ``tokenizers`` backend.

    transformers 5 maps a ``qwen2`` config to ``Qwen2Tokenizer`` and rebuilds its
    byte-level pre-tokenizer even when ``tokenizer_config.json`` names the generic
    class, which silently drops the newlines of our character-level tokenizer; a
    tokenizer saved as ``TokenizersBackend`` / ``PreTrainedTokenizerFast`` is
    therefore loaded as exactly what ``tokenizer.json`` says.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok_cfg = Path(path) / "tokenizer_config.json"
    if tok_cfg.exists() and (Path(path) / "tokenizer.json").exists():
        cls = json.loads(tok_cfg.read_text()).get("tokenizer_class")
        if cls in ("TokenizersBackend", "PreTrainedTokenizerFast"):
            return PreTrainedTokenizerFast.from_pretrained(path)
    return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)


def load_policy(path: str, dtype: str = "float32", device: str = "cpu", trust_remote_code: bool = False):
    """Load ``(tokenizer, model)`` from an HF id or a local directory.

    The tokenizer gets a pad token (EOS if it has none) and left padding (for
    batched generation); the model is put in eval mode on ``device``.
    """
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(path, trust_remote_code)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    torch_dtype = "auto" if dtype == "auto" else _DTYPES[dtype]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, trust_remote_code=trust_remote_code)
    model.to(device)
    model.eval()
    return tokenizer, model


class ModelSourceError(ConfigError, FileNotFoundError):
    """``model.path`` names a local directory that does not exist or holds no model."""


# What a model directory (``save_pretrained`` of the model and of its tokenizer) must hold.
MODEL_WEIGHTS = (
    "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json",
)
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model", "tokenizer_config.json",
)
_MODEL_DIR = (
    "a model directory is what save_pretrained writes for a model and its tokenizer: config.json, the weights "
    "(model.safetensors, or shards with model.safetensors.index.json, or pytorch_model.bin) and the tokenizer "
    "files (tokenizer.json, or tokenizer.model, or vocab.json + merges.txt, with tokenizer_config.json). "
    "Or give a Hugging Face id (model.path=Qwen/Qwen2.5-0.5B-Instruct) or model.path=tiny"
)


def check_model_source(path: str) -> None:
    """Fail early, before any compute, when ``model.path`` is a local directory that does not
    exist or does not hold a model (config, weights and tokenizer files).

    Strings that look like a local path (absolute, ``./``, ``~``, or an existing directory)
    are checked; other strings are treated as HF hub ids and are only checked when loading.
    Raises :class:`ModelSourceError` (a ``ConfigError`` and a ``FileNotFoundError``).
    """
    if path == "tiny":
        return
    expanded = os.path.expanduser(path)
    looks_local = path.startswith(("/", "./", "../", "~")) or os.path.isdir(expanded)
    if not looks_local:
        return
    if not os.path.isdir(expanded):
        raise ModelSourceError(f"model.path={path!r}: no such local directory; {_MODEL_DIR}")
    here = Path(expanded)
    missing = []
    if not (here / "config.json").is_file():
        missing.append("config.json")
    if not any((here / f).is_file() for f in MODEL_WEIGHTS) and not any(here.glob("*.safetensors")):
        missing.append("weights")
    if not any((here / f).is_file() for f in TOKENIZER_FILES):
        missing.append("tokenizer files")
    if missing:
        raise ModelSourceError(f"model.path={path!r} holds no model (no {', '.join(missing)}); {_MODEL_DIR}")
