"""backend=native|verl without verl installed: the translation's coverage and refusals, the README's
table, the dispatch from train(), and the launcher end to end with a stand-in for verl's interpreter.

What needs verl itself (the overrides against verl's config, the same tensors through verl's code)
is tests/test_verl_backend.py, run with verl's own interpreter by .ci/test.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from paper_dry_run import LADDER, paper_dry_run, small_parquet

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
    """Every key has a rule, but the keys of a fix with no verl translation at all (refused when it is on)."""
    unruled = {f"algo.{k}" for f in fixes.FIXES.values() if not any(f"algo.{k}" in vb.FIX_RULES for k in f.keys)
               for k in f.keys}
    leaves = _schema_leaves() - unruled
    assert leaves - set(vb.RULES) == set(), "keys of the schema with no verl rule"
    assert set(vb.RULES) - leaves == set(), "rules for keys the schema does not have"
    declared = {f"algo.{k}" for f in fixes.FIXES.values() for k in f.keys}
    assert declared - unruled == set(vb.FIX_RULES), "the fix rules are the registry's keys, no more, no less"


def test_the_documented_table_is_the_translation():
    page = (ROOT / "docs" / "reference" / "verl.md").read_text()
    assert vb.markdown_table() in page, "docs/reference/verl.md's table is stale: python -m dapo_exp.backends.verl"


def test_the_defaults_of_the_verl_group():
    c = compose_cfg("backend=verl", "experiment=qwen0.5b_gsm8k", "fixes=full")
    assert c.backend.name == "verl" and c.backend.python == ".venv-verl/bin/python"
    assert c.algo.ds_max_rounds == 0  # the group removes the experiment's cap: verl has none
    assert compose_cfg().backend.name == "native" and compose_cfg().algo.ds_max_rounds == 10


def test_a_fix_without_a_verl_translation_fails_by_name():
    """The fixes are translated through the registry: an extension fix's key is refused, naming it."""
    fixes.register_fix(fixes.Fix(name="bonus", short="bonus", title="Bonus", paper="-", keys=("ext.bonus",),
                                 is_on=lambda a: bool(a.ext.get("bonus", 0)), slots=(), bind=lambda algo, run: {}))
    try:
        with pytest.raises(vb.Untranslatable, match=r"algo\.ext\.bonus.*fix 'bonus'"):
            vb.translate(paper("+algo.ext.bonus=1.0"), label="x")
    finally:
        fixes.unregister_fix("bonus")


def test_a_fix_without_verl_rules_is_refused_when_on_and_passes_when_off_at_its_defaults(monkeypatch):
    """A fix in the package with no verl translation (no rule for any of its keys): a verl job with it on is
    refused naming the fix and the way out; off, its keys must keep their defaults and nothing reaches verl."""
    monkeypatch.delitem(vb.FIX_RULES, "algo.dr_grpo_norm")
    monkeypatch.delitem(fixes.FIXES["dr_grpo_norm"].verl, "dr_grpo_norm")
    job = vb.translate(paper("fixes=full"), label="x")
    assert job.not_translated["algo.dr_grpo_norm"] == "none: fix 'dr_grpo_norm' is off and has no verl translation"
    assert not any("dr_grpo" in o for o in job.overrides)
    with pytest.raises(vb.Untranslatable, match=r"algo\.dr_grpo_norm=True .*fix 'dr_grpo_norm'.*backend=native"):
        vb.translate(paper("fixes=full", "token_level_loss=disabled", "dr_grpo_norm=enabled"), label="x")


