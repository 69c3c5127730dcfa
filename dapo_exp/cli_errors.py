"""Command-line errors as one clear line: bad config values, Hydra composition errors, misspelt keys.

``python run.py`` runs Hydra's entry point inside :func:`one_line_errors`. A
:class:`~dapo_exp.config.ConfigError` (a bad value, a missing data file, a model
directory without a model) or a Hydra composition error (an unknown key, an unknown
option of a config group, a value of the wrong type, an unparsable override) is
printed as ``error: <what is wrong and how to fix it>`` on stderr, without a traceback,
and the command exits with status 2. A misspelt key gets the closest valid key
(``optim.lrr=1`` -> ``did you mean optim.lr?``; ``train.lr=1`` -> ``did you mean optim.lr?``:
the full key, :func:`closest_key`; ``algo.clip_hgih=0.3`` -> ``did you mean algo.eps_high?``: a
word of the key read as the schema's word for the same thing, :data:`SYNONYMS`), never Hydra's
hint to add it with ``+optim.lrr=1``; a key added that way anyway is refused by
:func:`check_known_keys`, because the trainer would silently ignore it. An override Hydra cannot
parse is named, with the quoting a value holding ``=`` needs on a shell command line
(``"sweep='fixes=grpo,clip'"``). Any other error keeps its traceback
(``HYDRA_FULL_ERROR=1`` set by the user keeps Hydra's own reporting for everything).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import os
import re
import sys
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

EXIT_CODE = 2  # a usage error, as argparse


def schema_keys(schema: type | None = None, prefix: str = "") -> list[str]:
    """Every dotted key of the typed schema (``seed``, ``optim.lr``, ...)."""
    from dapo_exp.config import Config

    hints = typing.get_type_hints(schema or Config)
    keys = []
    for name, typ in hints.items():
        keys.append(prefix + name)
        if dataclasses.is_dataclass(typ):
            keys += schema_keys(typ, f"{prefix}{name}.")
    return keys


def config_groups(config_dir: str | os.PathLike) -> list[str]:
    """The config groups under ``config_dir`` (``task``, ``fixes``, ``hydra/launcher``, ...)."""
    root = Path(config_dir)
    return sorted(str(p.parent.relative_to(root)) for p in root.rglob("*.yaml") if p.parent != root)


def suggestion(word: str, choices: list[str]) -> str:
    """``"; did you mean X?"`` for the closest of ``choices`` (difflib), or ``""``."""
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


# Words a user may write for what the schema names otherwise, each word of a key's last part read
# as the schema's: the clip range of the PPO ratio is epsilon (algo.clip_high -> algo.eps_high), the
# group size G is rollout.n. Only words that mean one thing in every section belong here.
SYNONYMS: dict[str, str] = {
    "clip": "eps",
    "epsilon": "eps",
    "learning_rate": "lr",
    "temp": "temperature",
    "group_size": "n",
}


def _leaf(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def _vocabulary_word(part: str, vocabulary: set[str]) -> str:
    """``part`` as a word of the keys' names: itself, an anagram of one (``hgih`` -> ``high``), or the
    closest one (difflib, cutoff 0.75); else itself."""
    if part in vocabulary:
        return part
    anagrams = sorted(w for w in vocabulary if len(w) > 2 and sorted(w) == sorted(part))
    if anagrams:
        return anagrams[0]
    close = difflib.get_close_matches(part, sorted(vocabulary), n=1, cutoff=0.75)
    return close[0] if close else part


def meant_key(word: str, keys: list[str]) -> str | None:
    """The key whose last part ``word``'s last part names in other words (:data:`SYNONYMS`), each of
    its words first spelt as the keys' own (``algo.clip_hgih`` -> ``clip_high`` -> ``eps_high``):
    ``algo.eps_high``, preferring the word's own section; None when no synonym applies or none matches."""
    section, leaf = word.rpartition(".")[0], _leaf(word)
    vocabulary = {part for k in keys for part in _leaf(k).split("_")}
    vocabulary |= {part for phrase in SYNONYMS for part in phrase.split("_")}  # temp stays temp, not step
    spelt = "_".join(_vocabulary_word(part, vocabulary) for part in leaf.split("_"))
    for phrase, schema_word in SYNONYMS.items():
        renamed = re.sub(rf"(^|_){phrase}(?=_|$)", rf"\g<1>{schema_word}", spelt)
        if renamed == spelt:
            continue
        matches = [k for k in keys if _leaf(k) == renamed and k != word]
        if matches:
            return sorted(matches, key=lambda k: (k.rpartition(".")[0] != section, k))[0]
    return None


