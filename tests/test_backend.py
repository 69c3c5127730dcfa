"""backend=native|verl without verl installed: the translation's coverage and refusals, the README's
table, the dispatch from train(), and the launcher end to end with a stand-in for verl's interpreter.

What needs verl itself (the overrides against verl's config, the same tensors through verl's code)
is tests/test_verl_backend.py, run with verl's own interpreter by .ci/test.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from dapo_exp import fixes, rundir
from dapo_exp.backends import verl as vb
from dapo_exp.config import Config, ConfigError
from dapo_exp.hydra_setup import register_resolvers

ROOT = Path(__file__).resolve().parents[1]
CONF = str(ROOT / "conf")


def compose_cfg(*overrides: str):
    register_resolvers()
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose("config", overrides=list(overrides))


def paper(*overrides: str):
    return compose_cfg("backend=verl", "experiment=dapo_32b_paper", "out_dir=/tmp/run", *overrides)


def _schema_leaves() -> set[str]:
    return {p for p, _ in vb._leaves(OmegaConf.to_container(OmegaConf.structured(Config)))}


def test_every_config_key_has_exactly_one_rule_and_no_rule_is_stale():
    leaves = _schema_leaves()
    assert leaves - set(vb.RULES) == set(), "keys of the schema with no verl rule"
    assert set(vb.RULES) - leaves == set(), "rules for keys the schema does not have"
    declared = {f"algo.{k}" for f in fixes.FIXES.values() for k in f.keys}
    assert declared == set(vb.FIX_RULES), "the fix rules are the registry's keys, no more, no less"


def test_the_readme_table_is_the_translation():
    readme = (ROOT / "README.md").read_text()
    assert vb.markdown_table() in readme, "README's backend=verl table is stale: python -m dapo_exp.backends.verl"


def test_the_defaults_of_the_verl_group():
    c = compose_cfg("backend=verl", "experiment=qwen0.5b_gsm8k", "fixes=full")
    assert c.backend.name == "verl" and c.backend.python == ".venv-verl/bin/python"
    assert c.algo.ds_max_rounds == 0  # the group removes the experiment's cap: verl has none
    assert compose_cfg().backend.name == "native" and compose_cfg().algo.ds_max_rounds == 10


def test_a_fix_without_a_verl_translation_fails_by_name():
    """The fixes are translated through the registry: an extension fix's key is refused, naming it."""
    fixes.register_fix(fixes.Fix(name="bonus", short="bonus", title="Bonus", paper="-", keys=("ext.bonus",),
                                 is_on=lambda a: bool(a.ext.get("bonus", 0)), objective=(), metrics=()))
    try:
        with pytest.raises(vb.Untranslatable, match=r"algo\.ext\.bonus.*fix 'bonus'"):
            vb.translate(paper("+algo.ext.bonus=1.0"), label="x")
    finally:
        fixes.unregister_fix("bonus")


def test_a_registry_key_without_a_rule_fails_by_name(monkeypatch):
    monkeypatch.delitem(vb.FIX_RULES, "algo.eps_high")
    with pytest.raises(vb.Untranslatable, match=r"algo\.eps_high=0\.28 .*fix 'clip_higher'"):
        vb.translate(paper("fixes=full"), label="x")


@pytest.mark.parametrize("overrides, key", [
    (["fixes=full", "algo.ds_surplus=carry"], "algo.ds_surplus"),
    (["fixes=full", "algo.ds_max_rounds=10"], "algo.ds_max_rounds"),
    (["fixes=full", "algo.ds_oversample=1.5"], "algo.ds_oversample"),
    (["overlong_punishment=linear_ramp"], "algo.overlong_punishment"),
    (["overlong_punishment=beyond_max"], "algo.overlong_punishment"),
    (["fixes=full", "algo.overlong_max_len=20000"], "algo.overlong_max_len"),
    (["fixes=full", "algo.overlong_cache_len=0"], "algo.overlong_cache_len"),
    (["algo.loss_agg=group-token-mean"], "algo.loss_agg"),
    (["rollout=hf"], "rollout.engine"),
    (["task=arith"], "task.name"),
    (["model=tiny"], "model.path"),
    (["train.device=cpu"], "train.device"),
    (["algo.tis_cap=2.0"], "algo.tis_cap"),
    (["algo.adv_eps=1e-5"], "algo.adv_eps"),
    (["task.verifier=math_verify"], "task.verifier"),
    (["task.chat_template=false"], "task.chat_template"),
    (["eval.max_response_len=4096"], "eval.max_response_len"),
    (["train.logprob_chunk=512"], "train.logprob_chunk"),
    (["rollout.gen_batch_size=8"], "rollout.gen_batch_size"),
    (["task.verifier_timeout_s=1.0"], "task.verifier_timeout_s"),
])
def test_a_value_verl_cannot_honour_fails_naming_its_key(overrides, key):
    with pytest.raises(vb.Untranslatable, match=rf"^{key.replace('.', chr(92) + '.')}="):
        vb.translate(paper(*overrides), label="x")


