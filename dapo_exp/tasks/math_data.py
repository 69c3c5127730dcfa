"""Math data sets as :class:`~dapo_exp.tasks.base.Problem` rows: DAPO-Math-17k, AIME 2024, GSM8K, MATH-500.

A *source* (``task.train_source`` / ``task.eval_source``) is one of:

- a known alias or Hugging Face id (:data:`KNOWN_SOURCES`), loaded with
  ``datasets.load_dataset``: ``dapo_math_17k`` = ``BytedTsinghua-SIA/DAPO-Math-17k``,
  ``aime24`` = ``BytedTsinghua-SIA/AIME-2024``, ``gsm8k_train`` / ``gsm8k_test`` (or
  ``openai/gsm8k``, split by role), ``math500`` = ``HuggingFaceH4/MATH-500``;
- ``hf:<owner>/<name>[@<split>]``: any other HF data set in one of the schemas below
  (split default ``train``);
- a local ``.parquet``, ``.jsonl`` or ``.json`` file (schema detected from its columns;
  ids are prefixed with the file's stem, or with the alias for local copies of the
  known files, ``aime-2024.parquet`` -> ``aime24-<index>``).

Schemas and how their columns map to ``Problem(id, prompt, answer, meta)``:

- ``dapo`` (DAPO-Math-17k, AIME-2024; verl's format): ``prompt`` = list of
  ``{role, content}`` -> ``Problem.prompt`` = content of the last ``user`` message, kept
  as is (it already holds the paper's template); a list of more than that one message (a
  system message, few-shot turns before it) -> ``Problem.messages``, rendered whole by the
  model's chat template (a message whose role is not system, user or assistant, or whose content
  is not text, makes the row malformed); ``reward_model.ground_truth`` ->
  ``answer``; ``extra_info.index`` -> ``id`` suffix; ``extra_info.raw_problem`` (or the
  content with the template stripped) -> ``meta["problem"]``; ``data_source``,
  ``ability`` -> ``meta``.
- ``gsm8k`` (``openai/gsm8k``, config ``main``): ``question`` -> ``apply_template(question)``;
  ``answer`` = the text after the last ``####`` of the ``answer`` column, stripped
  (``"... #### 72"`` -> ``"72"``); the worked solution before it -> ``meta["solution"]``;
  row position -> ``id``.
- ``math500`` (``HuggingFaceH4/MATH-500``): ``problem`` -> ``apply_template(problem)``;
  ``answer`` column -> ``answer`` (LaTeX, e.g. ``\\frac{14}{3}``); ``unique_id``, ``subject``,
  ``level`` -> ``meta``; row position -> ``id``.

Loading deduplicates by prompt text (DAPO-Math-17k repeats each of its ~17.9k prompts
about 100 times; the AIME-2024 parquet holds 30 problems x 32 copies), keeping the first
occurrence, and skips rows whose prompt or answer is missing or malformed. Both counts
go to ``TaskData.stats`` and the log; nothing malformed raises. Eval sets are ordered
by their integer index when they have one (AIME: problems 0..29).

:func:`check_task_sources` (called by the trainer before any compute) resolves every
source and fails with :class:`TaskSourceError` naming the path or id.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import numbers
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dapo_exp.config import ConfigError
from dapo_exp.tasks.base import Problem, TaskData

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- #
# The paper's prompt template                                                   #
# --------------------------------------------------------------------------- #
TEMPLATE_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
TEMPLATE_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
# The DAPO prompt template (one user message, then the model's chat template).
PROMPT_TEMPLATE = TEMPLATE_PREFIX + "{problem}" + TEMPLATE_SUFFIX


def apply_template(problem: str) -> str:
    """The user message of the paper's template around a bare problem statement."""
    return TEMPLATE_PREFIX + problem + TEMPLATE_SUFFIX


def strip_template(content: str) -> str:
    """The bare problem of a templated user message (the content itself if it is not templated)."""
    if content.startswith(TEMPLATE_PREFIX) and content.endswith(TEMPLATE_SUFFIX):
        return content[len(TEMPLATE_PREFIX) : len(content) - len(TEMPLATE_SUFFIX)]
    return content


# --------------------------------------------------------------------------- #
# Sources                                                                       #
# --------------------------------------------------------------------------- #
class TaskSourceError(ConfigError):
    """A data source cannot be used (missing file, unknown id, bad option); names the field and the source."""


