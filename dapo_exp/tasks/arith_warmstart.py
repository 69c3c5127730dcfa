"""The warm start of the embedded tiny policy on the toy task ``arith`` (``model.path=tiny``).

A short supervised phase on ``arith`` targets, cached on disk under a key of every
setting it depends on, so that every run of a sweep starts from the same base policy.
It uses its own fixed seed. The cache is trusted only through its ``manifest.json`` (sizes and
SHA-256 of every file, written last, after the build's directory is renamed into place), verified
on every use: a damaged cache, one without a manifest, or what a killed build left is rebuilt.
Inside a run, SIGINT and SIGTERM stop a build at once (the run's handler raises
:class:`dapo_exp.rundir.RunStopped` during the set-up; :func:`warm_start` also checks
:func:`dapo_exp.rundir.stop_requested` every step): what was not saved is lost, and what was is not
trusted without its manifest.

The targets are a *mix of strategies* (:func:`warmstart_text`), so that RL has something to
select: the policy learns to produce each strategy reliably, and what RL can change is how
often it picks which. The knobs (``model.warmstart_*``) set each strategy's share:

- ``guess`` (``warmstart_guess_frac``): a bare ``Answer: N``, off by 1, 2, 3 or 10 with
  probability ``warmstart_guess_off_frac``: short, usually wrong;
- ``step`` (the rest): the step-by-step solution, one ``a+b=c`` line per step, correct unless
  ``warmstart_wrong_frac`` (then the last step and answer are off);
- ``ramble`` (``warmstart_long_frac`` of the step solutions): filler lines before the
  solution, long enough to pass the length cap;
- ``loop`` (``warmstart_loop_frac`` of the step solutions): a repetition loop that starts
  at a uniformly drawn step and repeats that line past the cap (degeneration that can begin
  mid-response).

``warmstart_step_first_frac`` < 1 separates skill from choice: only that share of the step
targets has its first token in the loss (:func:`choice_masked`), so the policy learns the step
skill from all of them but starts a step solution rarely. With ``warmstart_step_marker`` a step
solution opens with a ``Steps:`` line, so that first token is the choice alone (not also the
copy of the first operand, which would then be learned from the few unmasked targets only).

The regimes of the testbed (``conf/experiment/toy_*.yaml``; docs: explanation/testbed.md) are
settings of these knobs plus the task's and the rollout's; :mod:`dapo_exp.tasks.arith` measures
the strategies back in the policy's samples (``diag/*`` metrics).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from dapo_exp import rundir
from dapo_exp.checkpoint import fsync_path, manifest_files, manifest_problem, sha256_file
from dapo_exp.console import ProgressLines
from dapo_exp.models import CHARS, build_char_tokenizer, build_tiny_model
from dapo_exp.tasks.arith import STEP_MARKER, load_arith, response_style, solution_text

log = logging.getLogger(__name__)

WARMSTART_SEED = 20250317  # fixed: the base policy must not depend on the run seed
WARMSTART_VERSION = 4  # bump when the warm-start recipe changes (invalidates caches)
WARMSTART_MIX_KEYS = ("warmstart_guess_frac", "warmstart_guess_off_frac", "warmstart_wrong_frac",
                      "warmstart_long_frac", "warmstart_loop_frac", "warmstart_step_first_frac")
# knobs added after WARMSTART_VERSION 4, with their defaults: in the cache key only when they differ
# from the default, so caches built before stay valid
WARMSTART_LATER_KEYS = {"warmstart_step_marker": False}
GUESS_OFFSETS = (-10, -3, -2, -1, 1, 2, 3, 10)
_RAMBLE = ["hmm wait", "let me check", "check again", "not sure", "recount", "so far so good"]


def _warmstart_key(model_cfg: Any, task_cfg: Any, max_response_len: int) -> str:
    keys = {
        "version": WARMSTART_VERSION,
        "chars": CHARS,
        "model": {
            k: getattr(model_cfg, k)
            for k in (
                "hidden_size",
                "num_layers",
                "num_heads",
                "warmstart_steps",
                "warmstart_lr",
                "warmstart_batch_size",
                *WARMSTART_MIX_KEYS,
            )
        },
        "task": {
            k: getattr(task_cfg, k)
            for k in ("arith_seed", "arith_n_train", "arith_max_operand", "arith_n_operands_max", "arith_ops")
        },
        "max_response_len": max_response_len,
    }
    keys["model"].update({k: getattr(model_cfg, k, d) for k, d in WARMSTART_LATER_KEYS.items()
                          if getattr(model_cfg, k, d) not in (d, None)})
    blob = json.dumps(keys, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def warmstart_text(rng: random.Random, problem: Any, model_cfg: Any, cap: int) -> str:
    """One supervised target for ``problem``: a strategy drawn with the shares of ``model_cfg``."""
    answer = int(problem.answer)
    if rng.random() < model_cfg.warmstart_guess_frac:
        if rng.random() < model_cfg.warmstart_guess_off_frac:
            answer += rng.choice(GUESS_OFFSETS)
        return f"Answer: {answer}"
    steps = list(problem.meta["steps"])
    if rng.random() < model_cfg.warmstart_wrong_frac:
        answer += rng.choice([-10, -2, -1, 1, 2, 10])
        steps[-1] = steps[-1].rsplit("=", 1)[0] + f"={answer}"
    if rng.random() < model_cfg.warmstart_loop_frac:
        at = rng.randrange(len(steps))
        lines = steps[: at + 1]
        while sum(len(x) + 1 for x in lines) < cap + 8:
            lines.append(steps[at])
        return "\n".join([STEP_MARKER, *lines] if model_cfg.warmstart_step_marker else lines)
    text = solution_text(steps, answer)
    if model_cfg.warmstart_step_marker:
        text = f"{STEP_MARKER}\n{text}"
    if rng.random() < model_cfg.warmstart_long_frac:
        ramble: list[str] = []
        while sum(len(r) + 1 for r in ramble) < cap:
            ramble.append(rng.choice(_RAMBLE))
        text = "\n".join(ramble) + "\n" + text
    return text


def choice_masked(rng: random.Random, text: str, step_first_frac: float) -> bool:
    """Whether the first token of this target stays out of the loss: a step-by-step target's with
    probability ``1 - step_first_frac`` (``model.warmstart_step_first_frac``). The step skill is then
    learned from every step target, but the choice to start one from only a share of them, so the
    step strategy can be reliable and rare at once (the Clip-Higher regime)."""
    return step_first_frac < 1.0 and response_style(text) == "step" and rng.random() >= step_first_frac


def warm_start(model: Any, tokenizer: Any, model_cfg: Any, task_cfg: Any, max_response_len: int) -> dict[str, float]:
    """Supervised phase on (imperfect) solutions of the train problems; returns stats.

    Inside a run, a SIGINT or SIGTERM ends it (:class:`dapo_exp.rundir.RunStopped`, at the latest
    before the next step): the build takes minutes, longer than a scheduler's grace period, and what it
    has not saved is lost with nothing written."""
    data = load_arith(task_cfg)
    rng = random.Random(WARMSTART_SEED)
    torch.manual_seed(WARMSTART_SEED)
    opt = torch.optim.AdamW(model.parameters(), lr=model_cfg.warmstart_lr, weight_decay=0.0)
    steps = model_cfg.warmstart_steps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * max(0.05, 1 - s / max(1, steps)))
    model.train()
    bos, eos, pad = tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
    t0 = time.time()
    loss_val = float("nan")
    progress = ProgressLines("warm start", steps, every_s=10.0)
    for i in range(steps):
        if (signame := rundir.stop_requested()) is not None:
            raise rundir.RunStopped(signame)
        batch = rng.sample(data.train, model_cfg.warmstart_batch_size)
        rows, labels = [], []
        for p in batch:
            prompt = [bos] + tokenizer(p.prompt, add_special_tokens=False)["input_ids"]
            text = warmstart_text(rng, p, model_cfg, max_response_len)
            target = tokenizer(text, add_special_tokens=False)["input_ids"]
            target = (target + [eos])[: max_response_len + 8]
            rows.append(prompt + target)
            label = list(target)
            if choice_masked(rng, text, model_cfg.warmstart_step_first_frac):
                label[0] = -100  # teaches the strategy's skill, not the choice of it
            labels.append([-100] * len(prompt) + label)
        width = max(len(r) for r in rows)
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
        lab = torch.tensor([lb + [-100] * (width - len(lb)) for lb in labels])
        att = (torch.arange(width)[None, :] < torch.tensor([len(r) for r in rows])[:, None]).long()
        loss = model(input_ids=ids, attention_mask=att, labels=lab).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        loss_val = loss.item()
        progress.count(i + 1, f"steps, loss {loss_val:.3f}")
    model.eval()
    return {"warmstart/loss": loss_val, "warmstart/seconds": time.time() - t0, "warmstart/steps": steps}


CACHE_MANIFEST = "manifest.json"
# prebuilt warm starts shipped with the package (model.warmstart_source=shipped), one directory per
# key, each with its manifest: the default toy's, so that every machine starts from the same weights
SHIPPED_DIR = Path(__file__).resolve().parents[1] / "assets" / "warmstart"


# the files besides the weights that decide what a model directory computes (transformers' loaders read them)
LOADED_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model",
                "chat_template.jinja", "chat_template.json")


def _weight_files(model_dir: Path) -> list[Path]:
    return sorted(p for p in model_dir.iterdir() if p.is_file() and (
        p.suffix == ".safetensors" or (p.name.startswith("pytorch_model") and p.suffix == ".bin")))


def base_identity(model_dir: str | os.PathLike) -> dict[str, Any]:
    """The identity of a model directory, computed from the files it loads (never read from a manifest):
    ``sha256``, the SHA-256 of ``model.safetensors`` (of the list of shard hashes when sharded), and
    ``files_sha256``, one SHA-256 over every loaded file's (weights, config, tokenizer, chat template), with
    ``files`` naming each. Empty when the directory holds no weights. Hashing reads every byte once
    (about 1 s per GB)."""
    d = Path(model_dir)
    weights = _weight_files(d) if d.is_dir() else []
    if not weights:
        return {}
    files = {p.name: sha256_file(p) for p in weights + [d / n for n in LOADED_FILES if (d / n).is_file()]}
    w = ([files[weights[0].name]] if len(weights) == 1 else
         [hashlib.sha256(json.dumps({p.name: files[p.name] for p in weights}, sort_keys=True).encode()).hexdigest()])
    return {"sha256": w[0], "files_sha256": hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest(),
            "files": files}


def weights_sha256(model_dir: str | os.PathLike) -> str | None:
    """SHA-256 of a model directory's weights, computed (:func:`base_identity`); None without weights."""
    return base_identity(model_dir).get("sha256")


