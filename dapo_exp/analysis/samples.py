"""Rollout inspection: the samples a run saved (``eval_samples.jsonl``, ``train_samples.jsonl``).

:func:`load_samples` gathers them across runs; :func:`sample_stats` summarises
them per configuration; :func:`sample_examples` picks, per configuration,
examples of correct, wrong, truncated and the longest responses;
:func:`format_examples` prints them.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from dapo_exp import rundir
from dapo_exp.analysis.runs import RunSet, order_labels
from dapo_exp.rundir import read_jsonl

KINDS = {"eval": rundir.EVAL_SAMPLES, "train": rundir.TRAIN_SAMPLES}


def load_samples(
    data: RunSet | pd.DataFrame, kind: str = "eval", *, step: int | str | None = "last", included_only: bool = True
) -> pd.DataFrame:
    """The saved samples of every run with a local directory, one row per sample.

    ``kind``: ``eval`` or ``train``. ``step``: ``"last"`` (each run's last saved
    step), an int (that step), or None (all). Columns: run, label, seed, then the
    sample's own keys (step, problem_id, sample, prompt, response, answer, pred,
    correct, length, truncated; train samples add reward and group).
    """
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: choose one of {', '.join(KINDS)}")
    runs = data.runs if isinstance(data, RunSet) else data
    if included_only and "included" in runs:
        runs = runs[runs["included"]]
    frames = []
    for r in runs.itertuples():
        if not isinstance(r.path, str):
            continue
        p = Path(r.path) / KINDS[kind]
        if not p.is_file():
            continue
        df = pd.DataFrame(read_jsonl(p))
        if not len(df) or "step" not in df:
            continue
        if step == "last":
            df = df[df["step"] == df["step"].max()]
        elif step is not None:
            df = df[df["step"] == int(step)]
        df.insert(0, "run", r.run)
        df.insert(1, "label", r.label)
        df.insert(2, "seed", r.seed)
        frames.append(df)
    if not frames:
        cols = ["run", "label", "seed", "step", "prompt", "response", "correct", "length", "truncated"]
        return pd.DataFrame(columns=cols)
    out = pd.concat(frames, ignore_index=True)
    for c in ("correct", "truncated"):
        if c in out:
            out[c] = out[c].astype("boolean")
    return out


def sample_stats(samples: pd.DataFrame) -> pd.DataFrame:
    """Per configuration: samples, accuracy, truncated fraction, mean / max length (ordered as the table)."""
    if not len(samples):
        return pd.DataFrame(columns=["n", "acc", "truncated_frac", "len_mean", "len_max"])
    g = samples.groupby("label")
    out = pd.DataFrame(
        {
            "n": g.size(),
            "acc": g["correct"].mean().astype(float) if "correct" in samples else float("nan"),
            "truncated_frac": g["truncated"].mean().astype(float) if "truncated" in samples else float("nan"),
            "len_mean": g["length"].mean() if "length" in samples else float("nan"),
            "len_max": g["length"].max() if "length" in samples else float("nan"),
        }
    )
    return out.reindex(order_labels(out.index))


def sample_examples(samples: pd.DataFrame, n: int = 2, seed: int = 0) -> pd.DataFrame:
    """Per configuration, up to ``n`` samples of each category: correct, wrong, truncated, longest.

    correct / wrong / truncated are drawn at random (``seed``: reproducible); longest
    are the ``n`` longest responses. A column ``category`` says which.
    """
    if not len(samples):
        return samples.assign(category=pd.Series(dtype=str))
    parts = []
    for label in order_labels(samples["label"].unique()):
        g = samples[samples["label"] == label]
        picks = {
            "correct": g[g["correct"].fillna(False)] if "correct" in g else g.iloc[:0],
            "wrong": g[~g["correct"].fillna(True)] if "correct" in g else g.iloc[:0],
            "truncated": g[g["truncated"].fillna(False)] if "truncated" in g else g.iloc[:0],
        }
        for cat, sub in picks.items():
            if len(sub):
                parts.append(sub.sample(min(n, len(sub)), random_state=seed).assign(category=cat))
        if "length" in g:
            parts.append(g.nlargest(n, "length").assign(category="longest"))
    out = pd.concat(parts, ignore_index=True) if parts else samples.iloc[:0].assign(category="")
    cols = ["label", "category"] + [c for c in out.columns if c not in ("label", "category")]
    return out[cols]


def format_examples(examples: pd.DataFrame, max_chars: int = 400) -> str:
    """Readable text of :func:`sample_examples`' rows (responses cut at ``max_chars``, from the end)."""
    lines = []
    for label, g in examples.groupby("label", sort=False):
        lines.append(f"=== {label} ===")
        for r in g.itertuples():
            resp = str(getattr(r, "response", ""))
            if len(resp) > max_chars:
                resp = "…" + resp[-max_chars:]
            lines.append(
                f"--- [{r.category}] run {r.run} seed {r.seed} step {getattr(r, 'step', '?')} "
                f"problem {getattr(r, 'problem_id', '?')}: correct={getattr(r, 'correct', '?')} "
                f"truncated={getattr(r, 'truncated', '?')} length={getattr(r, 'length', '?')} "
                f"answer={getattr(r, 'answer', '?')!s} pred={getattr(r, 'pred', '?')!s}"
            )
            lines.append(f"prompt: {str(getattr(r, 'prompt', ''))[:max_chars]}")
            lines.append(f"response: {resp}")
        lines.append("")
    return "\n".join(lines)