SCHEMAS = ("dapo", "gsm8k", "math500")
FILE_SUFFIXES = (".parquet", ".jsonl", ".json")


@dataclass(frozen=True)
class Source:
    """Where a split comes from. ``kind``: ``hf`` or ``file``; ``schema`` None = detect from columns."""

    name: str  # short name, used in problem ids ("aime24", "dapo_math_17k", file stem)
    kind: str
    location: str  # HF id or absolute file path
    hf_config: str | None = None
    split: str | None = None
    schema: str | None = None


# alias -> (HF id, HF config, split, schema)
KNOWN_SOURCES: dict[str, tuple[str, str | None, str, str]] = {
    "dapo_math_17k": ("BytedTsinghua-SIA/DAPO-Math-17k", None, "train", "dapo"),
    "aime24": ("BytedTsinghua-SIA/AIME-2024", None, "train", "dapo"),
    "gsm8k_train": ("openai/gsm8k", "main", "train", "gsm8k"),
    "gsm8k_test": ("openai/gsm8k", "main", "test", "gsm8k"),
    "math500": ("HuggingFaceH4/MATH-500", None, "test", "math500"),
}
# HF ids accepted in place of their alias (openai/gsm8k: train split for training, test for eval)
_ID_TO_ALIAS = {
    "BytedTsinghua-SIA/DAPO-Math-17k": {"train": "dapo_math_17k", "eval": "dapo_math_17k"},
    "BytedTsinghua-SIA/AIME-2024": {"train": "aime24", "eval": "aime24"},
    "openai/gsm8k": {"train": "gsm8k_train", "eval": "gsm8k_test"},
    "HuggingFaceH4/MATH-500": {"train": "math500", "eval": "math500"},
}
# local copies of the known files get the alias as their name, so that problem ids
# ("aime24-0" .. "aime24-29") are the same whether loaded from the hub or from disk
_FILE_STEM_TO_ALIAS = {"aime-2024": "aime24", "dapo-math-17k": "dapo_math_17k"}
# task name -> (default train source, default eval source)
TASK_DEFAULT_SOURCES: dict[str, tuple[str, str]] = {
    "dapo_math": ("dapo_math_17k", "aime24"),
    "gsm8k": ("gsm8k_train", "gsm8k_test"),
    "math500": ("dapo_math_17k", "math500"),  # MATH-500 is a test set: train on DAPO-Math-17k
}
_HF_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def _known(alias: str) -> Source:
    hf_id, config, split, schema = KNOWN_SOURCES[alias]
    return Source(alias, "hf", hf_id, config, split, schema)