def test_a_registry_key_without_a_rule_fails_by_name(monkeypatch):
    monkeypatch.delitem(vb.FIX_RULES, "algo.ds_max_rounds")
    monkeypatch.delitem(fixes.FIXES["dynamic_sampling"].verl, "ds_max_rounds")
    with pytest.raises(vb.Untranslatable, match=r"algo\.ds_max_rounds=.* .*fix 'dynamic_sampling'"):
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
    (["rollout.engine=hf"], "rollout.engine"),
    (["algo.adv_eps=1e-5"], "algo.adv_eps"),
    (["task.verifier=math_verify"], "task.verifier"),
    (["task.chat_template=false"], "task.chat_template"),
    (["eval.max_response_len=4096"], "eval.max_response_len"),
    (["train.logprob_chunk=512"], "train.logprob_chunk"),
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
    """A value verl cannot honour is refused by train() before any file is written."""
    from dapo_exp.train import train

    cfg = compose_cfg("backend=verl", "train.device=cpu", "train.logprob_chunk=512", f"out_dir={tmp_path / 'run'}")
    with pytest.raises(ConfigError, match=r"^train\.logprob_chunk=512"):
        train(cfg)
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_a_local_gpu_launch_without_a_gpu_is_refused_naming_the_cpu_mode(tmp_path, monkeypatch):
    """verl's GPU mode on a machine without one would wait for a GPU forever: refused, naming train.device=cpu."""
    from dapo_exp.backends import verl_launch

    monkeypatch.setattr(verl_launch, "resolve_python", lambda path, must_exist=True: "/bin/true")
    cfg = compose_cfg("backend=verl", f"out_dir={tmp_path / 'run'}")
    with pytest.raises(ConfigError, match=r"^train\.device=auto: this machine has no GPU.*train\.device=cpu"):
        verl_launch.launch(cfg)
    assert not (tmp_path / "run").exists()


def test_the_toy_translates_with_its_own_reward_model_and_cpu_mode():
    """The default toy on verl: its warm start exported as the model, its verifier as verl's reward function
    (any verifier), its prompts within the tiny model's positions, and the CPU mode's settings."""
    cfg = compose_cfg("backend=verl", "train.device=cpu", "task.verifier=math_verify", "out_dir=/runs/toy")
    job = vb.translate(cfg, label="full")
    v = job.values
    assert v["actor_rollout_ref.model.path"] == "/runs/toy/verl_model"
    assert v["reward.custom_reward_function.path"] == vb.REWARD_FILE and Path(vb.REWARD_FILE).is_file()
    assert v["reward.custom_reward_function.name"] == "compute_score" and job.env["DAPO_VERL_VERIFIER"] == "math_verify"
    assert v["data.max_prompt_length"] + v["data.max_response_length"] <= vb.TINY_POSITIONS
    assert v["trainer.device"] == "cpu" and v["+ray_kwargs.ray_init.num_gpus"] == 1
    assert (v["actor_rollout_ref.actor.strategy"], v["actor_rollout_ref.model.use_remove_padding"]) == ("fsdp2", False)
    assert v["actor_rollout_ref.rollout.free_cache_engine"] is False and v["reward.num_workers"] == 1
    assert job.env["VERL_PLATFORM"] == "cpu" and job.env["VERL_USE_EXTERNAL_MODULES"] == vb.CPU_MODULE
    assert cfg.rollout.engine == "vllm" and cfg.eval.final_samples is None  # conf/backend/verl.yaml
    gpu = vb.translate(compose_cfg("backend=verl", "out_dir=/runs/toy"), label="full").values
    assert gpu["trainer.device"] == "cuda" and "+ray_kwargs.ray_init.num_gpus" not in gpu
    assert gpu["actor_rollout_ref.rollout.free_cache_engine"] is True  # sleep mode on a GPU (the schema default)


