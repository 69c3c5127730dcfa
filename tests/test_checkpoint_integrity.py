"""Verified or refused (issue 24): a checkpoint or a warm-start cache is used only when its manifest
vouches for every byte; weights that are not finite are neither saved nor loaded; dynamic
sampling's cap error says when the policy has collapsed."""

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_model
from test_reliability import _flip_one_bit, save_steps, tiny_training_objects, trainer_state

from dapo_exp import checkpoint
from dapo_exp.checkpoint import CheckpointError
from dapo_exp.rollout.dynamic_sampling import DynamicSamplingCapError, collect_groups
from dapo_exp.rollout.groups import Group


def _rewrite_manifest(ckpt: Path) -> None:
    """What a writer without the finiteness check would have written: a manifest matching the files."""
    files = checkpoint.manifest_files(ckpt, (checkpoint.WEIGHTS, checkpoint.STATE))
    (ckpt / checkpoint.MANIFEST).write_text(json.dumps({"format": checkpoint.FORMAT, "files": files}))


def _skips(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]


# --------------------------------------------------------------------------- #
# a checkpoint's manifest is required                                            #
# --------------------------------------------------------------------------- #
def test_manifest_deleted_and_one_bit_flipped_in_the_weights_is_skipped_naming_the_file(tmp_path, caplog):
    root = tmp_path / "checkpoints"
    save_steps(root, 1, 2)
    newest = root / "step_0000002"
    (newest / checkpoint.MANIFEST).unlink()
    _flip_one_bit(newest / checkpoint.WEIGHTS)
    checkpoint._verify_readable(newest)  # control: the flipped file still reads, its values finite

    assert checkpoint.latest(root) == root / "step_0000001"
    (msg,) = _skips(caplog)
    assert str(newest / checkpoint.WEIGHTS) in msg and str(newest / checkpoint.MANIFEST) in msg
    assert "missing" in msg
    model, opt, sched = tiny_training_objects(seed=1)
    assert checkpoint.load(checkpoint.latest(root), model, opt, sched) == (1, trainer_state(1))


def test_an_intact_checkpoint_without_its_manifest_is_not_trusted(tmp_path, caplog):
    root = tmp_path / "checkpoints"
    save_steps(root, 1, 2)
    (root / "step_0000002" / checkpoint.MANIFEST).unlink()
    assert checkpoint.latest(root) == root / "step_0000001"
    assert len(_skips(caplog)) == 1
    (root / "step_0000001" / checkpoint.MANIFEST).unlink()
    with pytest.raises(CheckpointError, match="no usable checkpoint"):  # never a silent restart
        checkpoint.latest(root)


@pytest.mark.parametrize("damage", ["lists no weights", "not JSON"])
def test_a_manifest_that_does_not_vouch_for_the_weights_is_refused(tmp_path, damage):
    root = tmp_path / "checkpoints"
    save_steps(root, 1, 2)
    manifest = root / "step_0000002" / checkpoint.MANIFEST
    if damage == "not JSON":
        manifest.write_text("{")
    else:
        m = json.loads(manifest.read_text())
        del m["files"][checkpoint.WEIGHTS]
        manifest.write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match=str(manifest)):
        checkpoint.verify(manifest.parent)
    assert checkpoint.latest(root) == root / "step_0000001"


