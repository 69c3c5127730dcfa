"""The config tree: every preset composes, the ladder adds one fix per step, bad configs fail early."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from dapo_exp import fixes, objective
from dapo_exp.config import Config, ConfigError, validate
from dapo_exp.fixes import switches as fix_switches
from dapo_exp.hydra_setup import register_resolvers, run_label

ROOT = Path(__file__).resolve().parents[1]
CONF = str(ROOT / "conf")
PRESETS = sorted(p.stem for p in (ROOT / "conf" / "fixes").glob("*.yaml"))
LADDER = list(fixes.LADDER)
register_resolvers()


def make_cfg(*overrides):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose("config", overrides=list(overrides))


def test_the_preset_files_are_the_registry_presets():
    assert set(PRESETS) == set(fixes.PRESETS)
    assert LADDER == [p for p in fixes.PRESETS if p.startswith("paper_")] and len(LADDER) == 6


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_composes_validates_and_is_labelled_by_its_name(preset):
    cfg = make_cfg(f"fixes={preset}")
    validate(cfg)
    assert cfg.preset == preset
    assert set(fix_switches(cfg.algo)) == set(fixes.FIXES)
    assert run_label(cfg) == preset


@pytest.mark.parametrize("fix", list(fixes.FIXES))
def test_each_fix_group_sets_only_the_keys_the_registry_names(fix):
    """Every option of a fix's config group changes only the algo keys its registry entry lists,
    and its non-default options turn the fix on; its first option (``disabled``, which a command line or a preset
    selects) is the defaults list's null: the same config."""
    f = fixes.FIXES[fix]
    base = make_cfg("fixes=grpo")
    assert not f.is_on(base.algo)
    assert _diff(base, make_cfg("fixes=grpo", f"{fix}={f.options[0]}")) == set(), (fix, f.options[0])
    for option in f.options[1:]:
        cur = make_cfg("fixes=grpo", f"{fix}={option}")
        assert _diff(base, cur) <= set(f.keys) | set(f.sets), (fix, option)
        assert f.is_on(cur.algo) and {k for k, v in fix_switches(cur.algo).items() if v} == {fix}


def test_defaults_live_once_schema_equals_default_composition():
    """conf/config.yaml sets no value of its own, and composing the default tree with every switch
    off gives exactly the schema's defaults: no key has two different defaults."""
    raw = OmegaConf.load(ROOT / "conf" / "config.yaml")
    assert set(raw.keys()) <= {"defaults", "hydra"}, f"config.yaml sets values: {set(raw.keys()) - {'defaults', 'hydra'}}"
    composed = OmegaConf.to_container(make_cfg("fixes=grpo"), resolve=True)
    schema = OmegaConf.to_container(OmegaConf.structured(Config), resolve=True)
    composed.pop("preset"), schema.pop("preset")

    def leaves(d, prefix=""):
        for k, v in d.items():
            yield from leaves(v, f"{prefix}{k}.") if isinstance(v, dict) and v else [(f"{prefix}{k}", v)]

    differ = {k: (v, dict(leaves(schema)).get(k)) for k, v in leaves(composed) if dict(leaves(schema)).get(k) != v}
    assert not differ, f"defaults given twice, differently (composed, schema): {differ}"


def test_grpo_baseline_has_none_of_the_fixes():
    a = make_cfg("fixes=grpo").algo
    assert a.eps_low == a.eps_high == 0.2
    assert a.loss_agg == "seq-mean-token-mean"
    assert not a.overlong_filtering and a.overlong_punishment == "none"
    assert not a.dynamic_sampling and a.kl_coef == 0.0


def test_full_is_the_released_recipe():
    a = make_cfg("fixes=full").algo
    assert (a.eps_low, a.eps_high) == (0.2, 0.28)
    assert a.loss_agg == "token-mean" and a.dynamic_sampling and a.overlong_punishment == "soft"
    assert not a.overlong_filtering  # the released script does not use it


def _diff(c1, c2):
    d1, d2 = OmegaConf.to_container(c1.algo), OmegaConf.to_container(c2.algo)
    return {k for k in d1 if d1[k] != d2[k]}