# --------------------------------------------------------------------------- #
# The launcher, with a stand-in for verl's interpreter                          #
# --------------------------------------------------------------------------- #
FAKE_VERL = '''#!{python}
"""Stands in for `python -m verl.trainer.main_ppo <overrides>`: records its argv and environment and
writes two steps of verl-format file-logger rows ({{"step", "data"}}) where VERL_FILE_LOGGER_PATH says;
with FAKE_VERL_SLEEP set, then waits for SIGTERM (exit 143)."""
import json, os, signal, sys, time
assert sys.argv[1:3] == ["-m", "verl.trainer.main_ppo"], sys.argv
call = {{"argv": sys.argv[3:], "env": {{k: v for k, v in os.environ.items()
                                     if k.startswith(("WANDB", "VERL", "PYTHONPATH", "RAY_ADDRESS"))}}}}
rows = [{{"step": 0, "data": {{"val-core/math_dapo/acc/mean@2": 0.25}}}},
        {{"step": 1, "data": {{"critic/score/mean": -0.5, "actor/entropy": 1.2, "response_length/mean": 30.0}}}},
        {{"step": 2, "data": {{"critic/score/mean": 0.5, "actor/entropy": 1.1, "response_length/mean": 20.0,
                              "val-core/math_dapo/acc/mean@2": 0.75}}}}]
with open(os.environ["VERL_FILE_LOGGER_PATH"], "w") as f:
    f.writelines(json.dumps(r) + "\\n" for r in rows)
if os.environ.get("FAKE_VERL_SLEEP"):
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
json.dump(call, open(".fake_verl_call.tmp", "w"))
os.replace(".fake_verl_call.tmp", "fake_verl_call.json")  # written last: the trainer is up
if os.environ.get("FAKE_VERL_SLEEP"):
    time.sleep(120)
print("fake verl done")
sys.exit(int(os.environ.get("FAKE_VERL_RC", "0")))
'''


@pytest.fixture
def launched(tmp_path, monkeypatch):
    from dapo_exp.backends import verl_launch

    monkeypatch.setattr(verl_launch, "_has_cuda", lambda: True)  # the stand-in plays verl on a GPU machine
    fake = tmp_path / "fake_python"
    fake.write_text(FAKE_VERL.format(python=sys.executable))
    fake.chmod(0o755)
    (tmp_path / "model").mkdir()
    # what check_model_source asks of a model directory; the stand-in verl never loads it
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (tmp_path / "model" / name).write_text("{}")
    data = small_parquet(tmp_path / "math.parquet")

    def make(*overrides: str):
        return compose_cfg("backend=verl", "experiment=qwen1.5b_dapo_math", "fixes=paper_6_dapo",
                           f"task.train_source={data}", f"task.eval_source={data}", f"model.path={tmp_path / 'model'}",
                           f"backend.python={fake}", "logger=none", "train.steps=2", f"out_dir={tmp_path / 'run'}",
                           *overrides)

    return make, tmp_path / "run"


def test_the_launcher_runs_verl_and_the_analysis_lists_the_run(launched, capsys):
    from dapo_exp.analysis import load_runs
    from dapo_exp.train import train

    make, out = launched
    summary = train(make())
    assert summary["status"] == "finished" and summary["label"] == "paper_6_dapo"
    # it ends as a native run does: the summary screen, then where it was written
    printed = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(printed) if line.startswith("[dapo-exp] run paper_6_dapo seed 0: finished 2 steps"))
    assert "eval/acc_avg" in printed[start + 2] and printed[start + 2].split()[1:3] == ["0.250", "0.750"]
    assert printed[-1] == f"  written to {out}"
    call = json.loads((out / "fake_verl_call.json").read_text())
    job = vb.translate(make(), label="paper_6_dapo")
    assert call["argv"][:len(job.overrides)] == job.overrides  # the translation, verbatim
    assert call["env"]["VERL_FILE_LOGGER_PATH"] == str(out / "verl_metrics.jsonl")
    assert call["env"]["PYTHONPATH"].split(":")[0] == str(ROOT)  # verl's workers import our extension
    # this checkout first, then the caller's own PYTHONPATH (if any) after it
    ray_path = "+ray_kwargs.ray_init.runtime_env.env_vars.PYTHONPATH="
    assert [a.split("=", 1)[1].strip("'\"").split(":")[0] for a in call["argv"] if a.startswith(ray_path)] == [str(ROOT)]
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
    # the base weights verl loaded, identified as natively (the analysis' base column)
    assert summary["base_model"]["path"] == str(out.parent / "model") and len(summary["base_model"]["sha256"]) == 64
    assert runs["config.model.base_sha256"].iloc[0] == summary["base_model"]["files_sha256"][:12]
    assert json.loads((out / rundir.CONFIG).read_text())["verl"]["command"][1:3] == ["-m", "verl.trainer.main_ppo"]
    # a finished run is skipped, as natively
    assert train(make())["status"] == "finished"


