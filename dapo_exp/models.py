"""The policy: the embedded tiny model (built and warm-started in code) or any HF causal LM.

:func:`build_tiny_model` builds a real ``transformers`` ``Qwen2ForCausalLM`` (~0.3M
parameters) for the character-level ``PreTrainedTokenizerFast`` of
:func:`build_char_tokenizer`. ``model.path=tiny`` warm-starts it on the toy task
(:mod:`dapo_exp.tasks.arith_warmstart`, beside the task it learns), saves it with
``save_pretrained``, and loads it through exactly the same code as any HF model id
or local directory (:func:`load_policy`). So the toy exercises the real loading path.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
from pathlib import Path
from typing import Any

import torch

from dapo_exp.config import ConfigError

log = logging.getLogger(__name__)

CHARS = "0123456789+-*/=()?:.,! \nabcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
CHAR_SPECIALS = ("<pad>", "<unk>", "<bos>", "<eos>")


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


# the special tokens of build_char_tokenizer as a Qwen2 tokenizer names them (same ids): verl's agent loop
# finds the turn end by the name <|im_end|>, and ChatML templates need <|im_start|> (given the first filler id)
QWEN_SPECIALS = ("<|endoftext|>", "<unk>", "<bos>", "<|im_end|>")
QWEN_IM_START = "<|im_start|>"


def _byte_level_chars() -> dict[int, str]:
    """GPT-2's byte-to-unicode table (the alphabet of byte-level BPE vocabularies, Qwen2's included)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1), *range(ord("\u00ae"), 256)]
    table, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in table:
            table[b], extra = chr(256 + extra), extra + 1
    return table


def build_qwen_char_tokenizer(vocab_size: int | None = None, chat_template: str | None = None):
    """:func:`build_char_tokenizer`'s vocabulary, ids and text as a byte-level BPE without merges, the form
    transformers' ``Qwen2Tokenizer`` rebuilds from a ``qwen2`` checkpoint (``AutoTokenizer``, as verl and
    vLLM load it): one token per character, ``"\\n"`` one token, the specials named :data:`QWEN_SPECIALS`
    (EOS ``<|im_end|>``, pad ``<|endoftext|>``) and, when ``vocab_size`` leaves a filler id, ``<|im_start|>``
    on the first one. Same ids as :func:`build_char_tokenizer` for every text of :data:`CHARS`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_char = _byte_level_chars()
    tokens = list(QWEN_SPECIALS) + [byte_char[ord(c)] for c in CHARS]
    fillers = 0 if vocab_size is None else vocab_size - len(tokens)
    if fillers < 0:
        raise ValueError(f"vocab_size must be >= {len(tokens)}, got {vocab_size}")
    tokens += ([QWEN_IM_START] if fillers else []) + [f"<t{i}>" for i in range(1, fillers)]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    out = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=QWEN_SPECIALS[0], unk_token=QWEN_SPECIALS[1],
                                  bos_token=QWEN_SPECIALS[2], eos_token=QWEN_SPECIALS[3], padding_side="left",
                                  additional_special_tokens=[QWEN_IM_START] if fillers else [])
    if chat_template is not None:
        out.chat_template = chat_template
    return out


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
# Loading (the same code for the tiny model and for any HF model)               #
# --------------------------------------------------------------------------- #
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_tokenizer(path: str, trust_remote_code: bool = False, local_files_only: bool = False):
    """``AutoTokenizer``, except for a local tokenizer saved as a plain ``tokenizers`` backend.

    transformers 5 maps a ``qwen2`` config to ``Qwen2Tokenizer`` and rebuilds its
    byte-level pre-tokenizer even when ``tokenizer_config.json`` names the generic
    class, which silently drops the newlines of our character-level tokenizer; a
    tokenizer saved as ``TokenizersBackend`` / ``PreTrainedTokenizerFast`` is
    therefore loaded as exactly what ``tokenizer.json`` says. ``local_files_only``: a hub
    id is read from the Hugging Face cache without asking the hub.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok_cfg = Path(path) / "tokenizer_config.json"
    if tok_cfg.exists() and (Path(path) / "tokenizer.json").exists():
        cls = json.loads(tok_cfg.read_text()).get("tokenizer_class")
        if cls in ("TokenizersBackend", "PreTrainedTokenizerFast"):
            return PreTrainedTokenizerFast.from_pretrained(path)
    extra = {"local_files_only": True} if local_files_only else {}
    return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code, **extra)


def load_policy(path: str, dtype: str = "float32", device: str = "cpu", trust_remote_code: bool = False):
    """Load ``(tokenizer, model)`` from an HF id or a local directory.

    The tokenizer gets a pad token (EOS if it has none) and left padding (for
    batched generation); the model is put in eval mode on ``device``.
    """
    from transformers import AutoModelForCausalLM

    # a hub id: one short request first, so that an unreachable hub is one clear error
    # (ModelSourceError) instead of a minute of retries and a chained traceback
    cache_only = check_hub_model(path) == "cache"
    tokenizer = load_tokenizer(path, trust_remote_code, local_files_only=cache_only)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    torch_dtype = "auto" if dtype == "auto" else _DTYPES[dtype]
    extra = {"local_files_only": True} if cache_only else {}
    from safetensors import SafetensorError

    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, trust_remote_code=trust_remote_code,
                                                     **extra)
    except pickle.UnpicklingError:  # a pickle holding more than tensors: torch refuses to run its code
        weights = ", ".join(f for f in MODEL_WEIGHTS if (Path(path) / f).is_file()) or "its weights"
        raise ModelSourceError(
            f"model.path={path}: {weights} is a pickle holding more than tensors (a whole pickled model), which is "
            f"never unpickled here (it could run code); save the model with save_pretrained (safetensors). "
            f"{_MODEL_DIR}") from None
    except (OSError, ValueError, RuntimeError, KeyError, SafetensorError) as exc:  # damaged weights or config
        files = [f for f in MODEL_WEIGHTS + ("config.json",) if (Path(path) / f).is_file()] if Path(path).is_dir() else []
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise ModelSourceError(
            f"model.path={path}: cannot load the model from {', '.join(files) or 'it'} ({type(exc).__name__}: {first}); "
            f"the weights or config.json are damaged or not a causal LM's. {_MODEL_DIR}") from exc
    model.to(device)
    model.eval()
    return tokenizer, model