# --------------------------------------------------------------------------- #
# weights that are not finite                                                    #
# --------------------------------------------------------------------------- #
def test_save_refuses_weights_that_are_not_finite_and_keeps_the_last_good_checkpoint(tmp_path):
    save_steps(tmp_path, 1)
    model, opt, sched = tiny_training_objects()
    with torch.no_grad():
        model[1].bias[0] = float("nan")
    with pytest.raises(CheckpointError, match=r"refusing to write checkpoint .*step_0000002.*1\.bias has 1 nan"):
        checkpoint.save(tmp_path, 2, model, opt, sched, trainer_state(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_0000001"]  # nothing written, no temp dir
    assert checkpoint.latest(tmp_path) == tmp_path / "step_0000001"


def test_a_verified_checkpoint_of_nan_weights_is_skipped_on_load(tmp_path, caplog):
    """A checkpoint of a diverged run written before the check (its manifest matches its files)."""
    root = tmp_path / "checkpoints"
    save_steps(root, 1, 2)
    newest = root / "step_0000002"
    model, _, _ = tiny_training_objects()
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    save_model(model, str(newest / checkpoint.WEIGHTS))
    _rewrite_manifest(newest)

    assert checkpoint.latest(root) == root / "step_0000001"
    (msg,) = _skips(caplog)
    assert str(newest / checkpoint.WEIGHTS) in msg and "not finite" in msg and "nan" in msg


def test_first_nonfinite_names_the_tensor_and_counts():
    ok = {"a": torch.zeros(3), "n": torch.tensor([1, 2])}
    assert checkpoint.first_nonfinite(ok.items()) is None
    bad = {**ok, "b": torch.tensor([1.0, float("inf"), float("nan"), float("nan")])}
    assert checkpoint.first_nonfinite(bad.items()) == "b has 2 nan and 1 inf of 4 values"


# --------------------------------------------------------------------------- #
# the warm-start cache of the tiny model                                         #
# --------------------------------------------------------------------------- #
def _warm_cfg(cache: Path):
    from dapo_exp.hydra_setup import compose_config

    return compose_config(["model.warmstart_steps=3", f"model.cache_dir={cache}"])


def _ensure(cfg) -> Path:
    from dapo_exp.tasks.arith_warmstart import ensure_tiny_checkpoint

    return Path(ensure_tiny_checkpoint(cfg.model, cfg.task, cfg.rollout.max_response_len))


def _cache_files(path: Path) -> dict[str, bytes]:
    """The cached model's files (not the build's timing in warmstart.json, nor the manifest of it)."""
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.name not in ("warmstart.json", "manifest.json")}


DAMAGE = {
    "weights truncated": lambda d: (d / "model.safetensors").write_bytes(
        (d / "model.safetensors").read_bytes()[:1000]),
    "one bit flipped in the weights": lambda d: _flip_one_bit(d / "model.safetensors"),
    "manifest missing (killed after the rename, or built before manifests)": lambda d: (d / "manifest.json").unlink(),
    "config.json missing": lambda d: (d / "config.json").unlink(),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_warm_start_cache_is_rebuilt_saying_so_in_one_line(tmp_path, capsys, damage):
    from dapo_exp.models import load_policy

    cfg = _warm_cfg(tmp_path)
    path = _ensure(cfg)
    assert "building the warm-started tiny model" in capsys.readouterr().out
    good = _cache_files(path)
    manifest = json.loads((path / "manifest.json").read_text())
    assert {"config.json", "model.safetensors"} <= set(manifest["files"])

    assert _ensure(cfg) == path and capsys.readouterr().out == ""  # a verified cache: used as it is

    DAMAGE[damage](path)
    assert _ensure(cfg) == path
    out = [x for x in capsys.readouterr().out.strip().splitlines() if "] warm start " not in x]  # not its progress
    assert len(out) == 1 and out[0].startswith("[dapo-exp] rebuilding the warm-started tiny model"), out
    if damage != "config.json missing" and "manifest" not in damage:
        assert str(path / "model.safetensors") in out[0]
    assert _cache_files(path) == good  # the same (deterministic) model again, verified
    load_policy(str(path), "float32", "cpu", False)


def test_a_killed_warm_start_build_leaves_nothing_that_is_trusted(tmp_path, monkeypatch, capsys):
    import dapo_exp.tasks.arith_warmstart as W

    cfg = _warm_cfg(tmp_path)
    real_write_json = W.rundir.write_json

    def killed(*a, **k):  # after the rename, before the manifest
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(W.rundir, "write_json", killed)
    with pytest.raises(KeyboardInterrupt):
        _ensure(cfg)
    (target,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert W.cache_problem(target) and "manifest.json: missing" in W.cache_problem(target)

    monkeypatch.setattr(W.rundir, "write_json", real_write_json)
    monkeypatch.setattr(W, "fsync_path", killed)  # the files saved in the temp dir, before the rename
    capsys.readouterr()
    with pytest.raises(KeyboardInterrupt):
        _ensure(cfg)
    assert "rebuilding the warm-started tiny model" in capsys.readouterr().out
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]
    monkeypatch.undo()
    assert _ensure(cfg) == target and W.cache_problem(target) is None


def test_the_default_toy_starts_from_the_shipped_warm_start():
    """Every machine's default run starts from the same base weights: the package ships the default
    toy's warm start (a local build differs from machine to machine, and its results with it)."""
    import dapo_exp.tasks.arith_warmstart as W
    from dapo_exp.hydra_setup import compose_config

    path = _ensure(compose_config([]))
    assert path.parent == W.SHIPPED_DIR, (
        "the default warm-start settings no longer match the shipped warm start: run "
        "python -m dapo_exp.tasks.arith_warmstart --ship and commit dapo_exp/assets/warmstart/")
    assert W.cache_problem(path) is None
    assert W.weights_sha256(path) == hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_a_shipped_warm_start_is_used_verified_and_built_instead_when_damaged(tmp_path, monkeypatch, capsys):
    import dapo_exp.tasks.arith_warmstart as W

    cfg = _warm_cfg(tmp_path / "cache")
    built = _ensure(cfg)
    shipped = tmp_path / "shipped" / built.name
    shutil.copytree(built, shipped)
    monkeypatch.setattr(W, "SHIPPED_DIR", shipped.parent)
    monkeypatch.setitem(W.SHIPPED_SHA256, shipped.name, W.weights_sha256(built))  # as the code holds the real one's
    capsys.readouterr()
    assert _ensure(cfg) == shipped and capsys.readouterr().out == ""  # shipped and verified: used
    cfg.model.warmstart_source = "build"
    assert _ensure(cfg) == built  # build: the local one, whatever is shipped
    cfg.model.warmstart_source = "shipped"
    _flip_one_bit(shipped / "model.safetensors")
    assert _ensure(cfg) == built
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "the shipped warm start" in out[0] and "is damaged" in out[0], out


def test_every_shipped_warm_start_is_vouched_for_by_the_code():
    import dapo_exp.tasks.arith_warmstart as W

    shipped = sorted(p for p in W.SHIPPED_DIR.iterdir() if p.is_dir())
    assert shipped and {p.name for p in shipped} == set(W.SHIPPED_SHA256), (
        "a warm start was shipped (python -m dapo_exp.tasks.arith_warmstart --ship) without its weights' SHA-256 in "
        "arith_warmstart.SHIPPED_SHA256")
    for p in shipped:
        assert W.weights_sha256(p) == W.SHIPPED_SHA256[p.name] and W.cache_problem(p) is None


def test_every_file_a_shipped_warm_start_loads_is_held_by_the_code():
    """Issue 48: the code held the weights' hash only, so a tokenizer edited and re-hashed into its manifest was
    used. Every file the loading reads (config, tokenizer) is held too, computed here from the committed assets."""
    import dapo_exp.tasks.arith_warmstart as W

    for p in sorted(p for p in W.SHIPPED_DIR.iterdir() if p.is_dir()):
        loaded = W.base_identity(p)["files"]  # every file the loading reads, hashed from its bytes
        assert {"tokenizer.json", "tokenizer_config.json", "config.json"} <= set(loaded), p.name
        assert loaded == W.shipped_files_sha256(p.name), p.name


def _shipped_copy(tmp_path, monkeypatch):
    from helpers import shipped_default_model

    import dapo_exp.tasks.arith_warmstart as W

    real = shipped_default_model()
    copy = tmp_path / "shipped" / real.name
    shutil.copytree(real, copy)
    monkeypatch.setattr(W, "SHIPPED_DIR", copy.parent)
    return W, copy, real.name.removeprefix("tiny-")


def _rehash(directory: Path, names=None) -> None:
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["files"] = checkpoint.manifest_files(directory, names or sorted(manifest["files"]))
    (directory / "manifest.json").write_text(json.dumps(manifest))


def test_a_shipped_warm_start_whose_manifest_skips_the_tokenizer_or_was_rehashed_is_not_used(tmp_path, monkeypatch,
                                                                                             capsys):
    """Issue 34: a manifest that did not list tokenizer.json let two swapped digit tokens train silently under the
    genuine base hash; a manifest re-hashed after the weights changed vouched for them."""
    W, copy, key = _shipped_copy(tmp_path, monkeypatch)
    assert W.shipped_checkpoint(key) == copy
    names = sorted(json.loads((copy / "manifest.json").read_text())["files"])
    _rehash(copy, [n for n in names if n != "tokenizer.json"])
    assert W.shipped_checkpoint(key) is None
    assert "does not list tokenizer.json" in capsys.readouterr().out

    _flip_one_bit(copy / "model.safetensors")
    _rehash(copy, names)  # the manifest agrees with the changed weights: only the code's hash can tell
    assert W.cache_problem(copy) is None and W.shipped_checkpoint(key) is None
    out = capsys.readouterr().out
    assert "model.safetensors: SHA-256" in out and "arith_warmstart.SHIPPED_SHA256" in out


def test_a_shipped_warm_start_whose_tokenizer_was_changed_and_rehashed_is_not_used(tmp_path, monkeypatch, capsys):
    """Issue 48: two digit tokens swapped in tokenizer.json and its manifest entry re-hashed: the manifest vouches
    for it, the code's hash of the shipped tokenizer does not."""
    W, copy, key = _shipped_copy(tmp_path, monkeypatch)
    tok = json.loads((copy / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    vocab["7"], vocab["8"] = vocab["8"], vocab["7"]
    (copy / "tokenizer.json").write_text(json.dumps(tok))
    _rehash(copy)
    assert W.cache_problem(copy) is None and W.shipped_checkpoint(key) is None
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and f"{copy / 'tokenizer.json'}: SHA-256" in out[0], out


def test_a_base_models_identity_is_computed_from_the_files_it_loads(tmp_path, monkeypatch):
    """Never read from a manifest: changed weights under an old manifest, a directory without a manifest, and a
    tokenizer changed under the same weights each get their own identity."""
    W, copy, _ = _shipped_copy(tmp_path, monkeypatch)
    genuine = W.base_identity(copy)
    assert genuine["sha256"] == W.SHIPPED_SHA256[copy.name]
    assert set(genuine["files"]) >= {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"}

    bare = tmp_path / "bare"
    shutil.copytree(copy, bare)
    (bare / "manifest.json").unlink()
    assert W.base_identity(bare) == genuine  # no manifest: still identified, by its bytes

    _flip_one_bit(copy / "model.safetensors")  # the old manifest stays
    changed = W.base_identity(copy)
    assert changed["sha256"] != genuine["sha256"] and changed["files_sha256"] != genuine["files_sha256"]

    tok = json.loads((bare / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    vocab["3"], vocab["4"] = vocab["4"], vocab["3"]  # two digit tokens swapped, the weights untouched
    (bare / "tokenizer.json").write_text(json.dumps(tok))
    swapped = W.base_identity(bare)
    assert swapped["sha256"] == genuine["sha256"] and swapped["files_sha256"] != genuine["files_sha256"]
    assert W.base_identity(tmp_path) == {}  # no weights: nothing to identify


def test_runs_whose_tokenizer_differs_under_the_same_weights_are_not_pooled(tmp_path):
    from dapo_exp import rundir
    from dapo_exp.analysis.runs import BASE_WEIGHTS, load_runs

    for name, seed, files_sha in (("a0", 0, "c" * 64), ("a1", 1, "c" * 64), ("b0", 0, "d" * 64)):
        d = tmp_path / name
        d.mkdir()
        config = {"seed": seed, "preset": "grpo", "model": {"path": "/m"}, "train": {"steps": 30}}
        rundir.write_json(d / rundir.SUMMARY, {
            "status": "finished", "label": "grpo", "seed": seed, "config": config, "switches": {},
            "final": {"eval/acc_avg": 0.5}, "base_model": {"path": "/m", "sha256": "a" * 64, "files_sha256": files_sha}})
    data = load_runs(tmp_path)
    keys = dict(zip(data.runs["run"], data.runs[BASE_WEIGHTS]))
    assert keys == {"a0": "c" * 12, "a1": "c" * 12, "b0": "d" * 12}
    assert data.runs["label"].nunique() == 2


# --------------------------------------------------------------------------- #
# dynamic sampling's cap error names a collapsed policy                           #
# --------------------------------------------------------------------------- #
def _groups(correct_per_group):
    return [Group(prompt_index=i, prompt_ids=[1], response_ids=[[2]] * len(c), truncated=[False] * len(c),
                  correct=c, reward=[float(x) for x in c], shaping={}, preds=[None] * len(c),
                  sampled_logprobs=[[-0.1]] * len(c), meta={"texts": ["x"] * len(c)})
            for i, c in enumerate(correct_per_group)]


@pytest.mark.parametrize("pattern, collapsed", [
    ([[False] * 4, [False] * 4], True),  # every group all-wrong
    ([[True] * 4, [False] * 4], True),  # all-right or all-wrong
    ([[True, False, False, False], [False] * 4], False),  # informative groups exist: more rounds may help
])
def test_the_cap_error_says_when_the_policy_has_collapsed(pattern, collapsed):
    from dapo_exp.fixes.base import GroupFilter

    def keep(correct, reward):
        return (correct.sum(1) > 0) & (correct.sum(1) < correct.shape[1])

    f = GroupFilter(keep=keep, max_rounds=2, on_cap="error")
    with pytest.raises(DynamicSamplingCapError) as err:
        collect_groups(lambda r, n: _groups(pattern), want=8, refill=f)
    msg = str(err.value)
    assert ("the policy has collapsed" in msg) == collapsed
    assert ("Raise algo.ds_max_rounds" in msg) == (not collapsed)


# --------------------------------------------------------------------------- #
# a checkpoint verified whole: optimizer state, step, shapes (issue 34)          #
# --------------------------------------------------------------------------- #
def _edit_state(ckpt: Path, edit) -> None:
    """Change the trainer state of ``ckpt`` and re-hash it into its manifest (what no checksum can catch)."""
    blob = torch.load(ckpt / checkpoint.STATE, weights_only=True)
    edit(blob)
    torch.save(blob, ckpt / checkpoint.STATE)
    manifest = json.loads((ckpt / checkpoint.MANIFEST).read_text())
    manifest["files"] = checkpoint.manifest_files(ckpt, (checkpoint.WEIGHTS, checkpoint.STATE))
    (ckpt / checkpoint.MANIFEST).write_text(json.dumps(manifest))


def _nan_moment(blob):
    blob["optimizer"]["state"][0]["exp_avg_sq"][0, 0] = float("nan")


def _misshaped_moment(blob):
    blob["optimizer"]["state"][1]["exp_avg"] = torch.zeros(3)


def _state_of(other: Path):
    def edit(blob):
        blob.clear()
        blob.update(torch.load(other / checkpoint.STATE, weights_only=True))
    return edit


def test_save_refuses_an_optimizer_state_that_is_not_finite(tmp_path):
    save_steps(tmp_path, 1)
    model, opt, sched = tiny_training_objects()
    next(iter(opt.state.values()))["exp_avg"][0, 0] = float("inf")
    with pytest.raises(CheckpointError, match=r"step_0000002: the optimizer state is not finite .*0\.exp_avg has 0 nan "
                                              r"and 1 inf"):
        checkpoint.save(tmp_path, 2, model, opt, sched, trainer_state(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_0000001"]


@pytest.mark.parametrize("damage, says", [
    ("nan moment", r"trainer_state.*the optimizer state is not finite \(optimizer state 0\.exp_avg_sq has 1 nan"),
    ("state of another step", r"trainer_state.*says step 1, but its directory is step_0000002 and its manifest says "
                              r"step 2"),
])
def test_a_rehashed_checkpoint_whose_state_is_damaged_is_skipped_naming_the_file(tmp_path, caplog, damage, says):
    root = tmp_path / "checkpoints"
    save_steps(root, 1, 2)
    newest = root / "step_0000002"
    _edit_state(newest, _nan_moment if damage == "nan moment" else _state_of(root / "step_0000001"))
    assert checkpoint.manifest_problem(newest, newest / checkpoint.MANIFEST) is None  # the checksums agree

    assert checkpoint.latest(root) == root / "step_0000001"  # "the last good checkpoint" is one that verifies
    (msg,) = _skips(caplog)
    assert re.search(says, msg), msg


def test_a_checkpoint_shaped_for_another_model_is_skipped_before_anything_is_loaded(tmp_path, caplog):
    root = tmp_path / "checkpoints"
    save_steps(root, 1, 2)
    newest = root / "step_0000002"
    _edit_state(newest, _misshaped_moment)
    checkpoint.verify(newest)  # finite, readable, its step right: only the model can tell
    model, opt, sched = tiny_training_objects(seed=3)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(CheckpointError, match=r"step_0000002/trainer_state.*optimizer state 1\.exp_avg is shaped "
                                              r"\[3\], its parameter \[8\]"):
        checkpoint.check_fits(newest, model, opt)
    fits = lambda p: checkpoint.check_fits(p, model, opt)  # noqa: E731
    assert checkpoint.latest(root, fits=fits) == root / "step_0000001"
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # nothing was loaded
    assert "optimizer state 1.exp_avg" in _skips(caplog)[0]

    other = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 2))  # another shape of model
    with pytest.raises(CheckpointError, match=r"step_0000001/model.safetensors: does not fit the model \(0\.bias is "
                                              r"\[8\], the model's is \[6\]\)"):
        checkpoint.check_fits(root / "step_0000001", other, torch.optim.AdamW(other.parameters()))


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["nan moment", "misshaped moment"])  # the step check: the unit test above
def test_resume_past_a_rehashed_damaged_checkpoint_gives_the_uninterrupted_metrics(tmp_path, small_cfg, caplog,
                                                                                   monkeypatch, damage):
    """The run-level cases of issue 34: each used to diverge, crash in 80 lines or re-train steps."""
    from helpers import whole_and_killed
    from test_train import metrics

    from dapo_exp import rundir
    from dapo_exp.train import train

    overrides = ("train.steps=3", "checkpoint.every=1", "checkpoint.keep=3")
    whole_and_killed(small_cfg, monkeypatch, tmp_path, overrides, 3)
    ckpts = tmp_path / "cut" / rundir.CHECKPOINTS
    newest = ckpts / "step_0000002"
    _edit_state(newest, _nan_moment if damage == "nan moment" else _misshaped_moment)

    s = train(small_cfg(tmp_path / "cut", *overrides))  # resumes from step 1, the newest that verifies and fits
    assert s["status"] == "finished"
    assert any(str(newest / checkpoint.STATE) in r.getMessage() for r in caplog.records)
    assert metrics(tmp_path / "cut") == metrics(tmp_path / "whole")


def test_the_run_state_is_typed_and_loads_a_checkpoint_written_before_it():
    """The trainer state a checkpoint holds becomes a RunState: an older checkpoint's dict (no base_model,
    history_gap or config_json; evaluation steps as strings) loads, a key no field names is refused."""
    from dapo_exp.build import RunState

    old = {"sampler_position": 12, "cum_rollouts": 64, "cum_gen_tokens": 900, "cum_trained_rollouts": 64,
           "carry": [], "evals": {"0": {"eval/acc_avg": 0.25}}, "wall_time_s": 3.5, "wandb_id": None}
    st = RunState.from_checkpoint(old)
    assert (st.sampler_position, st.evals, st.history_gap, st.base_model) == (12, {0: {"eval/acc_avg": 0.25}}, [], None)
    assert RunState.from_checkpoint(st.to_checkpoint()) == st
    with pytest.raises(ValueError, match=r"keys this version does not know: \['mystery'\]"):
        RunState.from_checkpoint({**old, "mystery": 1})