@pytest.mark.parametrize("override, key", [("algo.kl_coef=-1", "algo.kl_coef"), ("algo.dual_clip=0.5", "algo.dual_clip"),
                                           ("algo.kl_estimator=k9", "algo.kl_estimator")])
def test_grpos_values_are_checked_before_a_verl_launch_as_natively(launched, override, key):
    """GRPO's checks (fixes/grpo.py) refuse a bad value before verl starts, as they do natively."""
    from dapo_exp.config import ConfigError
    from dapo_exp.train import train

    make, out = launched
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}"):
        train(make(override))
    assert not (out / "fake_verl_call.json").exists()


def test_a_verl_run_of_the_toy_is_based_on_the_warm_start_its_model_was_exported_from(tmp_path, monkeypatch):
    """verl loads an export of the toy's warm start (its weights copied, its tokenizer rebuilt with the same ids):
    the run records the export's identity and the warm start's, and the analysis' base column is the warm
    start's, as a native run of the same config records it."""
    from dapo_exp.analysis import load_runs
    from dapo_exp.backends import verl_launch
    from dapo_exp.runner import base_model
    from dapo_exp.train import train

    monkeypatch.setattr(verl_launch, "_has_cuda", lambda: True)
    fake = tmp_path / "fake_python"
    fake.write_text(FAKE_VERL.format(python=sys.executable))
    fake.chmod(0o755)
    out = tmp_path / "run"
    summary = train(compose_cfg("backend=verl", "fixes=grpo", f"backend.python={fake}", "logger=none", "train.steps=2",
                                "eval.final_problems=null", "eval.final_samples=null", f"out_dir={out}"))
    base = summary["base_model"]
    assert base["path"] == str(out / "verl_model")
    shipped = base["exported_from"]
    assert shipped == base_model(shipped["path"]) and "/assets/warmstart/" in shipped["path"]
    assert base["files"]["model.safetensors"] == shipped["files"]["model.safetensors"]  # the same weights
    assert base["files_sha256"] != shipped["files_sha256"]  # another tokenizer's files
    runs = load_runs(out.parent).runs
    assert runs["config.model.base_sha256"].iloc[0] == shipped["files_sha256"][:12]


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


def test_a_dry_run_says_when_the_interpreter_it_names_does_not_exist(launched, capsys, tmp_path):
    from dapo_exp.train import train

    make, _ = launched
    missing = tmp_path / "no-venv" / "bin" / "python"
    train(make("backend.dry_run=true", f"backend.python={missing}"))
    out = capsys.readouterr().out
    assert f"backend.python={missing} ({missing}) does not exist here" in out and "bash .ci/install-verl" in out
    train(make("backend.dry_run=true"))  # the stand-in exists: no note
    assert "does not exist here" not in capsys.readouterr().out


def test_the_terminal_gets_verls_progress_bar_and_not_its_noise():
    """verl.log keeps all of verl's output; the terminal gets its progress bar (tests/test_verl_run.py runs it)."""
    from dapo_exp.backends import verl_launch

    assert verl_launch.CONSOLE_LINE.search("(TaskRunnerV1 pid=1) Training Progress:  50%|#####     | 1/2")
    assert not verl_launch.CONSOLE_LINE.search("(AgentLoopWorkerTQ pid=2) WARNING: target_num_threads 8")



