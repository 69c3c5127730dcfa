"""Verified or refused (issue 24): a checkpoint or a warm-start cache is used only when its manifest
vouches for every byte; weights that are not finite are neither saved nor loaded; dynamic
sampling's cap error says when the policy has collapsed."""

import hashlib
import json
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
    capsys.readouterr()
    assert _ensure(cfg) == shipped and capsys.readouterr().out == ""  # shipped and verified: used
    cfg.model.warmstart_source = "build"
    assert _ensure(cfg) == built  # build: the local one, whatever is shipped
    cfg.model.warmstart_source = "shipped"
    _flip_one_bit(shipped / "model.safetensors")
    assert _ensure(cfg) == built
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "the shipped warm start" in out[0] and "is damaged" in out[0], out


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
        collect_groups(lambda r, n: _groups(pattern), want=8, group_filter=f)
    msg = str(err.value)
    assert ("the policy has collapsed" in msg) == collapsed
    assert ("Raise algo.ds_max_rounds" in msg) == (not collapsed)
