"""The head-to-head benchmark against TRL (dapo_exp.benchmarks.vs_trl): its schedule and statistics,
and a one-step smoke run of both systems (skipped without TRL: ``pip install -e ".[bench]"``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dapo_exp.benchmarks import vs_trl


def test_blocks_run_in_abba_order():
    assert vs_trl.abba(4) == [("trl", 0), ("dapo", 0), ("dapo", 1), ("trl", 1),
                              ("trl", 2), ("dapo", 2), ("dapo", 3), ("trl", 3)]
    # TRL drives: after its warm-up nothing, after its block 0 dapo-exp's blocks 0 and 1, ...
    assert vs_trl.dapo_after_trl(4) == {-1: [], 0: [0, 1], 1: [], 2: [2, 3], 3: []}
    assert vs_trl.dapo_after_trl(3) == {-1: [], 0: [0, 1], 1: [], 2: [2]}


def test_summarise_pairs_blocks():
    trl = [[1.0, 1.2, 1.1], [2.0, 2.2, 2.1]]  # the machine slowed down in block 2
    dapo = [[0.5, 0.6, 0.55], [1.0, 1.1, 1.05]]
    s = vs_trl.summarise(trl, dapo, n_boot=200)
    assert s["per_block"] == pytest.approx([0.5, 0.5])
    assert s["ratio_geomean_blocks"] == pytest.approx(0.5)
    assert s["ratio_ci"] == pytest.approx((0.5, 0.5))  # the same ratio in every block: no spread
    assert s["trl_median_s"] == pytest.approx(np.median(trl)) and s["dapo_median_s"] == pytest.approx(np.median(dapo))
    noisy = vs_trl.summarise(trl, [[0.5, 0.6, 0.55], [1.5, 1.6, 1.55]], n_boot=2000)
    lo, hi = noisy["ratio_ci"]
    assert lo < noisy["ratio_geomean_blocks"] < hi and math.isclose(lo, 0.5, rel_tol=1e-6)


def test_bad_sizes_are_refused():
    with pytest.raises(SystemExit):
        vs_trl.parse_args(["--prompts", "3", "--responses", "2", "--micro-batch", "4"])  # 4 does not divide 6
    with pytest.raises(SystemExit):
        vs_trl.parse_args(["--responses", "1"])  # TRL needs groups of 2


@pytest.mark.slow
def test_one_block_of_one_step_of_each(warm_cache, capsys):
    """Both systems warm up and run one timed step on a tiny batch; the same tokens and updates."""
    pytest.importorskip("trl", reason="TRL is in the optional `bench` extra: pip install -e '.[bench]'")
    out = vs_trl.main(["--blocks", "1", "--steps", "1", "--warmup", "1", "--prompts", "2", "--responses", "2",
                       "--tokens", "8", "--micro-batch", "2", "--cache-dir", warm_cache, "--decode", "static"])
    printed = capsys.readouterr().out
    assert out["steps"] == 1 and out["ratio"] > 0 and out["trl_median_s"] > 0 and out["dapo_median_s"] > 0
    assert "TRL       timed steps 1, responses 4, generated tokens 32, optimizer updates 1" in printed
    assert "dapo-exp  timed steps 1, responses 4, generated tokens 32, optimizer updates 1" in printed
    assert "load average" in printed and "ratio dapo-exp / TRL" in printed
    assert out["decode"] == "static" and "rollout.decode=static (asked: static)" in printed