# --------------------------------------------------------------------------- #
# Layout and launching: the presets' layouts, the checks, the sbatch script     #
# --------------------------------------------------------------------------- #
def test_each_experiment_preset_carries_its_layout():
    """dapo_32b_paper: the released script's 16 nodes x 8 GPUs, vLLM TP 4, Ulysses SP 8, on SLURM;
    the one-GPU presets: 1 x 1 here."""
    v = vb.translate(paper("fixes=paper_6_dapo"), label="x").values
    c = paper()
    assert (c.backend.nnodes, c.backend.gpus_per_node, c.backend.rollout_tp, c.backend.sp_size,
            c.backend.launch) == (16, 8, 4, 8, "slurm")
    assert (v["trainer.nnodes"], v["trainer.n_gpus_per_node"]) == (16, 8)
    assert v["actor_rollout_ref.rollout.tensor_model_parallel_size"] == 4
    assert v["actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size"] == 8
    assert v["actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size"] == 8
    for experiment in ("qwen0.5b_gsm8k", "qwen1.5b_dapo_math"):
        b = compose_cfg("backend=verl", f"experiment={experiment}").backend
        assert (b.nnodes, b.gpus_per_node, b.rollout_tp, b.sp_size, b.launch) == (1, 1, 1, 1, "local")
    # the backend group does not overrule a preset's layout (it is applied after the preset)
    assert compose_cfg("experiment=dapo_32b_paper", "backend=verl").backend.nnodes == 16


@pytest.mark.parametrize("overrides, match", [
    (["backend.nnodes=0"], r"^backend\.nnodes: must be >= 1"),
    (["backend.gpus_per_node=0"], r"^backend\.gpus_per_node: must be >= 1"),
    (["backend.gpus_per_node=8", "backend.rollout_tp=3"], r"^backend\.rollout_tp: must divide backend\.gpus_per_node=8"),
    (["backend.gpus_per_node=2", "backend.rollout_tp=4"], r"^backend\.rollout_tp: must divide"),
    (["backend.nnodes=3", "backend.gpus_per_node=2", "backend.sp_size=4"], r"^backend\.sp_size: must divide .* = 6"),
    (["backend.launch=pbs"], r"^backend\.launch='pbs' is not valid; choose one of: local, slurm"),
    (["backend.slurm.ray_port=0"], r"^backend\.slurm\.ray_port"),
    (["backend.nnodes=2"], r"^backend\.nnodes=2 with backend\.launch=local: .*RAY_ADDRESS"),
    (["backend.launch=slurm"], r"^backend\.launch=slurm: no `sbatch` on PATH"),
])
def test_a_bad_layout_or_launch_fails_before_anything_runs_naming_its_key(launched, monkeypatch, overrides, match):
    from dapo_exp.train import train

    make, out = launched
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("PATH", str(out.parent / "no-slurm-here"))  # no sbatch
    with pytest.raises(ConfigError, match=match):
        train(make(*overrides))
    assert not out.exists()


FAKE_SLURM = {
    # srun: records its call, drops its own --options, answers `hostname --ip-address`, runs the rest
    "srun": """echo "srun $*" >> "$FAKE_LOG"
while [ "${1#--}" != "$1" ]; do shift; done
[ "$1" = hostname ] && { echo "10.1.2.3 fe80::1"; exit 0; }
exec "$@"
""",
    # scontrol: the job's nodes; a requeue is recorded
    "scontrol": """echo "scontrol $*" >> "$FAKE_LOG"
[ "$1 $2" = "show hostnames" ] && printf '%s\\n' $FAKE_NODES
exit 0
""",
    # ray: records `ray start ...` with its pid; --block stays up like a Ray node until it is stopped
    # (FAKE_RAY_HEAD_RC: the head fails to start, as a raylet that times out)
    "ray": """case " $* " in *" --head "*) [ -n "${FAKE_RAY_HEAD_RC:-}" ] && { echo "raylet timed out"; exit "$FAKE_RAY_HEAD_RC"; };; esac
echo "ray $* pid=$$" >> "$FAKE_LOG"
case " $* " in *" --block "*) exec sleep 300;; esac
""",
    # verl's interpreter: the script's Ray probe (-c) gets the GPUs the fake nodes announced; the rest is verl
    "python": """if [ "$1" = -c ]; then
    grep '^ray start' "$FAKE_LOG" | sed -n 's/.*--num-gpus=\\([0-9]*\\).*/\\1/p' | awk '{s += $1} END {print s + 0}'
    exit 0
fi
echo "trainer" >> "$FAKE_LOG"
exec "$REAL_PYTHON" "$FAKE_VERL" "$@"
""",
}