def resolve_source(spec: str, role: str = "train", field: str = "task.train_source") -> Source:
    """Turn a source string into a :class:`Source`; raise :class:`TaskSourceError` naming ``field``.

    ``role`` (``train`` | ``eval``) picks the split of ids that have both (``openai/gsm8k``).
    Local paths must exist; no network is touched.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise TaskSourceError(f"{field}: empty data source {spec!r}")
    spec = spec.strip()
    if spec in KNOWN_SOURCES:
        return _known(spec)
    if spec in _ID_TO_ALIAS:
        return _known(_ID_TO_ALIAS[spec][role])
    if spec.startswith("hf:"):
        hf_id, _, split = spec[3:].partition("@")
        if not _HF_ID.fullmatch(hf_id):
            raise TaskSourceError(f"{field}={spec!r}: expected hf:<owner>/<name>[@<split>]")
        return Source(hf_id.split("/")[-1], "hf", hf_id, None, split or "train", None)
    path = os.path.abspath(os.path.expanduser(spec))
    if os.path.isfile(path):
        if not path.endswith(FILE_SUFFIXES):
            raise TaskSourceError(
                f"{field}={spec!r}: unsupported file type; use one of {', '.join(FILE_SUFFIXES)}"
            )
        stem = os.path.basename(path).split(".")[0]
        return Source(_FILE_STEM_TO_ALIAS.get(stem, stem), "file", path)
    if spec.endswith(FILE_SUFFIXES) or os.sep in spec or spec.startswith((".", "~")):
        if _HF_ID.fullmatch(spec) and not spec.endswith(FILE_SUFFIXES):
            pass  # owner/name: reported below as an unknown id
        else:
            raise TaskSourceError(f"{field}={spec!r}: file not found: {path}")
    not_file = f" (and there is no file {path})" if "/" in spec else ""
    raise TaskSourceError(
        f"{field}={spec!r}: unknown data set{not_file}. Use a known name ({', '.join(KNOWN_SOURCES)}), "
        f"one of the HF ids {', '.join(_ID_TO_ALIAS)}, hf:<owner>/<name>[@<split>] for another HF data "
        f"set in the dapo/gsm8k/math500 schema, or a local {'/'.join(FILE_SUFFIXES)} file"
    )


def _cfg_get(cfg: Any, key: str, default: Any = None) -> Any:
    if isinstance(cfg, dict):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


def task_sources(task_cfg: Any) -> tuple[Source, Source]:
    """The (train, eval) sources of a math task config, defaults filled in (see :data:`TASK_DEFAULT_SOURCES`)."""
    name = _cfg_get(task_cfg, "name")
    if name not in TASK_DEFAULT_SOURCES:
        raise TaskSourceError(f"task.name={name!r} has no math data; choose one of: {', '.join(TASK_DEFAULT_SOURCES)}")
    default_train, default_eval = TASK_DEFAULT_SOURCES[name]
    train = resolve_source(_cfg_get(task_cfg, "train_source") or default_train, "train", "task.train_source")
    evals = resolve_source(_cfg_get(task_cfg, "eval_source") or default_eval, "eval", "task.eval_source")
    return train, evals


def check_task_sources(task_cfg: Any) -> None:
    """Fail fast, before any compute, if the task's data cannot be loaded.

    Checks ``task.eval_limit`` and ``task.verifier_workers`` (ints >= 1 or null), that
    local files exist and have a supported type, that names and HF ids are known, and that
    ``datasets`` is installed when an HF source is used. Touches no network. Raises :class:`TaskSourceError`
    (a :class:`~dapo_exp.config.ConfigError`) naming the field and the path or id.
    """
    limit = _cfg_get(task_cfg, "eval_limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise TaskSourceError(f"task.eval_limit must be an int >= 1 or null, got {limit!r}")
    workers = _cfg_get(task_cfg, "verifier_workers")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise TaskSourceError(f"task.verifier_workers must be an int >= 1 or null (auto), got {workers!r}")
    if _cfg_get(task_cfg, "name") not in TASK_DEFAULT_SOURCES:
        return  # the toy generates its data
    for src, field in zip(task_sources(task_cfg), ("task.train_source", "task.eval_source")):
        if src.kind == "hf":
            import importlib.util

            if importlib.util.find_spec("datasets") is None:
                raise TaskSourceError(f"{field}: HF data set {src.location} needs the `datasets` package")


# --------------------------------------------------------------------------- #
# Reading rows                                                                  #
# --------------------------------------------------------------------------- #
def iter_rows(source: Source, batch_size: int = 8192) -> Iterator[dict[str, Any]]:
    """Stream the rows of a source as dicts (column -> value); a malformed JSONL line gives ``{}``.

    Parquet and HF sets are read in record batches, so that the ~1.8M-row DAPO-Math-17k
    parquet is deduplicated on the fly instead of being held in memory as rows.
    """
    if source.kind == "hf":
        import datasets

        try:
            ds = datasets.load_dataset(source.location, source.hf_config, split=source.split)
        except Exception as exc:
            hint = f". {OFFLINE_HINT}" if _hub_offline() else ""
            raise TaskSourceError(
                f"cannot load HF data set {source.location!r} (config {source.hf_config}, split {source.split}): "
                f"{type(exc).__name__}: {exc}{hint}"
            ) from exc
        for batch in ds.iter(batch_size=batch_size):
            keys = list(batch)
            yield from (dict(zip(keys, vals)) for vals in zip(*(batch[k] for k in keys)))
        return
    path = source.location
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_size):
            yield from batch.to_pylist()
        return
    if path.endswith(".jsonl"):
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError:
                    row = {}
                yield row if isinstance(row, dict) else {}
        return
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if isinstance(data, dict):  # {"data": [...]}: take the first list of records
        data = next((v for v in data.values() if isinstance(v, list)), [])
    yield from (r if isinstance(r, dict) else {} for r in data)


LOCAL_FILES_HINT = (
    "point the task at local files in the official schema (parquet or JSONL): "
    "task.train_source=/path/to/train.parquet task.eval_source=/path/to/eval.parquet "
    "(for task=dapo_math: dapo-math-17k.parquet and aime-2024.parquet)"
)
OFFLINE_HINT = f"Offline, {LOCAL_FILES_HINT}, or set HF_HUB_OFFLINE=1 to use copies already in the Hugging Face cache"
HUB_TIMEOUT_S = 10.0  # seconds to wait for the hub before calling it unreachable


def _hub_offline() -> bool:
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def in_hub_cache(source: Source) -> bool:
    """Whether an HF data set is on this machine for an offline load: its snapshot in the hub's cache
    (``HF_HOME``/``HF_HUB_CACHE``), or its prepared copy in ``datasets``' cache (``HF_DATASETS_CACHE``)."""
    from huggingface_hub import snapshot_download

    try:
        snapshot_download(source.location, repo_type="dataset", local_files_only=True)
        return True
    except Exception:  # noqa: BLE001 - LocalEntryNotFoundError and kin: not in the hub's cache
        pass
    import datasets.config

    return (Path(datasets.config.HF_DATASETS_CACHE) / source.location.replace("/", "___")).is_dir()