def cache_problem(target: Path) -> str | None:
    """Why the warm-start cache ``target`` cannot be trusted (naming the file), or None.

    Trusted only when its ``manifest.json`` (written last, after the directory was renamed into
    place) exists, lists the weights and every other file the model loads that the directory holds
    (:data:`LOADED_FILES`: a tokenizer outside the manifest could change unseen), and every file it
    lists has its size and SHA-256: a build killed at any point, a cache from before manifests, a
    truncated or altered file are all untrusted."""
    required = ["model.safetensors"] + [n for n in LOADED_FILES if (target / n).is_file() or n == "config.json"]
    return manifest_problem(target, target / CACHE_MANIFEST, required=required)


# the shipped warm starts' weights, held by the code: a manifest re-hashed after the weights changed is caught
SHIPPED_SHA256 = {
    "tiny-e5562a88c7a049a3": "695a51a911491fb83efcd2f21df0efe2333c9722443c659090394bac5b31f884",  # the default
    # the testbed's regimes with a base policy of their own (experiment=toy_clip, toy_dapo, toy_degeneration,
    # toy_overlong): python -m dapo_exp.tasks.arith_warmstart --ship experiment=<regime>
    "tiny-adf1668cc05b5183": "f8027c5dd96896392d69d8d31c5afeb9d35f4fd4aa1896a8cf3b2102f0e5f8d6",  # toy_clip
    "tiny-cb7d6deed6a5fd7c": "a2211fcceb02b102104bc19079a5bf98c18b7d08bfde321e31953f004c9a98f1",  # toy_dapo
    "tiny-5df2dcbfddf8caa0": "fda7169776a028659b8d7d278e5dadf07bc44dd6e8f94f3961f9f0101dbb03b8",  # toy_degeneration
    "tiny-30715767c50a01fa": "1db875968682bd2e684945be228ff0657f437eb0cf78eab1e63d377e910193e6",  # toy_overlong
}


