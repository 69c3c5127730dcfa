"""The refactor check's comparison: equal rows pass, any non-timing difference or missing run fails."""

import json

from dapo_exp.benchmarks.compare_runs import main


def _run(path, rows):
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_equal_rows_pass_and_timing_is_ignored(tmp_path, capsys):
    _run(tmp_path / "a" / "r", [{"step": 1, "x": 0.5, "timing_s/step": 1.0, "perf/gen_tokens_per_s": 3.0}])
    _run(tmp_path / "b" / "r", [{"step": 1, "x": 0.5, "timing_s/step": 9.0, "perf/gen_tokens_per_s": 7.0}])
    assert main([str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    assert "2 metric values compared (timing aside), 0 differences" in capsys.readouterr().out


def test_a_changed_value_a_missing_key_or_run_fails(tmp_path, capsys):
    _run(tmp_path / "a" / "r", [{"step": 1, "x": 0.5, "y": 1}])
    _run(tmp_path / "b" / "r", [{"step": 1, "x": 0.5000001}])
    _run(tmp_path / "a" / "only_a", [{"step": 1}])
    assert main([str(tmp_path / "a"), str(tmp_path / "b")]) == 1
    out = capsys.readouterr().out
    assert "x 0.5 vs 0.5000001" in out and "y 1 vs '<missing>'" in out and "only_a: only in" in out


def test_with_new_metrics_ok_a_metric_only_b_logs_is_listed_not_counted_and_a_lost_one_still_fails(tmp_path, capsys):
    _run(tmp_path / "a" / "r", [{"step": 1, "x": 0.5}])
    _run(tmp_path / "b" / "r", [{"step": 1, "x": 0.5, "fix/own": 0.25}])
    assert main([str(tmp_path / "a"), str(tmp_path / "b")]) == 1  # by default a new key is a difference
    assert main([str(tmp_path / "a"), str(tmp_path / "b"), "--new-metrics-ok"]) == 0
    assert "metrics only B logs (added): fix/own" in capsys.readouterr().out
    assert main([str(tmp_path / "b"), str(tmp_path / "a"), "--new-metrics-ok"]) == 1  # one B lost: a difference
