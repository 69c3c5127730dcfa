"""A default run's terminal holds its own lines only: no third-party warning, no weight-loading bar.

transformers releases within the supported range deprecate arguments the code still passes and draw a
"Loading weights" bar per model load; dapo_exp.quiet silences exactly those (a new warning still shows).
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

from dapo_exp.quiet import DEPRECATIONS, quiet

ROOT = Path(__file__).resolve().parents[1]


def test_a_short_default_run_prints_no_third_party_warning(tmp_path):
    # the default run's code paths at smaller evaluations (its 256 x 8 final one took most of the minute)
    out = subprocess.run([sys.executable, "run.py", "logger=none", "train.steps=2", "eval.every=0", "eval.problems=16",
                          "eval.final_problems=32", "eval.final_samples=2", f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout + out.stderr
    assert "Loading weights" not in text and "Warning" not in text and "warn(" not in text, text[-3000:]
    foreign = [ln for ln in out.stderr.splitlines() if ln.strip() and "[dapo-exp]" not in ln and "[run]" not in ln]
    assert not foreign, foreign[:10]


def test_only_the_named_deprecations_are_silenced():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet()
        for category, message in DEPRECATIONS:
            warnings.warn(message.replace("\\", "") + " and will be removed", category, stacklevel=1)
        warnings.warn("`something_else` is deprecated", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["`something_else` is deprecated"]