def check_hub_reachable(source: Source, field: str) -> None:
    """Raise :class:`TaskSourceError` at once, naming the local-file override, if the Hugging Face
    hub (``HF_ENDPOINT``) cannot be reached for an HF source; ``datasets`` would otherwise retry
    for tens of seconds before failing. Under ``HF_HUB_OFFLINE=1`` the cache is used instead: a data set
    that is not in it (:func:`in_hub_cache`) is refused the same way, before any job starts."""
    if source.kind != "hf":
        return
    if _hub_offline():
        if not in_hub_cache(source):
            raise TaskSourceError(
                f"{field}: {source.location} is not in the Hugging Face cache on this machine, and HF_HUB_OFFLINE=1 "
                f"forbids downloading it. Run once with the hub reachable to cache it, or {LOCAL_FILES_HINT}"
            )
        return
    from huggingface_hub import HfApi, constants
    from huggingface_hub.utils import HfHubHTTPError

    endpoint = os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
    try:
        HfApi(endpoint=endpoint).dataset_info(source.location, timeout=HUB_TIMEOUT_S)
    except HfHubHTTPError:
        return  # the hub answered (gated, not found, ...): load_dataset reports it
    except Exception as exc:  # noqa: BLE001 - connection refused, DNS, timeout: unreachable
        raise TaskSourceError(
            f"{field}: cannot reach the Hugging Face hub at {endpoint} to load {source.location} "
            f"({type(exc).__name__}: {exc}). {OFFLINE_HINT}"
        ) from exc


def detect_schema(rows: list[dict[str, Any]]) -> str | None:
    """``dapo`` if rows have ``prompt`` and ``reward_model``; ``gsm8k`` for ``question``/``answer``;
    ``math500`` for ``problem``/``answer``; None if no row matches any."""
    for row in rows[:100]:
        keys = set(row)
        if {"prompt", "reward_model"} <= keys:
            return "dapo"
        if {"question", "answer"} <= keys:
            return "gsm8k"
        if {"problem", "answer"} <= keys:
            return "math500"
    return None


def schema_of(source: Source, head: list[dict[str, Any]], where: str) -> str:
    """The source's schema: the one it names, else the one its first rows ``head`` show; else
    :class:`TaskSourceError`, ``where`` first, naming the columns found."""
    schema = source.schema or detect_schema(head)
    if schema is None:
        columns = sorted({k for row in head for k in row})[:12]
        raise TaskSourceError(f"{where}: cannot tell the schema from its columns "
                              f"{columns or '(none: no line is a JSON object)'} (want prompt+reward_model, "
                              "question+answer or problem+answer)")
    return schema