# every other file a shipped warm start's loading reads (the LOADED_FILES it holds), held by the code too, so
# that a tokenizer edited and re-hashed into its manifest is caught: the same in each (one architecture's config,
# the character tokenizer); a warm start shipped with others fails the test that compares these with the assets
SHIPPED_LOADED_SHA256 = {
    "config.json": "26c02f13089688214a0c4649f39f3c8f7c91ffe6416dcebb643f33a2df911060",
    "generation_config.json": "304d8599739c0afba9527f305998bc56de4d36534844c9558f0a77268d11a822",
    "tokenizer.json": "afd7816b8363deaead4a9ff40a9efaa719575f910a4a793a5d5412baac363b65",
    "tokenizer_config.json": "e406c1671f7227dc8794a216484d7d88ced3c580c0d2a0951af2386fa540d74e",
}


def shipped_files_sha256(name: str) -> dict[str, str]:
    """The SHA-256 the code holds for each file the shipped warm start ``name`` (``tiny-<key>``) loads: its
    weights' (:data:`SHIPPED_SHA256`) and the config's and tokenizer's (:data:`SHIPPED_LOADED_SHA256`); empty
    when none is shipped under that name."""
    return {"model.safetensors": SHIPPED_SHA256[name], **SHIPPED_LOADED_SHA256} if name in SHIPPED_SHA256 else {}


