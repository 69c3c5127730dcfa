"""What the analysis prints fits a terminal of 120 columns; the wide table stays in table.md / table.csv."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from fixtures_runs import LADDER_SWEEP, STANDARD_SWEEP, make_sweep

from dapo_exp import analysis as A
from dapo_exp.analysis.table import TABLE_METRICS, table_text, wrap_text

REPO = Path(__file__).resolve().parents[1]
WIDTH = 120
LONG = {  # labels as the loader gives runs that differ in a result-changing key: long, alike at both ends
    "grpo": "grpo [model.path=/scratch/models/Qwen2.5-Math-7B-Instruct-a, optim.lr=1e-06, task.name=dapo_math]",
    "clip": "grpo [model.path=/scratch/models/Qwen2.5-Math-7B-Instruct-b, optim.lr=1e-06, task.name=dapo_math]",
    "clip_ds": "clip_ds [model.path=/scratch/models/Qwen2.5-Math-7B-Instruct-a, optim.lr=1e-06, task.name=dapo_math]",
    "full": "full [model.path=/scratch/models/Qwen2.5-Math-7B-Instruct-a, optim.lr=1e-06, task.name=dapo_math]",
    "full_no_ds": "full_no_ds [model.path=/scratch/models/Qwen2.5-Math-7B-Instruct-a, optim.lr=1e-06]",
}


def _relabel(root: Path) -> None:
    for summary in root.glob("*/summary.json"):
        s = json.loads(summary.read_text())
        s["label"] = LONG[s["preset"]]
        summary.write_text(json.dumps(s))


@pytest.fixture(scope="module")
def long_sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("multirun") / "long_labels"
    make_sweep(root, STANDARD_SWEEP)
    _relabel(root)
    return root


def _width(text: str, out: Path) -> int:
    """The widest printed line, left aside the lines naming the output directory and a command to
    copy (``python ...``: kept whole on a line of its own)."""
    return max(len(ln) for ln in text.splitlines() if str(out) not in ln and not ln.startswith("python "))


def test_the_printed_analysis_fits_120_columns_and_the_files_keep_the_wide_table(long_sweep, tmp_path):
    out = tmp_path / "analysis"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "300"}
    proc = subprocess.run([sys.executable, "-m", "dapo_exp.analysis", str(long_sweep), "--out", str(out),
                           "--no-figures"], cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout
    assert _width(text, out) <= WIDTH, max(text.splitlines(), key=len)
    # the table is there: its header, every configuration (shortened, still told apart), the baseline's Δ
    assert "config" in text and "final acc %" in text and "Δ final acc (pp)" in text
    rows = [ln for ln in text.splitlines() if ln.startswith(("grpo [", "clip_ds [", "full [", "full_no_ds ["))
            and "±" in ln]
    assert len(rows) == 5 and len({r.split("  ")[0] for r in rows}) == 5
    assert "Long configuration labels are shortened" in text and "table.md has every column" in text
    # the files keep every column and the full labels
    md = (out / "table.md").read_text()
    assert all(label in md for label in LONG.values())
    assert max(len(ln) for ln in md.splitlines()) > WIDTH  # the wide table stays wide there
    assert all(m.header in md for m in TABLE_METRICS)
    csv = pd.read_csv(out / "table.csv", index_col="config")
    assert set(LONG.values()) <= set(csv.index) and {m.key for m in TABLE_METRICS} <= set(csv.columns)


@pytest.mark.parametrize("spec", [STANDARD_SWEEP, LADDER_SWEEP, [(p, 0, a, "finished") for p, a in
                                                                 (("grpo", 0.3), ("clip", 0.4), ("full", 0.5))]],
                         ids=["standard", "ladder", "one seed"])
def test_analysis_text_fits_at_any_width(spec, tmp_path):
    root = tmp_path / "sweep"
    make_sweep(root, spec)
    result = A.run_analysis(root, out=tmp_path / "analysis", figures=False)
    for width in (120, 100, 80):
        text = result.text(width)
        assert _width(text, tmp_path / "analysis") <= width, (width, text)
        assert "final acc %" in text and "grpo" in text
    # columns are added while they fit: more room, more columns
    assert table_text(result.table, 200).count("entropy") >= table_text(result.table, 80).count("entropy")
    assert "Not shown at 80 columns" in table_text(result.table, 80)


def test_a_command_in_the_text_stays_on_one_line():
    cmd = "python run.py -m sweep=demo fixes=grpo,clip,clip_ds,full,full_no_ds seed=0,1,2,3,4,5,6,7,8,9,10,11"
    lines = wrap_text(f"**Nothing can be concluded.** Add seeds: `{cmd}` (what `plan` recommends).", 60)
    assert cmd in lines and all(len(ln) <= 60 for ln in lines if ln != cmd)
    assert "Add seeds:" in lines[0] and "**" not in "".join(lines) and "`plan`" in " ".join(lines)


def test_a_disk_error_while_writing_the_analysis_is_one_line_naming_the_file(tmp_path, monkeypatch, capsys):
    """Issue 34: a full disk (49 lines of traceback) or a read-only sweep folder ended the analysis in a traceback."""
    import errno

    from dapo_exp.analysis import cli, report

    make_sweep(tmp_path / "sweep", STANDARD_SWEEP)
    target = tmp_path / "sweep" / "analysis" / "table.csv"

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(target))

    monkeypatch.setattr(report, "run_analysis", full)
    assert cli.main([str(tmp_path / "sweep")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: could not write the analysis {target}: No space left on device. The runs are untouched; "
                   "free some space or write the analysis elsewhere with --out DIR"]