def test_settings_of_an_off_fix_are_not_read_as_natively():
    """ds_surplus=carry means nothing without dynamic sampling, nor a ramp length without the punishment."""
    job = vb.translate(paper("fixes=grpo", "algo.ds_surplus=carry", "algo.ds_oversample=1.5",
                             "algo.overlong_cache_len=0"), label="grpo")
    assert job.values["algorithm.filter_groups.enable"] is False
    assert job.values["+reward.reward_kwargs.overlong_buffer_cfg.enable"] is False
    assert "+reward.reward_kwargs.overlong_buffer_cfg.len" not in job.values


def test_extra_overrides_cannot_overrule_the_translation():
    ok = vb.translate(paper("backend.extra=['actor_rollout_ref.model.use_remove_padding=false']"), label="x")
    assert ok.overrides[-1] == "actor_rollout_ref.model.use_remove_padding=false"
    with pytest.raises(vb.Untranslatable, match="backend.extra sets actor_rollout_ref.actor.clip_ratio_high"):
        vb.translate(paper("backend.extra=['actor_rollout_ref.actor.clip_ratio_high=0.3']"), label="x")


def test_the_paper_row_translates_to_the_released_recipes_values():
    job = vb.translate(paper("fixes=paper_6_dapo", "seed=3", "sweep=ladder"), label="paper_6_dapo")
    v = job.values
    assert (v["actor_rollout_ref.actor.clip_ratio_low"], v["actor_rollout_ref.actor.clip_ratio_high"],
            v["actor_rollout_ref.actor.clip_ratio_c"]) == (0.2, 0.28, 10.0)
    assert v["actor_rollout_ref.actor.loss_agg_mode"] == "token-mean"
    assert (v["data.train_batch_size"], v["actor_rollout_ref.rollout.n"],
            v["actor_rollout_ref.actor.ppo_mini_batch_size"]) == (512, 16, 32)
    assert v["algorithm.filter_groups.metric"] == "acc" and v["algorithm.filter_groups.max_inflight_gen_batches"] == 3
    assert v["trainer.experiment_name"] == "paper_6_dapo-s3" and v["data.seed"] == 3
    assert job.env["WANDB_RUN_GROUP"] == "ladder" and "overlong_filtering" in job.env["WANDB_TAGS"].split(",")
    assert v["trainer.test_freq"] == 5 and v["trainer.save_freq"] == 5
    assert v["data.train_files"] == "/tmp/run/verl_data/train.parquet"


@pytest.mark.parametrize("value, rendered", [
    ("token-mean", "token-mean"), ("/a/b c", "'/a/b c'"), ("x=1,y=2", "'x=1,y=2'"), ("true", "'true'"),
    ("10", "'10'"), (None, "null"), (True, "true"), (1e-6, "1e-06"), ([0.9, 0.999], "[0.9,0.999]"),
    (float("inf"), "inf"), ("it's", "'it\\'s'"),
])
def test_hydra_rendering(value, rendered):
    assert vb.render_override("k", value) == f"k={rendered}"


def test_train_dispatches_and_fails_before_anything_is_written(tmp_path):
    """The default toy (tiny model, arith, HF engine) cannot run on verl: refused before any file."""
    from dapo_exp.train import train

    cfg = compose_cfg("backend=verl", f"out_dir={tmp_path / 'run'}")
    with pytest.raises(ConfigError, match=r"^task\.name='arith'"):
        train(cfg)
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------- #
# The launcher, with a stand-in for verl's interpreter                          #
# --------------------------------------------------------------------------- #
FAKE_VERL = '''#!{python}
"""Stands in for `python -m verl.trainer.main_ppo <overrides>`: records its argv and environment and
writes two steps of verl-format file-logger rows ({{"step", "data"}}) where VERL_FILE_LOGGER_PATH says."""
import json, os, sys
assert sys.argv[1:3] == ["-m", "verl.trainer.main_ppo"], sys.argv
json.dump({{"argv": sys.argv[3:], "env": {{k: v for k, v in os.environ.items() if k.startswith(("WANDB", "VERL", "PYTHONPATH"))}}}},
          open("fake_verl_call.json", "w"))
rows = [{{"step": 0, "data": {{"val-core/math_dapo/acc/mean@2": 0.25}}}},
        {{"step": 1, "data": {{"critic/score/mean": -0.5, "actor/entropy": 1.2, "response_length/mean": 30.0}}}},
        {{"step": 2, "data": {{"critic/score/mean": 0.5, "actor/entropy": 1.1, "response_length/mean": 20.0,
                              "val-core/math_dapo/acc/mean@2": 0.75}}}}]
with open(os.environ["VERL_FILE_LOGGER_PATH"], "w") as f:
    f.writelines(json.dumps(r) + "\\n" for r in rows)
print("fake verl done")
sys.exit(int(os.environ.get("FAKE_VERL_RC", "0")))
'''