def closest_key(word: str, keys: list[str]) -> str | None:
    """The full dotted key of ``keys`` that ``word`` most likely meant, or None.

    A key's parent is never the answer (``train`` is a section, not what ``train.lr`` meant).
    Tried in order: a key with the same last part (``train.lr`` -> ``optim.lr``; among several,
    the closest whole key); a key the word names in other words (:func:`meant_key`:
    ``algo.clip_hgih`` -> ``algo.eps_high``, not the closer-spelt ``algo.cispo_eps_high``); a key
    close as a whole (``optim.lrr`` -> ``optim.lr``, ``fixe`` -> ``fixes``); a key whose last part
    is close to the word's (``train.lrr`` -> ``optim.lr``).
    """
    leaf = word.rsplit(".", 1)[-1]
    pool = [k for k in keys if k != word and not word.startswith(k + ".")]
    same_leaf = [k for k in pool if k.rsplit(".", 1)[-1] == leaf]
    if same_leaf:
        return difflib.get_close_matches(word, same_leaf, n=1, cutoff=0.0)[0]
    meant = meant_key(word, pool)
    if meant:
        return meant
    whole = difflib.get_close_matches(word, pool, n=5, cutoff=0.6)
    for k in whole:  # close as a whole and in its last part: not a sibling with another name
        if difflib.SequenceMatcher(None, leaf, k.rsplit(".", 1)[-1]).ratio() >= 0.6:
            return k
    by_leaf: dict[str, list[str]] = {}
    for k in pool:
        by_leaf.setdefault(k.rsplit(".", 1)[-1], []).append(k)
    close = difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.75)
    if close:
        return difflib.get_close_matches(word, by_leaf[close[0]], n=1, cutoff=0.0)[0]
    return whole[0] if whole else None


def key_suggestion(word: str, keys: list[str]) -> str:
    """``"; did you mean X?"`` for :func:`closest_key`, or ``""``."""
    key = closest_key(word, keys)
    return f"; did you mean {key}?" if key else ""


def unknown_keys(cfg: Any) -> list[str]:
    """Keys of a composed config that the schema does not declare (added with ``+key=...``).

    Free-form fields of the schema (``notes``: a dict) may hold any key.
    """
    from omegaconf import OmegaConf

    from dapo_exp.config import Config

    def walk(node: dict, schema: type, prefix: str) -> list[str]:
        hints = typing.get_type_hints(schema)
        out = []
        for key, value in node.items():
            if key not in hints:
                out.append(f"{prefix}{key}")
            elif dataclasses.is_dataclass(hints[key]) and isinstance(value, dict):
                out += walk(value, hints[key], f"{prefix}{key}.")
        return out

    return walk(OmegaConf.to_container(cfg, resolve=False), Config, "")


def check_known_keys(cfg: Any) -> None:
    """Raise :class:`~dapo_exp.config.ConfigError` for a key the schema does not declare."""
    from dapo_exp.config import ConfigError

    extra = unknown_keys(cfg)
    if extra:
        key = extra[0]
        raise ConfigError(
            f"{key} is not a config key{key_suggestion(key, schema_keys())} (adding it with +{key}=... would train "
            f"with it silently ignored; `python run.py --cfg job` prints every key)"
        )