class ModelSourceError(ConfigError, FileNotFoundError):
    """``model.path`` names a local directory that does not exist or holds no model, or a hub
    id that can be neither downloaded (hub unreachable) nor found in the Hugging Face cache."""


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


_OFFLINE_MODEL_HINT = (
    "Offline, point model.path at a local directory holding the model (model.path=/path/to/model_dir, "
    "e.g. one written by `hf download <id> --local-dir /path/to/model_dir` on a machine with network), "
    "or set HF_HUB_OFFLINE=1 to use a copy already in the Hugging Face cache"
)
HUB_TIMEOUT_S = 5.0  # seconds to wait for the hub's answer about a model before calling it unreachable
# (endpoint, model id) -> "hub" | "cache": one request per model per process
_HUB_STATUS: dict[tuple[str, str], str] = {}


def _looks_local(path: str) -> bool:
    return path.startswith(("/", "./", "../", "~")) or os.path.isdir(os.path.expanduser(path))


def _one_line(exc: BaseException, limit: int = 200) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:limit]}" if text else type(exc).__name__


def _in_hf_cache(model_id: str) -> bool:
    """True if the Hugging Face cache holds ``config.json`` of ``model_id`` (a previous download)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(model_id, "config.json"), str)
    except Exception:  # noqa: BLE001 - an id the cache cannot even name: not cached
        return False


def check_hub_model(path: str) -> str:
    """Where a Hugging Face model id will be loaded from: ``"local"`` (not a hub id: ``tiny`` or
    a local path), ``"hub"`` (the hub answered) or ``"cache"`` (the hub cannot be reached, or
    ``HF_HUB_OFFLINE=1``, and the Hugging Face cache holds the model).

    One request to the hub (``HF_ENDPOINT``), with a :data:`HUB_TIMEOUT_S` time-out and no
    retries, remembered for the process. If the hub cannot be reached and the cache does not
    hold the model, raises :class:`ModelSourceError` with one line naming ``model.path=<local dir>``
    as the fix (``transformers`` would otherwise retry for about a minute and end in a long
    chained traceback). An HTTP answer (not found, gated, ...) counts as reachable: loading
    reports it.
    """
    from dapo_exp.packaged_models import is_packaged

    if path == "tiny" or is_packaged(path) or _looks_local(path):
        return "local"
    from huggingface_hub import constants

    endpoint = os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
    key = (endpoint, path)
    if key in _HUB_STATUS:
        return _HUB_STATUS[key]
    if _hub_offline():
        if not _in_hf_cache(path):
            raise ModelSourceError(
                f"model.path={path!r}: HF_HUB_OFFLINE is set and the Hugging Face cache does not hold this model. "
                f"{_OFFLINE_MODEL_HINT}"
            )
        _HUB_STATUS[key] = "cache"
        return "cache"
    from huggingface_hub import HfApi
    from huggingface_hub.utils import HfHubHTTPError

    try:
        HfApi(endpoint=endpoint).model_info(path, timeout=HUB_TIMEOUT_S)
        status = "hub"
    except HfHubHTTPError:
        status = "hub"  # the hub answered (not found, gated, ...): from_pretrained reports it
    except Exception as exc:  # noqa: BLE001 - connection refused, DNS, time-out: unreachable
        if not _in_hf_cache(path):
            raise ModelSourceError(
                f"model.path={path!r}: cannot reach the Hugging Face hub at {endpoint} "
                f"({_one_line(exc)}) and the Hugging Face cache does not hold this model. {_OFFLINE_MODEL_HINT}"
            ) from None
        log.warning("model.path=%s: the Hugging Face hub at %s cannot be reached (%s); loading the cached copy",
                    path, endpoint, _one_line(exc))
        status = "cache"
    _HUB_STATUS[key] = status
    return status


def _hub_offline() -> bool:
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def check_model_source(path: str) -> None:
    """Fail early, before any compute, when ``model.path`` is a local directory that does not
    exist or does not hold a model (config, weights and tokenizer files).

    Strings that look like a local path (absolute, ``./``, ``~``, or an existing directory)
    are checked; other strings are treated as HF hub ids and are only checked when loading
    (:func:`check_hub_model`, called by :func:`load_policy`: one short request to the hub).
    Raises :class:`ModelSourceError` (a ``ConfigError`` and a ``FileNotFoundError``).
    """
    from dapo_exp.packaged_models import is_packaged

    if path == "tiny" or is_packaged(path):  # built or converted on first use (packaged: checked by the preflight)
        return
    expanded = os.path.expanduser(path)
    if not _looks_local(path):
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
