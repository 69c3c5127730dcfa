"""The W&B source gives the same frames as the run directories.

Runs are written by the project's own tracker (dapo_exp.tracking.start_tracker,
backend wandb, mode offline: no network, no account). The offline reader parses
their ``.wandb`` files; the online reader (``wandb.Api``) is exercised with a
stand-in API serving the same runs, since the real one needs a server.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pandas as pd
import pytest
from fixtures_runs import log_run_to_wandb, make_sweep

from dapo_exp import analysis as A
from dapo_exp.analysis import wandb_reader as W

SPEC = [
    ("grpo", 0, 0.30, "finished"),
    ("grpo", 1, 0.34, "finished"),
    ("clip_ds", 0, 0.41, "finished"),
    ("clip_ds", 1, 0.44, "finished"),
    ("clip", 2, 0.00, "failed"),
    ("full", 2, 0.00, "killed"),
]
# columns that name where a run came from; everything else must agree across sources
WHERE = ["run", "source", "path", "name", "group", "exclude_reason"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    keep = {k: os.environ.get(k) for k in ("WANDB_MODE", "WANDB_SILENT", "WANDB_DISABLE_GIT")}
    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true")
    try:
        root = tmp_path_factory.mktemp("multirun") / "wb"
        for run in make_sweep(root, SPEC):
            log_run_to_wandb(run, group="wb")
        import wandb

        if wandb.run is not None:  # the killed run is still open: close it as a crash would
            wandb.run.finish(exit_code=0)
    finally:
        for k, v in keep.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return root


def _key_frame(rs: A.RunSet) -> pd.DataFrame:
    cols = [c for c in rs.runs.columns if c not in WHERE]
    return rs.runs[cols].sort_values(["label", "seed"]).reset_index(drop=True)


def _key_history(rs: A.RunSet) -> pd.DataFrame:
    return rs.history.drop(columns="run").sort_values(["label", "seed", "metric", "step"]).reset_index(drop=True)


def _assert_same(a: A.RunSet, b: A.RunSet) -> None:
    ka, kb = _key_frame(a), _key_frame(b)
    assert sorted(ka.columns) == sorted(kb.columns)
    pd.testing.assert_frame_equal(ka, kb[ka.columns], check_dtype=False)
    pd.testing.assert_frame_equal(_key_history(a), _key_history(b), check_dtype=False)


def test_offline_wandb_equals_run_dirs(sweep):
    local = A.load_runs(sweep)
    wb = A.load_wandb(sweep)
    assert len(wb.runs) == len(SPEC)
    assert set(wb.runs["source"]) == {"wandb"}
    _assert_same(local, wb)
    st = wb.runs.set_index("label")["status"].to_dict()
    assert st["clip"] == "failed" and st["full"] == "killed"
    # the run directory is found above wandb/, so the samples are readable from W&B runs too
    assert len(A.load_samples(wb)) == 4 * 8
    ta, tb = A.comparison_table(local), A.comparison_table(wb)
    pd.testing.assert_frame_equal(ta, tb)


def test_offline_filters_by_group_and_tags(sweep):
    assert len(W.read_offline(sweep, group="wb")) == len(SPEC)
    assert W.read_offline(sweep, group="other") == []
    assert len(W.read_offline(sweep, tags=["synthetic", "grpo"])) == 2


def test_torn_wandb_file_keeps_what_was_written(sweep, tmp_path):
    f = next(sweep.glob("fixes=grpo,seed=0/wandb/*/*.wandb"))
    data = f.read_bytes()
    torn = tmp_path / "run-torn.wandb"
    torn.write_bytes(data[: len(data) * 2 // 3])
    run = W.parse_wandb_file(torn)
    assert run.state is None  # no exit record
    assert 0 < len(run.history) < len(W.parse_wandb_file(f).history)
    bad = tmp_path / "bad.wandb"
    bad.write_bytes(b"not a wandb file")
    with pytest.raises(ValueError, match="bad header"):
        W.parse_wandb_file(bad)


class FakeRun:
    """What the code reads of ``wandb.apis.public.Run``."""

    def __init__(self, r: W.WandbRun, fail_history: bool = False):
        self.id, self.name, self.group, self.tags, self.state = r.id, r.name, r.group, r.tags, r.state
        self.config, self.summary_metrics = dict(r.config), dict(r.summary)
        self._history, self._fail = r.history, fail_history

    def scan_history(self):
        if self._fail:
            raise AssertionError("history downloaded again although cached")
        return iter([dict(h) for h in self._history])


class FakeApi:
    """What the code reads of ``wandb.Api``: ``runs(path, filters)``."""

    def __init__(self, runs, fail_history=False, offline=False):
        self._runs, self._fail, self._offline, self.calls = runs, fail_history, offline, []

    def runs(self, path, filters=None):
        if self._offline:
            raise ConnectionError("no network")
        self.calls.append((path, filters))
        group = (filters or {}).get("group")
        return [FakeRun(r, self._fail) for r in self._runs if group is None or r.group == group]


def test_online_path_gives_the_same_frames_and_caches(sweep, tmp_path):
    offline_runs = W.read_offline(sweep)
    for r in offline_runs:
        r.path = None  # online runs have no local directory
    cache = tmp_path / "cache"
    api = FakeApi(offline_runs)
    online = A.load_wandb("me/dapo-exp/wb", api=api, cache_dir=cache)
    assert api.calls == [("me/dapo-exp", {"group": "wb"})]
    _assert_same(A.load_runs(sweep), online)
    assert len(list(cache.glob("me/dapo-exp/*/history.parquet"))) == len(SPEC)
    # second time: finished runs come from the parquet cache, not downloaded again
    again = A.load_wandb("me/dapo-exp/wb", api=FakeApi(offline_runs, fail_history=True), cache_dir=cache)
    _assert_same(online, again)
    # no network: the last query's runs from the cache, with a warning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cached = A.load_wandb("me/dapo-exp/wb", api=FakeApi([], offline=True), cache_dir=cache)
    assert any("using the cached runs" in str(w.message) for w in caught)
    _assert_same(online, cached)
    with pytest.raises(ConnectionError):
        A.load_wandb("me/dapo-exp/other", api=FakeApi([], offline=True), cache_dir=cache)
    with pytest.raises(ValueError, match="entity/project"):
        A.load_wandb("just-a-name-that-is-not-a-path", api=api, cache_dir=cache)


def test_trainer_summary_accepts_flat_keys():
    s = W.trainer_summary(
        {"status": "finished", "final/eval/acc_avg": 0.5, "_runtime": 12.0, "eval/acc_avg": {"max": 1}}
    )
    assert s == {"status": "finished", "final": {"eval/acc_avg": 0.5}, "wall_time_s": 12.0}
    assert W.trainer_summary({"eval/acc_avg": 0.3, "_runtime": 1.0}) is None


def test_cli_reads_offline_wandb(sweep, tmp_path, capsys):
    from dapo_exp.analysis.cli import main

    assert main(["--wandb", str(sweep), "--out", str(tmp_path), "--no-figures"]) == 0
    assert any(ln.startswith("clip_ds ") and "±" in ln for ln in capsys.readouterr().out.splitlines())


def test_status_from_final_metrics_when_the_trainer_logs_no_status():
    """The trainer may set only ``final/...`` in the W&B summary: that marks a finished run."""
    cfg = {"seed": 3, "preset": "clip", "algo": {"eps_low": 0.2, "eps_high": 0.28, "dynamic_sampling": False,
                                                "loss_agg": "seq-mean-token-mean", "overlong_punishment": "none",
                                                "overlong_filtering": False}}
    hist = [{"train/step": 0, "_step": 0, "eval/acc_avg": 0.1}, {"train/step": 1, "_step": 1, "actor/entropy": 1.0},
            {"train/step": 2, "_step": 2, "eval/acc_avg": 0.4, "actor/entropy": 0.8}]
    runs = [
        W.WandbRun("a", cfg, {"final/eval/acc_avg": 0.4, "final/step": 2, "wall_time_s": 9.0}, hist, "finished"),
        W.WandbRun("b", cfg, {"_runtime": 3.0}, hist[:2], "finished"),  # never reached the end
        W.WandbRun("c", cfg, {"final/eval/acc_avg": 0.4}, hist, "crashed"),
    ]
    rs = A.records_to_runset([W.to_record(r) for r in runs])
    r = rs.runs.set_index("run")
    assert r["status"].to_dict() == {"a": "finished", "b": "killed", "c": "crashed"}
    assert r["included"].to_dict() == {"a": True, "b": False, "c": False}
    a = r.loc["a"]
    assert (a["label"], a["seed"], a["clip_higher"], a["wall_time_s"]) == ("clip", 3, True, 9.0)
    assert (a["final/eval/acc_avg"], a["best/eval/acc_avg"], a["base/eval/acc_avg"]) == (0.4, 0.4, 0.1)
    assert a["end/actor/entropy"] == 0.8


def _records(path):
    from wandb.proto import wandb_internal_pb2 as pb

    for raw in W.iter_records(path):
        rec = pb.Record()
        rec.ParseFromString(raw)
        yield rec


def test_analysis_logged_as_an_offline_summary_run(sweep, tmp_path, monkeypatch):
    """The table, effects and figures go to one W&B run (job_type analysis) in the sweep's group,
    and its table holds exactly the strings of table.md."""
    import json

    from dapo_exp.analysis.report import run_analysis

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    res = run_analysis(sweep, out=tmp_path / "analysis", wandb_log={"mode": "offline"})
    assert res.wandb is not None and res.effects is not None
    files = list((tmp_path / "analysis" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1
    run = next(r.run for r in _records(files[0]) if r.WhichOneof("record_type") == "run")
    # the runs of the fixture sweep say sweep "demo": the summary run joins that group, never "default"
    assert (run.job_type, run.run_group) == ("analysis", "demo") == ("analysis", res.wandb["group"])
    parsed = W.parse_wandb_file(files[0])
    summ = parsed.summary
    assert {"comparison_table", "comparison_table_numeric", "effects", "effects_numeric"} <= set(summ)
    assert summ["comparison_table"]["_type"] == "table-file"
    figures = {k.removeprefix("figures/"): v for k, v in summ.items() if k.startswith("figures/")}
    assert {"curves_vs_step", "effects_forest"} <= set(figures)
    assert "Student-t" in summ["caption"] and summ["runs"] == res.data.describe()
    media = files[0].parent / "files"
    table_json = json.loads((media / summ["comparison_table"]["path"]).read_text())
    shown = A.format_table(res.table)
    assert table_json["columns"] == list(shown.columns)
    assert [[str(v) for v in r] for r in table_json["data"]] == shown.astype(str).values.tolist()
    assert (media / figures["effects_forest"]["path"]).stat().st_size > 5000
    # reading W&B runs never mistakes the summary run for a training run (it sits in the sweep's group)
    assert parsed.job_type == "analysis" and W.read_offline(tmp_path) == []


def test_summary_group_is_derived_from_the_sweep():
    from dapo_exp.analysis.wandb_writer import summary_group

    assert summary_group(pd.DataFrame({"run": ["a"], "group": ["wb"], "sweep": ["x"]})) == "wb"
    assert summary_group(pd.DataFrame({"run": ["a", "b"], "sweep": ["fractional", "fractional"]})) == "fractional"
    shared = pd.DataFrame({"run": ["a", "b"], "sweep": ["default", "default"]})
    g = summary_group(shared, "multirun/default-lr/analysis")
    assert g.startswith("default-lr-") and g != "default"
    assert summary_group(shared, "x/analysis") != summary_group(shared.assign(run=["c", "d"]), "x/analysis")


def test_callback_logs_the_analysis_to_wandb_when_the_runs_do():
    from omegaconf import OmegaConf

    from dapo_exp.analysis.callback import AnalysisCallback

    wb = OmegaConf.create({"logger": {"backend": "wandb", "project": "p", "mode": "offline", "group": None}})
    assert AnalysisCallback()._wandb_log(wb) == {"project": "p", "mode": "offline", "group": None}
    assert AnalysisCallback()._wandb_log(OmegaConf.create({"logger": {"backend": "none"}})) is None
    assert AnalysisCallback()._wandb_log(OmegaConf.create({})) is None
    assert AnalysisCallback(wandb=False)._wandb_log(wb) is None
    off = OmegaConf.create({"logger": {"backend": "wandb", "mode": "disabled"}})
    assert AnalysisCallback()._wandb_log(off) is None
