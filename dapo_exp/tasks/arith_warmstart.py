"""The warm start of the embedded tiny policy on the toy task ``arith`` (``model.path=tiny``).

A short supervised phase on ``arith`` solutions, cached on disk under a key of every
setting it depends on, so that every run of a sweep starts from the same base policy.
It is deliberately imperfect: a fraction of its training solutions end with a wrong
answer and a fraction ramble past the length cap, so the base policy is neither
hopeless nor perfect (held-out avg@k roughly 20-60%) and some samples are truncated,
which is what the overlong fixes act on. It uses its own fixed seed.
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

from dapo_exp.console import ProgressLines
from dapo_exp.models import CHARS, build_char_tokenizer, build_tiny_model
from dapo_exp.tasks.arith import load_arith, solution_text

log = logging.getLogger(__name__)

WARMSTART_SEED = 20250317  # fixed: the base policy must not depend on the run seed
WARMSTART_VERSION = 3  # bump when the warm-start recipe changes (invalidates caches)
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
                "warmstart_long_frac",
                "warmstart_wrong_frac",
            )
        },
        "task": {
            k: getattr(task_cfg, k)
            for k in ("arith_seed", "arith_n_train", "arith_max_operand", "arith_n_operands_max", "arith_ops")
        },
        "max_response_len": max_response_len,
    }
    blob = json.dumps(keys, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _warmstart_text(rng: random.Random, problem: Any, long_frac: float, wrong_frac: float, cap: int) -> str:
    """A supervised target: the reference solution, sometimes wrong, sometimes rambling past the cap."""
    steps = list(problem.meta["steps"])
    answer = int(problem.answer)
    if rng.random() < wrong_frac:
        answer += rng.choice([-10, -2, -1, 1, 2, 10])
        steps[-1] = steps[-1].rsplit("=", 1)[0] + f"={answer}"
    text = solution_text(steps, answer)
    if rng.random() < long_frac:
        ramble = []
        while sum(len(r) + 1 for r in ramble) < cap:
            ramble.append(rng.choice(_RAMBLE))
        text = "\n".join(ramble) + "\n" + text
    return text


def warm_start(model: Any, tokenizer: Any, model_cfg: Any, task_cfg: Any, max_response_len: int) -> dict[str, float]:
    """Supervised phase on (imperfect) solutions of the train problems; returns stats."""
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
        batch = rng.sample(data.train, model_cfg.warmstart_batch_size)
        rows, labels = [], []
        for p in batch:
            prompt = [bos] + tokenizer(p.prompt, add_special_tokens=False)["input_ids"]
            target = tokenizer(
                _warmstart_text(
                    rng, p, model_cfg.warmstart_long_frac, model_cfg.warmstart_wrong_frac, max_response_len
                ),
                add_special_tokens=False,
            )["input_ids"]
            target = (target + [eos])[: max_response_len + 8]
            rows.append(prompt + target)
            labels.append([-100] * len(prompt) + target)
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


def ensure_tiny_checkpoint(model_cfg: Any, task_cfg: Any, max_response_len: int) -> str:
    """Path of the warm-started tiny model, building it on first use (cached, process-safe)."""
    from filelock import FileLock

    cache_root = Path(os.path.expanduser(model_cfg.cache_dir))
    cache_root.mkdir(parents=True, exist_ok=True)
    key = _warmstart_key(model_cfg, task_cfg, max_response_len)
    target = cache_root / f"tiny-{key}"
    with FileLock(str(cache_root / f"tiny-{key}.lock")):
        if (target / "config.json").exists():
            return str(target)
        print(f"[dapo-exp] building the warm-started tiny model ({model_cfg.warmstart_steps} supervised steps, "
              f"once; cached at {target})", flush=True)
        n_threads = torch.get_num_threads()
        tokenizer = build_char_tokenizer()
        model = build_tiny_model(
            tokenizer, model_cfg.hidden_size, model_cfg.num_layers, model_cfg.num_heads, WARMSTART_SEED
        )
        stats = warm_start(model, tokenizer, model_cfg, task_cfg, max_response_len)
        torch.set_num_threads(n_threads)
        tmp = Path(tempfile.mkdtemp(dir=cache_root, prefix=".tmp-"))
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "warmstart.json").write_text(json.dumps(stats, indent=1))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
        log.info("warm start done in %.1fs (final loss %.3f)", stats["warmstart/seconds"], stats["warmstart/loss"])
    return str(target)