@pytest.mark.parametrize("i", range(1, len(LADDER)))
def test_each_ladder_step_adds_exactly_one_fix(i):
    prev, cur = make_cfg(f"fixes={LADDER[i - 1]}"), make_cfg(f"fixes={LADDER[i]}")
    s_prev, s_cur = fix_switches(prev.algo), fix_switches(cur.algo)
    changed = [k for k in s_cur if s_cur[k] != s_prev[k]]
    assert len(changed) == 1 and s_cur[changed[0]] and not s_prev[changed[0]]
    # and in the config values, only keys of that fix (as the registry lists them) changed
    assert _diff(prev, cur) and _diff(prev, cur) <= set(fixes.FIXES[changed[0]].keys) | set(fixes.FIXES[changed[0]].sets)


def test_the_ladder_ends_with_every_dapo_fix_on():
    last = fix_switches(make_cfg(f"fixes={LADDER[-1]}").algo)
    assert len(fixes.dapo_fixes()) == 5 and all(last[k] for k in fixes.dapo_fixes())
    assert not any(v for k, v in last.items() if k not in fixes.dapo_fixes())
    assert not any(fix_switches(make_cfg(f"fixes={LADDER[0]}").algo).values())


@pytest.mark.parametrize("loo,off", [("full_no_clip", "clip_higher"), ("full_no_ds", "dynamic_sampling"),
                                     ("full_no_tl", "token_level_loss"), ("full_no_sop", "overlong_punishment")])
def test_leave_one_out_differs_from_full_in_one_fix(loo, off):
    full, cur = fix_switches(make_cfg("fixes=full").algo), fix_switches(make_cfg(f"fixes={loo}").algo)
    assert {k for k in full if full[k] != cur[k]} == {off}


def test_command_line_switch_beats_the_preset_and_label_follows_values():
    cfg = make_cfg("fixes=full", "clip_higher=disabled")
    assert cfg.algo.eps_high == 0.2
    assert run_label(cfg) == "full_no_clip"
    cfg = make_cfg("fixes=grpo", "token_level_loss=enabled", "overlong_filtering=enabled")
    assert run_label(cfg) == "tl+of"
    cfg = make_cfg("fixes=full", "clip_higher=disabled", "dynamic_sampling=disabled", "token_level_loss=disabled",
                   "overlong_punishment=disabled")
    assert run_label(cfg) == "grpo"  # the first preset with that state, not paper_1_grpo


def test_a_run_label_composes_the_presets_only_up_to_the_first_match(monkeypatch):
    """A study's enabled arm (``fixes=grpo clip_higher=enabled``) is labelled ``clip``, the second preset: its own
    preset and the presets up to that one are composed, not all of them (each a composition of the whole config)."""
    import dapo_exp.hydra_setup as hs

    composed = []
    real = hs.compose_config
    monkeypatch.setattr(hs, "compose_config", lambda overrides: composed.append(overrides) or real(overrides))
    hs.preset_algo.cache_clear()
    try:
        assert run_label(make_cfg("fixes=grpo", "clip_higher=enabled")) == "clip"
        assert composed == [["fixes=grpo"], ["fixes=clip"]]
        composed.clear()
        assert run_label(make_cfg("fixes=grpo", "token_level_loss=enabled", "overlong_filtering=enabled")) == "tl+of"
        assert len(composed) == len(fixes.PRESETS) - 2  # no preset has that state: every other one is read
    finally:
        hs.preset_algo.cache_clear()


