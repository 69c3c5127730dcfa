"""The three-engine benchmark's own parts: both benchmarks get the same work, their outputs land in --out as
they run, and the summary holds each system's median and each ratio to dapo-exp's time from the same
benchmark (the benchmarks themselves are tests/test_vs_trl.py's and tests/test_vs_verl.py's)."""

from __future__ import annotations

import os

import pytest

from dapo_exp.benchmarks import three_engines, vs_trl, vs_verl


def test_both_benchmarks_get_the_same_work_and_their_outputs_and_summary_are_written(tmp_path, monkeypatch):
    calls = {}

    def fake(name, result):
        def main(argv):
            calls[name] = argv
            print(f"{name} ran")
            return result
        return main

    trl = {"trl_median_s": 143.0, "dapo_median_s": 35.8, "ratio": 35.8 / 143.0, "load_before": (0.71, 1.5, 1.9),
           "load_after": (1.0, 1.05, 1.4)}
    verl = {"dapo_s": [36.0, 35.0, 37.0, 36.5], "verl_s": [141.0, 143.0], "dapo_median_s": 36.25,
            "verl_median_s": 142.0, "ratio": 142.0 / 36.25,
            "load_before": (1.0, 1.0, 1.0), "load_after": (1.2, 1.1, 1.0)}
    monkeypatch.setattr(vs_trl, "main", fake("vs_trl", trl))
    monkeypatch.setattr(vs_verl, "main", fake("vs_verl", verl))
    text = three_engines.main(["--out", str(tmp_path / "bench"), "--prompts", "4"], run=three_engines._in_this_process)
    work = ["--experiment", "smollm2_add2", "--prompts", "4", "--responses", "8", "--tokens", "24", "--micro-batch",
            "8", "--threads", "1", "--warmup", "1"]
    assert calls == {"vs_trl": [*work, "--blocks", "3", "--steps", "1"], "vs_verl": [*work, "--steps", "2"]}
    assert (tmp_path / "bench" / "vs_trl.txt").read_text() == "vs_trl ran\n"
    assert (tmp_path / "bench" / "vs_verl.txt").read_text() == "vs_verl ran\n"
    assert (tmp_path / "bench" / "summary.txt").read_text() == text
    lines = text.splitlines()
    assert lines[0] == "TRL       143.00 s/step; dapo-exp beside it 35.80 s/step; dapo-exp / TRL 0.250"
    assert lines[1] == "verl      142.00 s/step; dapo-exp beside it 36.25 s/step; verl / dapo-exp 3.917"
    assert "vs_trl 0.71 1.50 1.90 -> 1.00 1.05 1.40" in lines[2] and "vs_verl 1.00 1.00 1.00 -> 1.20 1.10 1.00" in lines[2]


def test_each_benchmark_parses_the_work_it_is_given():
    args = three_engines.parse_args(["--out", "x"])
    work = three_engines.work_args(args)
    assert vs_trl.parse_args([*work, "--blocks", "3", "--steps", "1"]).experiment == "smollm2_add2"
    assert vs_verl.parse_args([*work, "--steps", "2"]).tokens == 24


def test_a_benchmark_runs_in_a_process_of_its_own_and_its_output_is_kept(tmp_path, capfd):
    """Each benchmark is spawned (the first one's models must not stay in memory beside verl's workers): the
    child's return value comes back, and what it printed reaches both the terminal and the file."""
    got = three_engines.in_child("dapo_exp.benchmarks.three_engines:_child_probe", ["a", "b"], tmp_path / "o.txt")
    assert got["args"] == ["a", "b"] and got["pid"] != os.getpid()
    assert (tmp_path / "o.txt").read_text() == "child says a b\n"
    assert "child says a b" in capfd.readouterr().out


def test_a_benchmark_that_fails_in_its_process_is_an_error_naming_it_not_a_hang(tmp_path):
    with pytest.raises(RuntimeError, match=r"three_engines:parse_args failed in its process: SystemExit"):
        three_engines.in_child("dapo_exp.benchmarks.three_engines:parse_args", ["--no-such-flag"], tmp_path / "o.txt")