def check_file_rows(source: Source, field: str, head_rows: int = 100) -> None:
    """Raise :class:`TaskSourceError` naming ``field`` and the file if a local file source cannot be read, holds no
    row, or its first ``head_rows`` rows match no schema (or, with the schema given or found, hold no problem): the
    launch check's read of what every job would read, so a sweep fails once before any job instead of in each.
    Hub sources are read by the jobs (their reachability is :func:`check_hub_reachable`'s)."""
    if source.kind != "file":
        return
    try:
        head = list(itertools.islice(iter_rows(source), head_rows))
    except Exception as exc:  # a corrupt parquet, bad UTF-8, a JSON file that is not JSON
        raise TaskSourceError(f"{field}={source.location}: cannot be read: {type(exc).__name__}: {exc}") from exc
    if not head:
        raise TaskSourceError(f"{field}={source.location}: holds no rows")
    schema = schema_of(source, head, f"{field}={source.location}")
    problems, _ = rows_to_problems(head, schema, source.name)
    if not problems:
        raise TaskSourceError(f"{field}={source.location}: none of its first {len(head)} rows is a usable problem of "
                              f"the {schema} schema (a prompt and a non-empty answer)")


# --------------------------------------------------------------------------- #
# Rows -> problems (None: malformed, skipped and counted)                        #
# --------------------------------------------------------------------------- #
def _answer_text(value: Any) -> str | None:
    """A ground truth as a non-empty string, or None (missing, NaN, empty, a container, a bool)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if math.isfinite(value) and value.is_integer() else None
    if isinstance(value, str):
        return value.strip() or None
    return None


def _as_mapping(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _user_content(prompt: Any) -> str | None:
    """Content of the last ``user`` message of a verl chat prompt (list or array of dicts)."""
    if isinstance(prompt, str):
        return prompt.strip() or None
    try:
        messages = list(prompt)
    except TypeError:
        return None
    for msg in reversed(messages):
        if isinstance(msg, dict) and msg.get("role") == "user":
            content = msg.get("content")
            return content if isinstance(content, str) and content.strip() else None
    return None


ROLES = ("system", "user", "assistant")


def _conversation(prompt: Any) -> list[dict[str, str]] | None:
    """A verl chat prompt's messages up to its last ``user`` message, when that is more than the one user
    message (a system message, few-shot turns): each ``{role, content}`` with a known role and text content.
    None: one user message (the paper's form: :attr:`Problem.prompt` alone), or a malformed message."""
    if isinstance(prompt, str):
        return None
    messages = list(prompt)
    last = max((i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"), default=-1)
    kept = messages[: last + 1]
    if len(kept) < 2:
        return None
    if not all(isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str) for m in kept):
        raise ValueError("a message is not {role: system | user | assistant, content: text}")
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in kept]


def _dapo_row(row: dict, pos: int, name: str) -> Problem | None:
    content = _user_content(row.get("prompt"))
    answer = _answer_text(_as_mapping(row.get("reward_model")).get("ground_truth"))
    if content is None or answer is None:
        return None
    extra = _as_mapping(row.get("extra_info"))
    index = extra.get("index", pos)
    if isinstance(index, numbers.Integral) and not isinstance(index, bool):
        index = int(index)  # numpy ints from parquet
    elif not isinstance(index, (int, str)):
        index = pos
    raw = extra.get("raw_problem")
    meta = {
        "source": name,
        "index": index,
        "problem": raw if isinstance(raw, str) and raw else strip_template(content),
        "data_source": row.get("data_source"),
        "ability": row.get("ability"),
    }
    return Problem(id=f"{name}-{index}", prompt=content, answer=answer, meta=meta,
                   messages=_conversation(row.get("prompt")))


def gsm8k_answer(answer_column: Any) -> str | None:
    """GSM8K's final answer: the text after the last ``####``, stripped (None if absent or empty)."""
    if not isinstance(answer_column, str) or "####" not in answer_column:
        return None
    return _answer_text(answer_column.rsplit("####", 1)[1])


def _gsm8k_row(row: dict, pos: int, name: str) -> Problem | None:
    question, answer = row.get("question"), gsm8k_answer(row.get("answer"))
    if not isinstance(question, str) or not question.strip() or answer is None:
        return None
    meta = {"source": name, "index": pos, "problem": question, "solution": row["answer"].rsplit("####", 1)[0].strip()}
    return Problem(id=f"{name}-{pos}", prompt=apply_template(question.strip()), answer=answer, meta=meta)


def _math500_row(row: dict, pos: int, name: str) -> Problem | None:
    problem, answer = row.get("problem"), _answer_text(row.get("answer"))
    if not isinstance(problem, str) or not problem.strip() or answer is None:
        return None
    uid = row.get("unique_id")
    meta = {"source": name, "index": pos, "problem": problem, "unique_id": uid}
    for key in ("subject", "level"):
        if key in row:
            meta[key] = row[key]
    return Problem(id=f"{name}-{pos}", prompt=apply_template(problem.strip()), answer=answer, meta=meta)


_ROW_PARSERS = {"dapo": _dapo_row, "gsm8k": _gsm8k_row, "math500": _math500_row}


def rows_to_problems(
    rows: Iterable[dict[str, Any]], schema: str, name: str
) -> tuple[list[Problem], dict[str, int]]:
    """Map rows of ``schema`` to problems, deduplicated by prompt (the whole conversation where a row has one;
    first occurrence kept).

    Returns the problems and counts: ``rows``, ``malformed_skipped``, ``duplicates_dropped``
    (``conflicting_duplicates``: of those, how many had a different answer than the kept
    copy), ``problems``. Never raises on row content.
    """
    if schema not in _ROW_PARSERS:
        raise ValueError(f"unknown schema {schema!r}; valid: {', '.join(SCHEMAS)}")
    parse = _ROW_PARSERS[schema]
    seen: dict[str, Problem] = {}
    ids: set[str] = set()
    stats = {"rows": 0, "malformed_skipped": 0, "duplicates_dropped": 0, "conflicting_duplicates": 0}
    for pos, row in enumerate(rows):
        stats["rows"] += 1
        try:
            problem = parse(row if isinstance(row, dict) else {}, pos, name)
        except Exception:  # any odd value type: malformed, never a crash
            problem = None
        if problem is None:
            stats["malformed_skipped"] += 1
            continue
        key = json.dumps(problem.messages) if problem.messages else problem.prompt
        kept = seen.get(key)
        if kept is not None:
            stats["duplicates_dropped"] += 1
            stats["conflicting_duplicates"] += kept.answer != problem.answer
            continue
        if problem.id in ids:  # same index on different prompts: keep ids unique
            problem.id = f"{problem.id}#{pos}"
        ids.add(problem.id)
        seen[key] = problem
    problems = list(seen.values())
    stats["problems"] = len(problems)
    return problems, stats


def load_problems(source: Source, role: str = "train") -> tuple[list[Problem], dict[str, int]]:
    """Read, map and deduplicate one source; eval sources come sorted by their integer index."""
    check_hub_reachable(source, f"task.{role}_source")
    rows = iter_rows(source)
    head = list(itertools.islice(rows, 100))
    schema = schema_of(source, head, source.location)
    problems, stats = rows_to_problems(itertools.chain(head, rows), schema, source.name)
    if role == "eval" and all(isinstance(p.meta.get("index"), int) for p in problems):
        problems.sort(key=lambda p: p.meta["index"])
    log.info(
        "%s (%s): %d rows, %d duplicates dropped, %d malformed skipped -> %d problems",
        source.location, role, stats["rows"], stats["duplicates_dropped"], stats["malformed_skipped"],
        stats["problems"],
    )
    if stats["conflicting_duplicates"]:
        log.warning("%s: %d duplicate prompts had a different answer than the kept copy",
                    source.location, stats["conflicting_duplicates"])
    return problems, stats


def load_math_task(task_cfg: Any) -> TaskData:
    """``TaskData`` of ``dapo_math`` / ``gsm8k`` / ``math500``; ``stats`` keys prefixed ``train_`` / ``eval_``."""
    check_task_sources(task_cfg)
    train_src, eval_src = task_sources(task_cfg)
    train, train_stats = load_problems(train_src, "train")
    evals, eval_stats = load_problems(eval_src, "eval")
    stats = {f"train_{k}": v for k, v in train_stats.items()}
    stats.update({f"eval_{k}": v for k, v in eval_stats.items()})
    if not train:
        raise TaskSourceError(f"task.train_source: {train_src.location} gave no usable problem")
    if not evals:
        raise TaskSourceError(f"task.eval_source: {eval_src.location} gave no usable problem")
    return TaskData(name=_cfg_get(task_cfg, "name"), train=train, eval=evals, stats=stats)
