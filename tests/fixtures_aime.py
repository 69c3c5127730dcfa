"""A miniature AIME 2024 parquet for tests, so that none depends on a file outside the repository.

:func:`write_aime_parquet` writes the shared ``aime-2024.parquet``'s schema (same columns
and nested Arrow types: ``data_source`` "math_dapo", ``prompt`` a list of {content, role},
``ability``, ``reward_model`` {ground_truth: integer string, style}, ``extra_info``
{index, raw_problem, split}), each problem repeated as in the released file and the rows
out of index order. Name the file ``aime-2024.parquet`` to get the hub's ids ``aime24-<index>``.
"""

from __future__ import annotations

from pathlib import Path

from dapo_exp.tasks.math_data import apply_template

# A miniature AIME: (extra_info.index, problem, integer answer), written in the shared
# file's schema (same columns, nested types and row duplication, rows out of index order).
MINI_AIME = [
    (0, "Find the remainder when $2^{10}$ is divided by $1000$.", "24"),
    (1, "How many positive divisors does $360$ have?", "24"),  # same answer, different problem
    (2, "Find the largest possible real part of $(3+4i)z$ where $|z|=1$.", "5"),
    (3, "Find the number of elements of $\\{1, 2, 3\\}$.", "3"),  # braces survive (no str.format)
    (4, "Find $a+b$ if $a=100$ and $b=17$.", "117"),
    (5, "Compute $7 \\cdot 11 \\cdot 13$.", "1001"),
    (6, "Find the least positive integer $n$ with $n^2 > 500$.", "23"),
    (7, "Find $0$.", "0"),
]
MINI_AIME_COPIES = 4


def write_aime_parquet(path: Path, problems=MINI_AIME, copies: int = MINI_AIME_COPIES) -> Path:
    """An AIME-shaped parquet at ``path``: ``copies`` rows per problem, interleaved, index order shuffled."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    order = [problems[i] for i in (3, 0, 7, 5, 1, 6, 2, 4)[: len(problems)]]
    rows = [
        {
            "data_source": "math_dapo",
            "prompt": [{"content": apply_template(text), "role": "user"}],
            "ability": "MATH",
            "reward_model": {"ground_truth": answer, "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": index, "raw_problem": text, "split": None},
        }
        for _ in range(copies)
        for index, text, answer in order
    ]
    schema = pa.schema([
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("ground_truth", pa.string()), ("style", pa.string())])),
        ("extra_info", pa.struct([("index", pa.int64()), ("raw_problem", pa.string()), ("split", pa.null())])),
    ])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path