@pytest.fixture
def fake_slurm(tmp_path, launched):
    """A 3-node x 2-GPU job's sbatch script, written by a dry run, and a fake SLURM (srun, scontrol), Ray and
    verl interpreter on PATH; ``run(**env)`` runs the script as SLURM would on the first node."""
    make, out = launched
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name, body in FAKE_SLURM.items():
        (stubs / name).write_text("#!/usr/bin/env bash\n" + body)
        (stubs / name).chmod(0o755)
    (tmp_path / "fake_verl.py").write_text(FAKE_VERL.format(python=sys.executable))
    cfg = make(f"backend.python={stubs / 'python'}", "backend.launch=slurm", "backend.dry_run=true",
               "backend.nnodes=3", "backend.gpus_per_node=2", "backend.rollout_tp=2",
               "backend.slurm.partition=gpu", "backend.slurm.setup=['echo site-setup >> $FAKE_LOG']")
    from dapo_exp.train import train

    assert train(cfg)["sbatch"] == str(out / "verl_job.sbatch")
    log = tmp_path / "slurm.log"
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "FAKE_LOG": str(log), "REAL_PYTHON": sys.executable,
           "FAKE_VERL": str(tmp_path / "fake_verl.py"), "FAKE_NODES": "gpu01 gpu02 gpu03", "SLURM_JOB_ID": "4242",
           "SLURM_JOB_NODELIST": "gpu[01-03]", "DAPO_RAY_POLL_S": "0.05"}

    def run(wait: bool = True, **extra: str):
        proc = subprocess.Popen(["bash", str(out / "verl_job.sbatch")], env={**env, **extra},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if wait:
            proc.wait(timeout=120)
        return proc

    return run, out, log


def _ray_pids_gone(log: Path) -> bool:
    pids = [int(line.rsplit("pid=", 1)[1]) for line in log.read_text().splitlines() if line.startswith("ray start")]
    for _ in range(50):
        alive = [p for p in pids if _alive(p)]
        if not alive:
            return True
        time.sleep(0.1)
    return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_sbatch_script_is_bash_and_asks_slurm_for_the_layout(fake_slurm):
    _, out, _ = fake_slurm
    script = (out / "verl_job.sbatch").read_text()
    assert subprocess.run(["bash", "-n", str(out / "verl_job.sbatch")]).returncode == 0
    sbatch = [line.split(" ", 1)[1] for line in script.splitlines() if line.startswith("#SBATCH ")]
    for option in ("--nodes=3", "--ntasks-per-node=1", "--gpus-per-node=2", "--requeue", "--signal=B:USR1@300",
                   "--partition=gpu", "--time=24:00:00", "--exclusive", f"--chdir={out}"):
        assert option in sbatch, option
    assert not any(o.startswith(("--account", "--qos", "--mem")) for o in sbatch)  # null: not asked for
    record = json.loads((out / "config.json").read_text())
    assert record["verl"]["sbatch"] == str(out / "verl_job.sbatch")
    assert "trainer.nnodes=3" in record["verl"]["command"] and "trainer.resume_mode=auto" in record["verl"]["command"]


def test_the_sbatch_job_starts_ray_over_its_nodes_then_verl_and_brings_the_results_home(fake_slurm):
    run, out, log = fake_slurm
    proc = run()
    assert proc.returncode == 0, proc.stdout.read()
    calls = log.read_text().splitlines()
    starts = [c for c in calls if c.startswith("ray start")]
    assert calls[0] == "site-setup" and calls[1] == "scontrol show hostnames gpu[01-03]"
    assert starts[0].startswith("ray start --head --node-ip-address=10.1.2.3 --port=6379 --num-gpus=2 ")
    assert sorted(s.split(" pid=")[0] for s in starts[1:]) == ["ray start --address=10.1.2.3:6379 --num-gpus=2 --block"] * 2
    heads = [c for c in calls if c.startswith("srun") and "--head" in c]
    workers = [c.split()[3] for c in calls if c.startswith("srun") and "--address=" in c]
    assert heads[0].split()[3] == "--nodelist=gpu01" and sorted(workers) == ["--nodelist=gpu02", "--nodelist=gpu03"]
    assert calls.index("trainer") > max(calls.index(s) for s in starts)  # verl only once every GPU has joined
    call = json.loads((out / "fake_verl_call.json").read_text())
    record = json.loads((out / "config.json").read_text())
    assert call["argv"] == record["verl"]["command"][3:]  # the recorded command, verbatim
    assert {"trainer.nnodes=3", "trainer.n_gpus_per_node=2", "trainer.resume_mode=auto"} <= set(call["argv"])
    assert call["env"]["RAY_ADDRESS"] == "10.1.2.3:6379" and call["env"]["VERL_FILE_LOGGER_PATH"] == str(out / "verl_metrics.jsonl")
    summary = rundir.read_summary(out)
    assert summary["status"] == "finished" and summary["slurm_job_id"] == "4242" and summary["return_code"] == 0
    assert summary["final"]["eval/acc_avg"] == 0.75 and (out / rundir.METRICS).exists()
    assert _ray_pids_gone(log)  # the script stopped its Ray nodes


def test_the_sbatch_job_exits_with_verls_exit_code(fake_slurm):
    run, out, log = fake_slurm
    proc = run(FAKE_VERL_RC="3")
    assert proc.returncode == 3
    summary = rundir.read_summary(out)
    assert summary["status"] == "failed" and "verl exited with 3" in summary["error"]
    assert _ray_pids_gone(log)


def test_a_ray_head_that_dies_ends_the_job_at_once_naming_it(fake_slurm):
    """A head whose ``ray start`` fails (a port taken, a raylet that times out) ends the job within
    seconds, not after backend.slurm.ray_wait_s (600 s) or the time limit; verl never starts."""
    run, out, log = fake_slurm
    proc = run(FAKE_RAY_HEAD_RC="1")  # waits 120 s at most: a job that waited ray_wait_s (600 s) fails it
    assert proc.returncode == 1
    output = proc.stdout.read()
    assert "the Ray head exited (exit 1)" in output, output
    summary = rundir.read_summary(out)
    assert summary["status"] == "failed" and "the Ray head exited" in summary["error"]
    assert "trainer" not in log.read_text().splitlines()


def _usr1_while_verl_runs(run, out: Path, **env: str) -> int:
    """Start the job with a verl that runs until stopped, send SLURM's time-limit warning (USR1) once verl
    is up; the script's exit code."""
    proc = run(wait=False, FAKE_VERL_SLEEP="1", **env)
    for _ in range(600):
        if (out / "fake_verl_call.json").exists() or proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGUSR1)
    rc = proc.wait(timeout=60)
    assert rc == 143, proc.stdout.read()  # verl stopped by SIGTERM
    return rc


