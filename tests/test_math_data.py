"""Math data loading: an AIME-shaped parquet (built here; the shared copy optional), DAPO-Math in the
official schema, GSM8K / MATH-500 mappings."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from fixtures_aime import MINI_AIME, MINI_AIME_COPIES, write_aime_parquet

from dapo_exp.config import ConfigError, TaskConfig
from dapo_exp.tasks import check_task_sources, load_task
from dapo_exp.tasks.math_data import (
    PROMPT_TEMPLATE,
    TaskSourceError,
    apply_template,
    gsm8k_answer,
    load_problems,
    resolve_source,
    rows_to_problems,
    strip_template,
)
from dapo_exp.tasks.verifier import get_verifier

# The shared AIME 2024 parquet (960 rows: 30 problems x 32 copies), next to the checkout;
# only the optional test below reads it. Everything else uses the AIME-shaped file the
# `aime_parquet` fixture builds, so the suite depends on no file outside the repository.
SHARED_AIME = Path(__file__).resolve().parents[2] / "shared" / "data" / "aime-2024.parquet"

# The 30 answers of AIME 2024 I and II (public), as a multiset.
AIME24_ANSWERS = sorted(
    [204, 25, 809, 116, 104, 294, 540, 197, 480, 113, 371, 385, 110, 104, 721]
    + [73, 236, 45, 33, 80, 55, 699, 127, 902, 468, 601, 23, 321, 211, 315]
)


@pytest.fixture(scope="module")
def aime_parquet(tmp_path_factory) -> str:
    """A miniature ``aime-2024.parquet`` (the file name maps its ids to ``aime24-<index>``)."""
    return str(write_aime_parquet(tmp_path_factory.mktemp("aime") / "aime-2024.parquet"))


def test_template_is_the_papers():
    assert PROMPT_TEMPLATE == (
        "Solve the following math problem step by step. The last line of your response should be of the form "
        "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{problem}\n\n"
        'Remember to put your answer on its own line after "Answer:".'
    )
    problem = "What is $\\{1\\}$ + 1?"  # braces survive (no str.format on the problem)
    assert apply_template(problem) == PROMPT_TEMPLATE.replace("{problem}", problem)
    assert strip_template(apply_template(problem)) == problem
    assert strip_template("bare") == "bare"


def test_aime_shaped_parquet_collapses_to_its_problems(aime_parquet):
    src = resolve_source(aime_parquet, "eval", "task.eval_source")
    assert src.name == "aime24"  # a local copy of the known file keeps the hub's ids
    problems, stats = load_problems(src, "eval")
    n = len(MINI_AIME)
    assert stats == {"rows": n * MINI_AIME_COPIES, "malformed_skipped": 0,
                     "duplicates_dropped": n * (MINI_AIME_COPIES - 1), "conflicting_duplicates": 0, "problems": n}
    assert [p.id for p in problems] == [f"aime24-{i}" for i in range(n)]  # sorted by index
    assert [(p.meta["problem"], p.answer) for p in problems] == [(t, a) for _, t, a in MINI_AIME]
    for p in problems:
        assert p.prompt == apply_template(p.meta["problem"])  # the official content is templated
    # the paper's verifier accepts the reference answers
    v = get_verifier("math_dapo")
    assert all(r.correct for r in v.verify_batch([f"...\nAnswer: {p.answer}" for p in problems],
                                                 [p.answer for p in problems]))


@pytest.mark.skipif(not SHARED_AIME.is_file(),
                    reason=f"optional: the shared AIME 2024 parquet is not at ../shared/data ({SHARED_AIME.name})")
def test_shared_aime_parquet_collapses_to_30_problems():
    src = resolve_source(str(SHARED_AIME), "eval", "task.eval_source")
    problems, stats = load_problems(src, "eval")
    assert stats == {"rows": 960, "malformed_skipped": 0, "duplicates_dropped": 930,
                     "conflicting_duplicates": 0, "problems": 30}
    assert [p.id for p in problems] == [f"aime24-{i}" for i in range(30)]  # same ids as the HF copy
    assert sorted(int(p.answer) for p in problems) == AIME24_ANSWERS
    for p in problems:
        assert p.prompt == apply_template(p.meta["problem"])  # the official content is templated
    (real_part,) = [p for p in problems if p.meta["problem"].startswith("Find the largest possible real part")]
    assert (real_part.id, real_part.answer) == ("aime24-2", "540")
    # the paper's verifier accepts the reference answers
    v = get_verifier("math_dapo")
    assert all(r.correct for r in v.verify_batch([f"...\nAnswer: {p.answer}" for p in problems],
                                                 [p.answer for p in problems]))


def _dapo_row(content, truth, index, source="math_dapo"):
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": content}],
        "ability": "MATH",
        "reward_model": {"ground_truth": truth, "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": index},
    }


def _write_dapo_parquet(path: Path) -> None:
    rows = [
        _dapo_row(apply_template("What is 1+1?"), "2", "a"),
        _dapo_row(apply_template("What is 2+2?"), "4", "b"),
        _dapo_row(apply_template("What is 1+1?"), "2", "c"),  # duplicate
        _dapo_row(apply_template("What is 1+1?"), "3", "d"),  # duplicate, conflicting answer
        _dapo_row(apply_template("What is 3+3?"), "", "e"),  # empty answer
        _dapo_row(apply_template("What is 4+4?"), None, "f"),  # missing answer
        _dapo_row("", "8", "g"),  # empty prompt
        _dapo_row(apply_template("What is 2+2?"), "4", "h"),  # duplicate
        _dapo_row(apply_template("What is 5+5?"), "10", "i"),
    ]
    pd.DataFrame(rows).to_parquet(path)


def test_local_dapo_parquet_dedup_and_malformed(tmp_path):
    path = tmp_path / "mini-dapo.parquet"
    _write_dapo_parquet(path)
    problems, stats = load_problems(resolve_source(str(path)), "train")
    assert stats == {"rows": 9, "malformed_skipped": 3, "duplicates_dropped": 3,
                     "conflicting_duplicates": 1, "problems": 3}
    assert [(p.id, p.answer) for p in problems] == [("mini-dapo-a", "2"), ("mini-dapo-b", "4"), ("mini-dapo-i", "10")]
    assert problems[0].meta["problem"] == "What is 1+1?"
    assert problems[0].prompt == apply_template("What is 1+1?")


def test_rows_never_crash_on_odd_values():
    rows = [
        {},
        {"prompt": None, "reward_model": None},
        {"prompt": 5, "reward_model": {"ground_truth": 3}},
        {"prompt": [{"role": "user"}], "reward_model": {"ground_truth": "3"}},
        {"prompt": [{"role": "system", "content": "x"}], "reward_model": {"ground_truth": "3"}},
        {"prompt": [{"role": "user", "content": "q"}], "reward_model": {"ground_truth": float("nan")}},
        {"prompt": [{"role": "user", "content": "q"}], "reward_model": {"ground_truth": True}},
        {"prompt": [{"role": "user", "content": "q"}], "reward_model": {"ground_truth": ["3"]}},
        {"prompt": [{"role": "user", "content": "q"}], "reward_model": "3"},
        "not a dict",
        {"prompt": [{"role": "user", "content": "q"}], "reward_model": {"ground_truth": 3.0}},  # fine: "3"
    ]
    problems, stats = rows_to_problems(rows, "dapo", "odd")
    assert stats["malformed_skipped"] == 10 and [p.answer for p in problems] == ["3"]


def test_gsm8k_and_math500_mappings(tmp_path):
    assert gsm8k_answer("Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 72") == "72"
    assert gsm8k_answer("a #### b #### 1,000 ") == "1,000"
    assert gsm8k_answer("no marker") is None and gsm8k_answer(None) is None
    gsm = tmp_path / "gsm.jsonl"
    gsm.write_text(
        "\n".join(
            [
                json.dumps({"question": "Q1?", "answer": "work\n#### 72"}),
                json.dumps({"question": "Q2?", "answer": "no final answer"}),  # malformed
                "{not json",  # malformed line
                json.dumps({"question": "Q1?", "answer": "work\n#### 72"}),  # duplicate
                json.dumps({"question": "Q3?", "answer": "#### "}),  # empty answer
            ]
        )
    )
    problems, stats = load_problems(resolve_source(str(gsm), "eval"), "eval")
    assert (stats["rows"], stats["malformed_skipped"], stats["duplicates_dropped"]) == (5, 3, 1)
    assert [(p.id, p.prompt, p.answer, p.meta["solution"]) for p in problems] == [
        ("gsm-0", apply_template("Q1?"), "72", "work")
    ]
    m500 = tmp_path / "m500.jsonl"
    m500.write_text(
        json.dumps({"problem": "Find x.", "answer": "\\frac{1}{2}", "subject": "Algebra", "level": 3,
                    "unique_id": "test/algebra/1.json"})
        + "\n"
        + json.dumps({"problem": "Find y.", "answer": None})
        + "\n"
    )
    problems, stats = load_problems(resolve_source(str(m500), "eval"), "eval")
    assert stats["malformed_skipped"] == 1
    p = problems[0]
    assert (p.prompt, p.answer, p.meta["subject"], p.meta["level"]) == (
        apply_template("Find x."), "\\frac{1}{2}", "Algebra", 3)


def test_source_errors_name_the_path_or_id(tmp_path):
    missing = tmp_path / "nope.parquet"
    with pytest.raises(TaskSourceError, match="task.train_source.*file not found.*nope.parquet"):
        check_task_sources(TaskConfig(name="dapo_math", train_source=str(missing)))
    with pytest.raises(TaskSourceError, match="task.eval_source='someone/unknown-set'.*unknown data set"):
        check_task_sources(TaskConfig(name="dapo_math", eval_source="someone/unknown-set"))
    with pytest.raises(TaskSourceError, match="task.eval_source='aime25'.*aime24"):
        check_task_sources(TaskConfig(name="dapo_math", eval_source="aime25"))
    csv = tmp_path / "data.csv"
    csv.write_text("a,b\n")
    with pytest.raises(TaskSourceError, match="unsupported file type"):
        check_task_sources(TaskConfig(name="gsm8k", train_source=str(csv)))
    with pytest.raises(ConfigError, match="task.eval_limit"):
        check_task_sources(TaskConfig(name="arith", eval_limit=0))
    with pytest.raises(ConfigError, match="task.verifier_workers"):
        check_task_sources(TaskConfig(name="arith", verifier_workers=0))
    # the defaults (HF ids) pass without touching the network
    for name in ("dapo_math", "gsm8k", "math500"):
        check_task_sources(TaskConfig(name=name))
    assert resolve_source("openai/gsm8k", "eval").split == "test"
    assert resolve_source("openai/gsm8k", "train").split == "train"
    assert resolve_source("hf:me/my-set@validation").split == "validation"


def test_load_task_dispatch_and_eval_limit(tmp_path, aime_parquet):
    train = tmp_path / "mini-dapo.parquet"
    _write_dapo_parquet(train)
    n = len(MINI_AIME)
    cfg = TaskConfig(name="dapo_math", train_source=str(train), eval_source=aime_parquet, eval_limit=5)
    data = load_task(cfg)
    assert data.name == "dapo_math"
    assert len(data.train) == 3 and [p.id for p in data.eval] == [f"aime24-{i}" for i in range(5)]
    assert data.stats["train_duplicates_dropped"] == 3 and data.stats["train_malformed_skipped"] == 3
    assert data.stats["eval_duplicates_dropped"] == n * (MINI_AIME_COPIES - 1)
    assert data.stats["eval_limit_dropped"] == n - 5
    # a dict works as well as the dataclass or a DictConfig
    data = load_task({"name": "math500", "train_source": str(train), "eval_source": aime_parquet})
    assert len(data.eval) == n and "eval_limit_dropped" not in data.stats
    assert len(data.train) == 3


def test_load_task_arith_and_unknown():
    from omegaconf import OmegaConf

    cfg = OmegaConf.structured(TaskConfig(name="arith", arith_n_train=20, arith_n_eval=8, eval_limit=3))
    data = load_task(cfg)
    assert data.name == "arith" and len(data.eval) == 3
    with pytest.raises(ConfigError, match="task.name='nope'.*arith, dapo_math, gsm8k, math500"):
        load_task({"name": "nope"})