def _unvouched(target: Path) -> str | None:
    """The first file the shipped warm start ``target`` loads whose SHA-256 in its manifest is not the one the
    code holds (:func:`shipped_files_sha256`), named with both; None when the code vouches for every one."""
    try:
        listed = {n: f["sha256"] for n, f in json.loads((target / CACHE_MANIFEST).read_text())["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        listed = {}
    held = shipped_files_sha256(target.name)
    loaded = {"model.safetensors", *(n for n in LOADED_FILES if (target / n).is_file()), *held}
    for name in sorted(loaded, key=lambda n: (n != "model.safetensors", n)):  # the weights first
        if listed.get(name) != held.get(name):
            where = "SHIPPED_SHA256" if name == "model.safetensors" else "SHIPPED_LOADED_SHA256"
            return (f"{target / name}: SHA-256 {listed.get(name)} is not the shipped one's {held.get(name)} "
                    f"(arith_warmstart.{where})")
    return None


def shipped_checkpoint(key: str) -> Path | None:
    """The package's prebuilt warm start of ``key`` (:data:`SHIPPED_DIR`), verified against its
    manifest, and the manifest against the hashes the code holds of every file it loads
    (:func:`shipped_files_sha256`); None when none is shipped, or when it is damaged (said in one line: the
    caller builds)."""
    target = SHIPPED_DIR / f"tiny-{key}"
    if not target.exists():
        return None
    # the manifest vouches for the files, and the code vouches for the manifest (a re-hashed one is caught)
    problem = cache_problem(target) or _unvouched(target)
    if problem:
        print(f"[dapo-exp] the shipped warm start {target} is damaged ({problem}); not used: the warm start "
              f"cached on this machine is used instead, built first if there is none", flush=True)
        return None
    return target


def ensure_tiny_checkpoint(model_cfg: Any, task_cfg: Any, max_response_len: int) -> str:
    """Path of the warm-started tiny model: the shipped one of these settings
    (``model.warmstart_source=shipped``, :func:`shipped_checkpoint`), else built on first use
    (cached, process-safe).

    The cache is verified against its manifest on every use (:func:`cache_problem`); a damaged or
    unmanifested one is rebuilt, saying so in one line."""
    from filelock import FileLock

    key = _warmstart_key(model_cfg, task_cfg, max_response_len)
    if getattr(model_cfg, "warmstart_source", "shipped") == "shipped" and (shipped := shipped_checkpoint(key)):
        return str(shipped)
    cache_root = Path(os.path.expanduser(model_cfg.cache_dir))
    cache_root.mkdir(parents=True, exist_ok=True)
    target = cache_root / f"tiny-{key}"
    with FileLock(str(cache_root / f"tiny-{key}.lock")):
        for stale in cache_root.glob(f".tmp-tiny-{key}-*"):  # left by a killed build of this key
            shutil.rmtree(stale, ignore_errors=True)
        problem = cache_problem(target) if target.exists() else None
        if target.exists() and problem is None:
            return str(target)
        if problem:
            print(f"[dapo-exp] rebuilding the warm-started tiny model: its cache is damaged ({problem})", flush=True)
        else:
            print(f"[dapo-exp] building the warm-started tiny model ({model_cfg.warmstart_steps} supervised steps, "
                  f"once; cached at {target})", flush=True)
        _build_cache(model_cfg, task_cfg, max_response_len, cache_root, key, target)
    return str(target)


def _build_cache(model_cfg: Any, task_cfg: Any, max_response_len: int, cache_root: Path, key: str,
                 target: Path) -> None:
    """Warm-start, save into a temporary directory (files fsynced), rename it to ``target``, then
    write the manifest of sizes and SHA-256 last: until it exists nothing of the build is trusted."""
    n_threads = torch.get_num_threads()
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, model_cfg.hidden_size, model_cfg.num_layers, model_cfg.num_heads,
                             WARMSTART_SEED)
    stats = warm_start(model, tokenizer, model_cfg, task_cfg, max_response_len)
    torch.set_num_threads(n_threads)
    tmp = Path(tempfile.mkdtemp(dir=cache_root, prefix=f".tmp-tiny-{key}-"))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "warmstart.json").write_text(json.dumps(stats, indent=1))
        names = sorted(p.name for p in tmp.iterdir() if p.is_file())
        for name in names:
            fsync_path(tmp / name)
        fsync_path(tmp)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_path(cache_root)
    rundir.write_json(target / CACHE_MANIFEST, {"version": WARMSTART_VERSION, "key": key,
                                                "files": manifest_files(target, names)})
    log.info("warm start done in %.1fs (final loss %.3f)", stats["warmstart/seconds"], stats["warmstart/loss"])