def test_usr1_before_the_time_limit_stops_verl_and_requeues_the_job(fake_slurm):
    run, out, log = fake_slurm
    _usr1_while_verl_runs(run, out, SLURM_RESTART_COUNT="2")
    assert "scontrol requeue 4242" in log.read_text().splitlines()
    summary = rundir.read_summary(out)
    assert summary["status"] == "stopped" and "SIGUSR1" in summary["error"] and summary["slurm_restarts"] == 2
    assert (out / rundir.METRICS).exists() and _ray_pids_gone(log)


def test_no_requeue_past_max_requeues(fake_slurm):
    run, out, log = fake_slurm
    _usr1_while_verl_runs(run, out, SLURM_RESTART_COUNT="20")
    assert not any(c.startswith("scontrol requeue") for c in log.read_text().splitlines())


def test_launch_slurm_submits_the_script_and_records_the_job_id(launched, tmp_path, monkeypatch):
    """sbatch --parsable <run>/verl_job.sbatch; the id in config.json and summary.json; while squeue still
    lists the job, a re-run submits nothing."""
    from dapo_exp.train import train

    make, out = launched
    stubs = tmp_path / "slurm-bin"
    stubs.mkdir()
    (stubs / "sbatch").write_text(f'#!/usr/bin/env bash\necho "$*" >> {tmp_path / "sbatch.log"}\necho "777;cluster"\n')
    (stubs / "squeue").write_text('#!/usr/bin/env bash\n[ "$3" = 777 ] && echo PENDING\nexit 0\n')
    for f in stubs.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{stubs}:{os.environ['PATH']}")
    summary = train(make("backend.launch=slurm"))
    assert summary["status"] == "submitted" and summary["slurm_job_id"] == "777"
    assert (tmp_path / "sbatch.log").read_text().split() == ["--parsable", str(out / "verl_job.sbatch")]
    assert json.loads((out / "config.json").read_text())["slurm"]["job_id"] == "777"
    assert rundir.read_summary(out)["status"] == "submitted"
    assert (out / "verl_data" / "train.parquet").exists()  # exported before submission, on the shared disk
    assert not (out / "fake_verl_call.json").exists()  # nothing ran here
    assert train(make("backend.launch=slurm"))["slurm_job_id"] == "777"
    assert len((tmp_path / "sbatch.log").read_text().splitlines()) == 1  # not submitted twice


