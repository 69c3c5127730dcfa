"""A sweep's jobs and their directory names without Hydra's internals: :func:`dapo_exp.hydra_setup.expand_sweep`
and :func:`~dapo_exp.hydra_setup.overrides_dirname` (Hydra's public override API) give what Hydra's basic
sweeper (``BasicSweeper.split_arguments``) and its config loader (``get_overrides_dirname``) give, case by case.
The preflight, the dry run, the analysis and the sequential sweeper list the jobs a launched sweep runs, and
where each writes, with them; here, and only here, Hydra's internal functions are the reference."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra._internal.config_loader_impl import get_overrides_dirname
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from dapo_exp.hydra_setup import expand_sweep, overrides_dirname, sweep_jobs

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def _parsed(overrides: list[str], config_loader=None):
    return OverridesParser.create(config_loader=config_loader).parse_overrides(overrides)


SWEEPS = {
    "none": [],
    "plain": ["train.steps=4", "logger=none"],
    "comma sweeps": ["fixes=grpo,clip,clip_ds", "seed=0,1"],
    "range": ["seed=range(3)", "train.steps=range(2,10,4)"],
    "choice": ["fixes=choice(grpo,full)", "seed=choice(0,1)"],
    "sorted and cast sweeps": ["seed=sort(3,1,2)", "train.lr=float(1),2"],
    "+key and ~key": ["+notes.copy=ref,term", "~hydra.callbacks.analysis", "~logger=wandb", "+x=1"],
    "quoted values": ["notes.a='x,y'", 'notes.b="a b"', "notes.c='a b',\"q\"", r"notes.d=a\,b"],
    "lists and dicts": ["notes.l=[1,2]", "notes.d={a:1,b:[2,3]}", "notes.s=[1,2],[3]"],
    "groups, packages, Hydra's": ["fixes=grpo,clip", "hydra/launcher=slurm", "model@notes.m=tiny",
                                  "hydra.launcher.partition=gpu", "hydra.sweep.dir=multirun/x"],
    "a key twice (the last value, the first place)": ["seed=0,1,2", "fixes=grpo,clip", "seed=7,8"],
    "a sweep then a value": ["seed=0,1", "seed=3"],
    "+a and a are two keys": ["+a=1,2", "a=3"],
    "interpolations and escapes": ["notes.x=${seed}", r"backend.slurm.time=00\:30\:00,01\:00\:00"],
}


@pytest.mark.parametrize("overrides", SWEEPS.values(), ids=SWEEPS.keys())
def test_expand_sweep_is_the_basic_sweepers_expansion(overrides):
    assert expand_sweep(_parsed(overrides)) == BasicSweeper.split_arguments(_parsed(overrides), None)[0]


def test_expand_sweep_by_hand():
    """The order the jobs run in: the first override varies slowest; a repeated key keeps its first place."""
    assert expand_sweep(_parsed(["a=1,2", "b=x,y", "c=z"])) == [
        ["a=1", "b=x", "c=z"], ["a=1", "b=y", "c=z"], ["a=2", "b=x", "c=z"], ["a=2", "b=y", "c=z"]]
    assert expand_sweep(_parsed(["seed=0,1", "fixes=grpo", "seed=5"])) == [["seed=5", "fixes=grpo"]]
    assert expand_sweep(_parsed([])) == [[]]
    assert sweep_jobs(["fixes=grpo,clip", "seed=4"], {"seed": "0,1,2"}) == [["seed=4", "fixes=grpo"],
                                                                           ["seed=4", "fixes=clip"]]


def test_glob_expands_against_the_config_tree_as_the_basic_sweeper_does():
    """``glob(...)`` lists a config group's options: it needs the parser's config loader (the sequential
    sweeper passes its own)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        clip = expand_sweep(_parsed(["fixes=glob(clip*)", "seed=0"], loader))
        assert ["fixes=clip", "seed=0"] in clip and all(job[0].startswith("fixes=clip") for job in clip)
        rest = expand_sweep(_parsed(["fixes=glob(*,exclude=[full*,paper*])"], loader))
        assert ["fixes=grpo"] in rest and not [job for job in rest if job[0].startswith(("fixes=full", "fixes=paper"))]
        for overrides in (["fixes=glob(clip*)", "seed=0"], ["fixes=glob(*,exclude=[full*,paper*])"]):
            assert expand_sweep(_parsed(overrides, loader)) == \
                BasicSweeper.split_arguments(_parsed(overrides, loader), None)[0]


def test_an_interval_sweep_is_refused_as_the_basic_sweeper_refuses_it():
    with pytest.raises(HydraException) as theirs:
        BasicSweeper.split_arguments(_parsed(["train.lr=interval(0,1)"]), None)
    with pytest.raises(HydraException) as ours:
        expand_sweep(_parsed(["train.lr=interval(0,1)"]))
    assert str(ours.value) == str(theirs.value)


DIRNAMES = {
    "plain, sorted": (["seed=0", "fixes=clip", "train.steps=4"], [], ",", "="),
    "excluded keys": (["fixes=clip", "seed=0", "sweep=x", "logger=none"], ["seed", "sweep", "logger"], ",", "="),
    "+key and ~key, excluded without their sign": (["+notes.copy=ref", "~logger", "+seed=3"], ["seed"], ",", "="),
    "groups and packages": (["hydra/launcher=slurm", "model@notes.m=tiny", "fixes=grpo"], ["hydra/launcher"],
                            ",", "="),
    "quoted values with = and the separators": (["notes.a='x=y'", "notes.b=[1,2]", 'notes.c="a,b"'], [], ",", "="),
    "other separators": (["seed=0", "fixes=clip", "notes.a='k=v'"], [], "/", ":"),
    "longer separators": (["seed=0", "fixes=clip"], ["nothing"], " + ", " is "),
    "escapes kept": ([r"backend.slurm.time=00\:30\:00", "fixes=grpo"], [], ",", "="),
    "everything excluded": (["seed=0"], ["seed"], ",", "="),
}


@pytest.mark.parametrize("overrides, exclude, item_sep, kv_sep", DIRNAMES.values(), ids=DIRNAMES.keys())
def test_overrides_dirname_is_hydras(overrides, exclude, item_sep, kv_sep):
    ours = overrides_dirname(_parsed(overrides), exclude, item_sep, kv_sep)
    assert ours == get_overrides_dirname(_parsed(overrides), exclude, item_sep, kv_sep)


def test_overrides_dirname_by_hand():
    assert overrides_dirname(_parsed(["seed=0", "fixes=clip", "sweep=s"]), ["sweep"]) == "fixes=clip,seed=0"
    assert overrides_dirname(_parsed(["seed=0", "+b=1"]), (), "/", ":") == "+b:1/seed:0"