def _override_key(text: str) -> str | None:
    m = re.search(r"Could not (?:override|append to config|delete from config)[^']*'([^']+)'", text)
    return m.group(1) if m else None


def describe(exc: BaseException, config_dir: str | os.PathLike) -> str | None:
    """The one-line message for a config or composition error; None for any other error."""
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

    from dapo_exp.config import ConfigError

    if isinstance(exc, ConfigError):
        return " ".join(str(exc).split())
    if isinstance(exc, MissingConfigException):
        group, _, name = (exc.missing_cfg_file or "").rpartition("/")
        options = list(exc.options or [])
        if group and options:
            return f"{group}={name}: no such option{suggestion(name, options)} (choose one of: {', '.join(options)})"
        return " ".join(str(exc).split())
    if isinstance(exc, ConfigCompositionException):
        text = str(exc)
        cause = exc.__cause__
        key = getattr(cause, "full_key", None) or _override_key(text)
        unknown = isinstance(cause, (ConfigKeyError, ConfigAttributeError)) or "No match in the defaults list" in text
        if key and unknown:
            choices = schema_keys() + config_groups(config_dir)
            return f"{key} is not a config key or group{key_suggestion(key, choices)} " \
                   f"(`python run.py --cfg job` prints every key)"
        first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
        if isinstance(cause, OmegaConfBaseException) and str(cause.msg).strip():
            what = re.sub(r"^Error merging override ", "", first).rstrip(".")
            return f"{what}: {str(cause.msg).strip().splitlines()[0]}"  # later lines: full_key, types
        return " ".join(text.split())
    if isinstance(exc, OverrideParseException):
        return parse_error(getattr(exc, "override", None), str(getattr(exc, "message", None) or exc))
    return None


def parse_error(override: str | None, message: str) -> str:
    """The one line for an override Hydra's parser refuses: the override, Hydra's reason (without its
    link to the grammar), and, for a value holding ``=`` (``sweep=fixes=grpo,clip``: the shell took the
    quotes away), the quoting that survives the shell."""
    reason = " ".join(message.split("See https://hydra.cc", 1)[0].split()).rstrip(".")
    if not override:
        return f"cannot parse the override: {reason}"
    line = f"cannot parse the override {override}: {reason}"
    key, eq, value = override.partition("=")
    if eq and "=" in value:
        line += (f"; a value holding '=' must reach Hydra quoted, so quote it twice on the command line: "
                 f"\"{key}='{value.strip(chr(39))}'\"")
    return line + " (the override grammar: https://hydra.cc/docs/advanced/override_grammar/basic/)"


_enabled = False  # inside one_line_errors, and the user did not ask for Hydra's full errors


@contextlib.contextmanager
def one_line_errors(config_dir: str | os.PathLike) -> Iterator[None]:
    """Print config and composition errors raised inside as one line and exit with :data:`EXIT_CODE`.

    Hydra prints errors itself unless ``HYDRA_FULL_ERROR`` is set; it is set here (when the
    user has not set it: then Hydra's own reporting stays) so that errors reach this handler.
    """
    global _enabled
    if "HYDRA_FULL_ERROR" in os.environ:
        yield
        return
    os.environ["HYDRA_FULL_ERROR"] = "1"
    _enabled = True
    try:
        yield
    except Exception as exc:
        exit_if_config_error(exc, config_dir)
        raise
    finally:
        _enabled = False
        os.environ.pop("HYDRA_FULL_ERROR", None)


def exit_if_config_error(exc: BaseException, config_dir: str | os.PathLike) -> None:
    """Inside :func:`one_line_errors`: if ``exc`` is a config error, print it as one line and exit
    with :data:`EXIT_CODE`; otherwise return (the caller re-raises).

    ``run.py``'s job function calls it itself, so that Hydra's "Error executing job" line is
    not printed before the message.
    """
    message = describe(exc, config_dir) if _enabled else None
    if message is not None:
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_CODE) from None