def _data(tmp_path: Path) -> Path:
    rows = [{"data_source": "math_dapo", "prompt": [{"role": "user", "content": f"What is {i} + {i}? Answer:"}],
             "ability": "MATH", "reward_model": {"ground_truth": str(2 * i), "style": "rule"},
             "extra_info": {"index": f"i{i}-{rep}"}} for rep in range(2) for i in range(5)]
    path = tmp_path / "math.parquet"
    pd.DataFrame(rows).to_parquet(path)
    return path


@pytest.fixture
def launched(tmp_path):
    fake = tmp_path / "fake_python"
    fake.write_text(FAKE_VERL.format(python=sys.executable))
    fake.chmod(0o755)
    (tmp_path / "model").mkdir()
    # what check_model_source asks of a model directory; the stand-in verl never loads it
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (tmp_path / "model" / name).write_text("{}")
    data = _data(tmp_path)

    def make(*overrides: str):
        return compose_cfg("backend=verl", "experiment=qwen1.5b_dapo_math", "fixes=paper_6_dapo",
                           f"task.train_source={data}", f"task.eval_source={data}", f"model.path={tmp_path / 'model'}",
                           f"backend.python={fake}", "logger=none", "train.steps=2", f"out_dir={tmp_path / 'run'}",
                           *overrides)

    return make, tmp_path / "run"


def test_the_launcher_runs_verl_and_the_analysis_lists_the_run(launched):
    from dapo_exp.analysis import load_runs
    from dapo_exp.train import train

    make, out = launched
    summary = train(make())
    assert summary["status"] == "finished" and summary["label"] == "paper_6_dapo"
    call = json.loads((out / "fake_verl_call.json").read_text())
    job = vb.translate(make(), label="paper_6_dapo")
    assert call["argv"][:len(job.overrides)] == job.overrides  # the translation, verbatim
    assert call["env"]["VERL_FILE_LOGGER_PATH"] == str(out / "verl_metrics.jsonl")
    assert call["env"]["PYTHONPATH"].split(":")[0] == str(ROOT)  # verl's workers import our extension
    assert "+ray_kwargs.ray_init.runtime_env.env_vars.PYTHONPATH=" + str(ROOT) in call["argv"]
    # the data, exported with the native loader: deduplicated, in verl's schema
    train_rows = pd.read_parquet(out / "verl_data" / "train.parquet")
    assert len(train_rows) == 5 and summary["data"] == {"train": 5, "eval": 5}
    assert set(train_rows.columns) >= {"data_source", "prompt", "reward_model", "extra_info"}
    assert train_rows.iloc[0]["prompt"][0]["role"] == "user" and train_rows.iloc[0]["reward_model"]["ground_truth"] == "0"
    # results home: metrics in our names, the summary's evaluations, the run in the analysis
    rows = rundir.read_jsonl(out / rundir.METRICS)
    assert [r["reward/mean"] for r in rows if "reward/mean" in r] == [-0.5, 0.5]
    assert summary["final"]["eval/acc_avg"] == 0.75 and summary["base"]["eval/acc_avg"] == 0.25
    runs = load_runs(out.parent).runs
    assert list(runs["label"]) == ["paper_6_dapo"] and runs["final/eval/acc_avg"].iloc[0] == 0.75
    assert json.loads((out / rundir.CONFIG).read_text())["verl"]["command"][1:3] == ["-m", "verl.trainer.main_ppo"]
    # a finished run is skipped, as natively
    assert train(make())["status"] == "finished"


def test_a_failed_verl_run_is_recorded_and_a_rerun_keeps_its_metrics(launched, monkeypatch):
    from dapo_exp.train import train

    make, out = launched
    monkeypatch.setenv("FAKE_VERL_RC", "3")
    with pytest.raises(RuntimeError, match="verl exited with 3"):
        train(make())
    assert rundir.read_summary(out)["status"] == "failed"
    monkeypatch.setenv("FAKE_VERL_RC", "0")
    assert train(make())["status"] == "finished"
    assert (out / "verl_metrics.0.jsonl").exists()  # the first attempt's file is kept (verl truncates its own)


def test_dry_run_prints_the_command_and_launches_nothing(launched, capsys):
    from dapo_exp.train import train

    make, out = launched
    res = train(make("backend.dry_run=true"))
    assert res["status"] == "dry_run" and "verl.trainer.main_ppo" in capsys.readouterr().out
    assert not (out / "fake_verl_call.json").exists() and rundir.read_summary(out) is None