@pytest.mark.slow
def test_the_paper_dry_run_prints_six_jobs_each_with_its_verl_command_and_sbatch_script(tmp_path):
    """The acceptance command: six jobs, one per row of Table 1, each with the exact verl command line
    (as config.json records it) and the sbatch script that runs it on 16 nodes x 8 GPUs."""
    jobs, stdout = paper_dry_run(tmp_path)
    assert sorted(j.record["label"] for j in jobs) == sorted(LADDER)
    assert "[analysis] backend.dry_run=true: nothing ran" in stdout  # no analysis of runs that did not run
    for j in jobs:
        assert j.command == j.record["verl"]["command"]
        assert j.command[1:3] == ["-m", "verl.trainer.main_ppo"]
        assert {"trainer.nnodes=16", "trainer.n_gpus_per_node=8", "trainer.resume_mode=auto",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=4"} <= set(j.command)
        assert "#SBATCH --nodes=16\n" in j.script and "#SBATCH --gpus-per-node=8\n" in j.script
        assert subprocess.run(["bash", "-n", str(j.out / "verl_job.sbatch")]).returncode == 0
        # the script runs exactly the printed command (its continued lines joined back)
        start = j.script.index(shlex.quote(j.command[0]) + " \\\n")
        text = j.script[start:].split(' >> "$RUN/verl.log"', 1)[0]
        assert shlex.split(text.replace("\\\n", " ")) == j.command
        assert not (j.out / "summary.json").exists()  # nothing launched, nothing submitted


def test_verls_truncated_share_is_the_share_cut_at_the_cap_not_at_its_batchs_padded_width():
    """verl's ``response_length/clip_ratio`` counts the responses as long as the batch's padded width: at a step
    whose longest response (19 tokens) is under the cap (32), 0.75 of SmolLM2's responses "clipped" in a real run
    (2026-11-28). Ours: 0 when no response reached the cap, verl's value (the share at the cap) when one did;
    verl's kept under its own name; without a cap (an old caller) verl's value as it was."""
    from dapo_exp.backends import verl as vb

    def step(n, longest, share):
        return {"step": n, "data": {"critic/score/mean": 0.0, "response_length/max": longest,
                                    "response_length/clip_ratio": share,
                                    "response_length_non_aborted/clip_ratio": share}}

    records = [step(1, 19.0, 0.75), step(2, 32.0, 0.25)]
    rows = vb.metric_rows(records, prompts_per_step=4, group_size=8, max_response_len=32)
    assert [r["response_length/clip_ratio"] for r in rows] == [0.0, 0.25]
    assert [r["response_length_non_aborted/clip_ratio"] for r in rows] == [0.0, 0.25]
    assert [r[vb.VERL_WIDTH_SHARE] for r in rows] == [0.75, 0.25]
    plain = vb.metric_rows(records, prompts_per_step=4, group_size=8)
    assert [r["response_length/clip_ratio"] for r in plain] == [0.75, 0.25]
