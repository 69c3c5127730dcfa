"""The scaling benchmark (dapo_exp.benchmarks.scaling): one tiny cell end to end, and its markdown."""

import pytest

from dapo_exp.benchmarks import scaling


def test_one_cell_times_the_step_and_its_floor(capsys):
    rows = scaling.main(["--widths", "96", "--responses", "2", "--prompts", "2", "--micro-batch", "4",
                         "--tokens", "8", "--steps", "1", "--warmup", "1"])
    (r,) = rows
    assert r["responses"] == 4 and r["decode"] == "fused"  # auto on CPU
    assert r["gen_s"] > 0 and r["train_s"] > 0 and r["floor_gen_s"] > 0 and r["floor_train_s"] > 0
    assert r["step_s"] == r["gen_s"] + r["train_s"] and r["floor_s"] == r["floor_gen_s"] + r["floor_train_s"]
    # 4 responses x 8 forced tokens generated and trained
    assert r["tok_per_s"] * r["step_s"] == pytest.approx(2 * 4 * 8)
    out = capsys.readouterr().out
    assert "| params | responses/step |" in out and "| 0.33M | 4 |" in out and "load average before" in out