def test_full_factorial_is_one_multirun_command():
    out = subprocess.run(
        [sys.executable, "run.py", "-m", "--cfg", "job", "clip_higher=disabled,enabled",
         "dynamic_sampling=disabled,enabled", "token_level_loss=disabled,enabled",
         "overlong_punishment=disabled,soft", "overlong_filtering=disabled,enabled", "seed=0"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "[dry run] 32 jobs" in out.stdout


def test_cfg_job_prints_every_preset_and_the_user_sweep_lists_four_jobs():
    out = subprocess.run([sys.executable, "run.py", "-m", "--cfg", "job", "fixes=grpo,clip,clip_ds,full"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # no seed= given: the sweeper's default seeds (five) for each preset, as a real sweep runs them
    assert "[dry run] 20 jobs" in out.stdout
    for i, p in enumerate(["grpo", "clip", "clip_ds", "full"]):
        assert f"#{i} : seed=0 fixes={p}" in out.stdout and f"preset: {p}" in out.stdout
    assert "#19 : seed=4 fixes=full" in out.stdout
    single = subprocess.run([sys.executable, "run.py", "--cfg", "job", "fixes=paper_4_sop"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert single.returncode == 0 and "preset: paper_4_sop" in single.stdout


@pytest.mark.parametrize("override,key,choice", [
    ("algo.loss_agg=token_mean", "algo.loss_agg", objective.LOSS_AGG_MODES[0]),
    ("task.name=aime", "task.name", "dapo_math"),
    ("rollout.engine=sglang", "rollout.engine", "vllm"),
    ("task.verifier=exact", "task.verifier", "math_verify"),
])
def test_preflight_checks_names_against_their_owners(override, key, choice):
    from dapo_exp.train import preflight

    with pytest.raises(ConfigError, match=rf"{key}=.*choose one of: .*{choice}"):
        preflight(make_cfg(override))


def test_an_ext_key_no_fix_declares_is_refused():
    from dapo_exp.train import preflight

    with pytest.raises(ConfigError, match="algo.ext.bonuss is read by no registered fix"):
        preflight(make_cfg("+algo.ext.bonuss=1"))


# --------------------------------------------------------------------------- #
# bad configs                                                                   #
# --------------------------------------------------------------------------- #
def test_misspelt_key_fails_at_compose_time():
    with pytest.raises(Exception) as e:
        make_cfg("algo.eps_hihg=0.3")
    assert "eps_hihg" in str(e.value)


def test_wrong_type_fails_at_compose_time():
    with pytest.raises(Exception) as e:
        make_cfg("algo.eps_high=abc")
    assert "eps_high" in str(e.value)


def test_unknown_preset_fails_listing_choices():
    with pytest.raises(Exception) as e:
        make_cfg("fixes=dapo")
    assert "full" in str(e.value) and "grpo" in str(e.value)


@pytest.mark.parametrize(
    "overrides,field",
    [
        (["algo.eps_low=-0.1"], "algo.eps_low"),
        (["algo.eps_high=-0.01"], "algo.eps_high"),
        (["algo.overlong_cache_len=100"], "algo.overlong_cache_len"),
        (["fixes=full", "rollout.n=1", "train.mini_batch_size=16", "train.micro_batch_size=16"], "rollout.n"),
        (["train.mini_batch_size=48"], "train.mini_batch_size"),
        (["train.mini_batch_size=36", "train.prompts_per_step=9", "rollout.n=4"], "train.mini_batch_size"),
        (["train.micro_batch_size=24"], "train.micro_batch_size"),
        (["algo.loss_agg=token_mean"], "algo.loss_agg"),
        (["algo.ds_signal=score"], "algo.ds_signal"),
        (["algo.dual_clip=0.5"], "algo.dual_clip"),
        (["rollout.top_p=0"], "rollout.top_p"),
        (["algo.kl_estimator=k9"], "algo.kl_estimator"),
    ],
)
def test_bad_values_raise_naming_the_field(overrides, field):
    from dapo_exp.train import preflight

    cfg = make_cfg(*overrides)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        preflight(cfg)


@pytest.mark.parametrize(
    "overrides,named",
    [
        (["task.train_source=my_train.parquet"], r"task\.train_source='my_train\.parquet' is not read by task=arith"),
        (["task.eval_source=aime24"], r"task\.eval_source='aime24' is not read by task=arith"),
        (["task=chat_arith", "model=smollm2_135m", "task.arith_max_operand=50"],
         r"task\.arith_max_operand=50 is not read by task=chat_arith with model\.path=smollm2-135m-instruct"),
        (["task.level=mul"], r"task\.level='mul' is not read by task=arith"),
        (["task.few_shot=5"], r"task\.few_shot=5 is not read by task=arith"),
        (["task=gsm8k", "model=qwen2.5-0.5b", "task.arith_n_train=10"],
         r"task\.arith_n_train=10 is not read by task=gsm8k with model\.path=Qwen/Qwen2\.5-0\.5B"),
        (["model=smollm2_135m", "task=chat_arith", "model.hidden_size=64"],
         r"model\.hidden_size=64 is not read by model\.path=smollm2-135m-instruct"),
        (["model=smollm2_135m", "task=chat_arith", "model.warmstart_steps=10"], r"model\.warmstart_steps=10"),
    ],
)
def test_a_key_the_chosen_task_or_model_does_not_read_is_refused_naming_its_readers(overrides, named):
    """A value that nothing in the run reads (a data file for the generated toy, the toy's operand range for
    GSM8K, the tiny model's width for a hub model) would be silently ignored: the run trains on something else
    than the user asked for. Refused before compute, naming the key, the choice that does not read it and the
    ones that do."""
    from dapo_exp.train import preflight

    cfg = make_cfg(*overrides)
    with pytest.raises(ConfigError, match=named) as e:
        preflight(cfg)
    assert "read by" in str(e.value).split("is not read by", 1)[1]  # ... and who does read it


@pytest.mark.parametrize(
    "overrides",
    [
        ["task=chat_arith", "task.level=mul", "task.few_shot=1", "task.arith_n_train=100"],
        ["task.arith_max_operand=20", "task.arith_ops=+-"],
        ["task=gsm8k", "task.arith_max_operand=20"],  # the tiny model's warm start reads the arithmetic keys
        ["model.hidden_size=64", "model.num_heads=2", "model.warmstart_steps=10"],
        ["model=smollm2_135m", "task=chat_arith", "model.cache_dir=/tmp/elsewhere"],  # a place, set site-wide
        ["experiment=smollm2_add2"],
    ],
)
def test_the_keys_a_choice_reads_are_accepted_with_it(overrides):
    from dapo_exp.config import check_keys_read

    check_keys_read(make_cfg(*overrides))  # raises ConfigError where a key is not read


def test_bad_config_fails_before_any_compute(tmp_path, monkeypatch):
    """train() validates first: no model is built, no file but nothing is written."""
    import dapo_exp.build as build_mod

    def boom(*a, **k):
        raise AssertionError("model built before the config was checked")

    monkeypatch.setattr(build_mod, "policy_path", boom)
    from dapo_exp.train import train

    cfg = make_cfg("algo.eps_low=-1", f"out_dir={tmp_path}", "logger=none")
    with pytest.raises(ConfigError, match="algo.eps_low"):
        train(cfg)
    assert not any(tmp_path.iterdir())


# --------------------------------------------------------------------------- #
# What the command line shows: --help, "did you mean", where a run wrote       #
# --------------------------------------------------------------------------- #
def _run_py(*args, cwd=ROOT, timeout=120):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "run.py", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_help_is_the_projects_own_not_hydras_config_dump():
    out = _run_py("--help")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for what in ("bash .ci/install && bin/python run.py", "bash .ci/test",  # the two commands
                 "python run.py -m fixes=grpo,clip,clip_ds,full",  # the ablation
                 "python -m dapo_exp.analysis <sweep dir>", "python -m dapo_exp.analysis plan",
                 "python -m dapo_exp.analysis design", "python -m dapo_exp.analysis study",  # the analysis
                 "docs/", "mkdocs serve",  # the docs
                 "python run.py --cfg job"):
        assert what in text, what
    # the config groups with their options, filled in by Hydra
    for group in ("fixes: ", "task: ", "model: ", "experiment: ", "rollout: "):
        assert any(line.startswith(group) for line in text.splitlines()), group
    assert "full_no_clip" in text and "gsm8k" in text
    # not Hydra's stock text, nor the config dump
    assert "powered by Hydra" not in text and "== Config ==" not in text
    assert "eps_high:" not in text and "adv_eps" not in text
    assert len(text.splitlines()) < 80  # Hydra lists one line per config group: 37 of them, 29 switches
    groups = {ln for ln in text.splitlines() if ln.split(":")[0].replace("_", "").isalpha() and ": " in ln}
    assert max(len(ln) for ln in text.splitlines() if ln not in groups) <= 120  # Hydra's group lists: one line each


@pytest.mark.parametrize("word,meant", [
    ("train.lr", "optim.lr"),  # right name, wrong section: the full key, not the section `train`
    ("optim.lrr", "optim.lr"),
    ("train.stepz", "train.steps"),
    ("algo.eps_hi", "algo.eps_high"),
    ("lr", "optim.lr"),
    ("fixe", "fixes"),
    # a word read as the schema's word for the same thing, before a closer spelling of another key
    ("algo.clip_hgih", "algo.eps_high"),  # not algo.cispo_eps_high
    ("algo.clip_low", "algo.eps_low"),
    ("algo.epsilon_high", "algo.eps_high"),
    ("optim.learning_rate", "optim.lr"),
    ("rollout.group_size", "rollout.n"),
    ("rollout.temp", "rollout.temperature"),  # not train.steps ("temp" is a synonym, not a misspelt "step")
    ("algo.clip_cov_ratoi", "algo.clip_cov_ratio"),  # a key of its own is still found by its spelling
])
def test_closest_key_names_the_full_key(word, meant):
    from dapo_exp.cli_errors import closest_key, config_groups, schema_keys

    assert closest_key(word, schema_keys() + config_groups(CONF)) == meant


def test_closest_key_never_suggests_the_parent_section_and_may_suggest_nothing():
    from dapo_exp.cli_errors import closest_key, schema_keys

    keys = schema_keys()
    assert "train" in keys and closest_key("train.lr", keys) != "train"
    assert closest_key("zzzz.qqqq", keys) is None


def test_a_misspelt_key_is_refused_before_torch_is_imported():
    """The config is composed and checked before run.py imports the trainer (preflight.precheck): torch
    and transformers are never imported (Python's import log), so the refusal does not wait for them."""
    out = subprocess.run([sys.executable, "-X", "importtime", "run.py", "algo.clip_hgih=0.3"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [ln for ln in out.stderr.splitlines() if not ln.startswith("import time:")]
    assert errors == ["error: algo.clip_hgih is not a config key or group; did you mean algo.eps_high? "
                      "(`python run.py --cfg job` prints every key)"], errors
    imported = {ln.rsplit("|", 1)[1].strip() for ln in out.stderr.splitlines() if ln.startswith("import time:")}
    assert "hydra" in imported and not {"torch", "transformers", "dapo_exp.train"} & imported


def test_an_override_the_shell_unquoted_is_named_with_the_quoting_it_needs():
    out = subprocess.run([sys.executable, "run.py", "-m", "fixes=grpo,clip", "seed=range(0,10)",
                          "sweep=fixes=grpo,clip"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [
        "error: cannot parse the override sweep=fixes=grpo,clip: mismatched input '=' expecting <EOF>; a value "
        "holding '=' must reach Hydra quoted, so quote it twice on the command line: \"sweep='fixes=grpo,clip'\" "
        "(the override grammar: https://hydra.cc/docs/advanced/override_grammar/basic/)"]


@pytest.mark.parametrize("override", ["train.lr=-1", "+train.lr=-1"])
def test_a_key_in_the_wrong_section_suggests_where_it_lives(tmp_path, override):
    out = _run_py(override, "logger=none", f"hydra.run.dir={tmp_path / 'job'}")
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2, out.stderr
    assert len(lines) == 1 and lines[0].startswith("error: train.lr is not a config key"), out.stderr
    assert "did you mean optim.lr?" in lines[0] and "did you mean train?" not in lines[0]


@pytest.mark.slow
def test_a_single_run_prints_its_output_directory_last(tmp_path, warm_cache):
    from helpers import SMALL

    run_dir = tmp_path / "outputs" / "one_run"
    out = _run_py(*SMALL, f"model.cache_dir={warm_cache}", f"hydra.run.dir={run_dir}", timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    last = out.stdout.strip().splitlines()[-1]
    assert last.strip() == f"written to {run_dir}", out.stdout[-2000:]
    assert (run_dir / "summary.json").is_file() and (run_dir / "metrics.jsonl").is_file()