def ship(overrides: list[str]) -> Path:
    """Build the warm start of the config ``overrides`` give here (``model.warmstart_source=build``)
    and copy it, with its manifest, into :data:`SHIPPED_DIR`: how the shipped one was made. Returns
    the shipped directory; its weights' SHA-256 goes into :data:`SHIPPED_SHA256` by hand, and any other loaded
    file that differs from :data:`SHIPPED_LOADED_SHA256` is named (the code vouches for what it ships; a test
    fails until it does)."""
    from dapo_exp.hydra_setup import compose_config

    cfg = compose_config([*overrides, "model.warmstart_source=build"])
    built = Path(ensure_tiny_checkpoint(cfg.model, cfg.task, cfg.rollout.max_response_len))
    dest = SHIPPED_DIR / built.name
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(built, dest)
    return dest


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(
        description="python -m dapo_exp.tasks.arith_warmstart --ship [overrides]: build the warm start of the "
                    "config here and ship it in dapo_exp/assets/warmstart/ (commit the directory).")
    parser.add_argument("--ship", action="store_true", help="build and copy into the package's assets")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the config whose warm start to ship")
    args = parser.parse_args()
    if not args.ship:
        parser.error("nothing to do: pass --ship")
    shipped = ship(args.overrides)
    files = base_identity(shipped)["files"]
    print(f"{shipped}\nadd to arith_warmstart.SHIPPED_SHA256: {shipped.name!r}: {files['model.safetensors']!r}")
    for name, sha in sorted(files.items()):
        if name != "model.safetensors" and SHIPPED_LOADED_SHA256.get(name) != sha:
            print(f"{name} is not the one the other shipped warm starts load (SHIPPED_LOADED_SHA256): {sha!r}")
