"""The training loop of GRPO / DAPO, top to bottom.

One rollout step::

    sample prompts -> rollouts (G per prompt) -> rewards (+1/-1, + overlong term)
    -> dynamic sampling (refill until the batch holds only mixed groups)
    -> group advantages -> overlong-filtering mask -> old log-probs (trainer forward)
    -> PPO-style updates: mini-batches of whole groups, each a gradient step with
       gradient accumulation over micro-batches (normalised by the mini-batch)
    -> sync the rollout engine -> metrics -> periodic eval -> checkpoint

How it deviates from the paper, honestly: the paper trains a 32B model for
thousands of steps on DAPO-Math-17k; the embedded default is a 0.3M-parameter
policy on a synthetic arithmetic task for 30 steps, which exercises every
mechanism but says nothing about AIME. Old log-probs are always recomputed by
the trainer (never taken from the rollout engine). The KL term is off unless
``algo.kl_coef > 0`` (then a frozen copy of the initial policy is the reference).

``train(cfg)`` is a plain function: ``run.py`` wraps it in ``@hydra.main`` and
tests call it with a composed config.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import os
import random
import subprocess
import sys
import time
import traceback
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from dapo_exp import checkpoint, objective, runfiles
from dapo_exp.config import config_label, fix_switches, validate
from dapo_exp.batching import microbatches as micro_batches
from dapo_exp.rollout.dynamic_sampling import Group, collect_groups
from dapo_exp.rollout.engine import SamplingSpec

log = logging.getLogger("dapo_exp.train")


# =========================================================================== #
# Helpers                                                                       #
# =========================================================================== #
def git_commit() -> str:
    """The commit of the dapo_exp source tree (``+dirty`` if modified), or ``unknown``."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=here, capture_output=True, text=True, timeout=5
        ).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except Exception:  # noqa: BLE001 - not a git checkout (installed package)
        return "unknown"


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("train.device=cuda but CUDA is not available; use train.device=cpu or auto")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class PromptSampler:
    """Walks through the training prompts in a seeded random order, epoch after epoch.

    Its whole state is ``position`` (prompts consumed), so a resumed run continues
    with exactly the prompts an uninterrupted run would have drawn.
    """

    def __init__(self, n: int, seed: int, position: int = 0) -> None:
        self.n, self.seed, self.position = n, seed, position
        self._epoch, self._order = -1, None

    def _order_of(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 7919 + epoch)
            self._order, self._epoch = torch.randperm(self.n, generator=g).tolist(), epoch
        return self._order

    def take(self, k: int) -> list[int]:
        out = []
        for _ in range(k):
            epoch, i = divmod(self.position, self.n)
            out.append(self._order_of(epoch)[i])
            self.position += 1
        return out


def rows_to_tensors(
    prompts: list[list[int]], responses: list[list[int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """``[left-padded prompt | right-padded response]`` rows.

    Returns ``(input_ids (B, P+T), attention_mask, response_mask (B, T), P)``;
    the response token ``t`` of row ``b`` sits at column ``P + t``, so its
    log-prob is at index ``P - 1 + t`` of :func:`dapo_exp.logprobs.token_logprobs`.
    """
    width_p = max(len(p) for p in prompts)
    width_r = max(1, max(len(r) for r in responses))
    b = len(prompts)
    ids = torch.full((b, width_p + width_r), pad_id, dtype=torch.long)
    att = torch.zeros_like(ids)
    rmask = torch.zeros((b, width_r), dtype=torch.float32)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        ids[i, width_p - len(p) : width_p] = torch.tensor(p, dtype=torch.long)
        att[i, width_p - len(p) : width_p] = 1
        if r:
            ids[i, width_p : width_p + len(r)] = torch.tensor(r, dtype=torch.long)
            att[i, width_p : width_p + len(r)] = 1
            rmask[i, : len(r)] = 1.0
    return ids, att, rmask, width_p


def response_logprobs(
    model, prompts, responses, pad_id, device, chunk, temperature, with_entropy=False, autocast=False,
    autocast_dtype=torch.bfloat16,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(logp (B, T), entropy (B, T), response_mask (B, T))`` of the response tokens."""
    from dapo_exp.logprobs import token_logprobs

    ids, att, rmask, width_p = rows_to_tensors(prompts, responses, pad_id)
    ids, att = ids.to(device), att.to(device)
    with torch.autocast(device_type=device.type, dtype=autocast_dtype, enabled=autocast):
        logp, ent = token_logprobs(model, ids, att, chunk=chunk, with_entropy=with_entropy, temperature=temperature)
    t = rmask.shape[1]
    return logp[:, width_p - 1 : width_p - 1 + t].float(), ent[:, width_p - 1 : width_p - 1 + t].float(), rmask.to(
        device
    )


def make_engine(cfg: DictConfig, model, tokenizer, model_path: str):
    """The rollout engine named by ``rollout.engine``."""
    if cfg.rollout.engine == "hf":
        from dapo_exp.rollout.hf_engine import HFEngine

        return HFEngine(model, tokenizer, cfg.rollout.gen_batch_size)
    from dapo_exp.rollout.vllm_engine import VLLMEngine

    return VLLMEngine(
        model_path,
        seed=cfg.seed,
        dtype=cfg.model.dtype,
        gpu_memory_utilization=cfg.rollout.vllm_gpu_memory_utilization,
        enable_sleep=cfg.rollout.vllm_sleep,
        enforce_eager=cfg.rollout.vllm_enforce_eager,
        max_model_len=cfg.task.max_prompt_len + max(cfg.rollout.max_response_len, cfg.eval.max_response_len or 0),
    )


def read_summary(out_dir: Path) -> dict[str, Any] | None:
    p = out_dir / runfiles.SUMMARY
    if not p.exists():
        return None
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError:
        return None


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


def truncate_jsonl(path: Path, max_step: int) -> None:
    """Drop lines logged after ``max_step`` (written by a run killed before its next checkpoint)
    and any line left half-written by a kill."""
    if not path.exists():
        return
    keep = []
    for ln in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(ln)
        except json.JSONDecodeError:  # a line half-written when the run was killed
            continue
        if row.get("step", 0) <= max_step:
            keep.append(ln)
    path.write_text("".join(ln + "\n" for ln in keep))


class JsonlWriter:
    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, rows: list[dict[str, Any]] | dict[str, Any]) -> None:
        rows = [rows] if isinstance(rows, dict) else rows
        with self.path.open("a") as f:
            for r in rows:
                f.write(json.dumps(r, default=float) + "\n")


# =========================================================================== #
# Rollouts, scoring, evaluation                                                 #
# =========================================================================== #
def score_groups(
    prompt_indices: list[int],
    prompt_ids: list[list[int]],
    gens,
    n: int,
    answers: list[str],
    tokenizer,
    verifier,
    algo: Any,
    max_len: int,
    counters: dict[str, float],
) -> list[Group]:
    """Verify responses and build :class:`Group` objects with rewards (+1/-1 plus the overlong term)."""
    texts = tokenizer.batch_decode(gens.response_ids, skip_special_tokens=True)
    flat_answers = [a for a in answers for _ in range(n)]
    results = verifier.verify_batch(texts, flat_answers)
    counters["verify_timeouts"] += sum(r.timed_out for r in results)
    lengths = torch.tensor(gens.lengths, dtype=torch.float32)
    pen_max = algo.overlong_max_len if algo.overlong_max_len is not None else max_len
    penalty = objective.overlong_punishment(
        lengths, pen_max, algo.overlong_cache_len, algo.overlong_factor, algo.overlong_punishment
    ).tolist()
    groups = []
    for g, pi in enumerate(prompt_indices):
        sl = slice(g * n, (g + 1) * n)
        res = results[sl]
        correct = [r.correct for r in res]
        pen = penalty[sl]
        groups.append(
            Group(
                prompt_index=pi,
                prompt_ids=prompt_ids[g],
                response_ids=gens.response_ids[sl],
                truncated=gens.truncated[sl],
                correct=correct,
                reward=[(1.0 if c else -1.0) + p for c, p in zip(correct, pen)],
                penalty=pen,
                preds=[r.pred for r in res],
                sampled_logprobs=gens.sampled_logprobs[sl] if gens.sampled_logprobs else None,
                meta={"texts": texts[sl]},
            )
        )
    return groups


@torch.no_grad()
def evaluate(
    model, engine, tokenizer, verifier, problems, prompt_ids, cfg, step, device, sample_writer
) -> dict[str, float]:
    """avg@k, pass@k, maj@k, length, truncation and entropy on the held-out problems."""
    from dapo_exp.evaluation import summarise_eval

    e = cfg.eval
    k = e.k
    max_len = e.max_response_len or cfg.rollout.max_response_len
    t0 = time.perf_counter()
    engine.wake()
    gens = engine.generate(
        prompt_ids, SamplingSpec(n=k, max_new_tokens=max_len, temperature=e.temperature, top_p=e.top_p,
                                 seed=cfg.seed * 1_000_003 + 999_983 + step)
    )
    texts = tokenizer.batch_decode(gens.response_ids, skip_special_tokens=True)
    answers = [p.answer for p in problems for _ in range(k)]
    results = verifier.verify_batch(texts, answers)
    ids = [p.id for p in problems]
    summary = summarise_eval(
        ids, [r.correct for r in results], [r.pred for r in results], gens.lengths, gens.truncated, k
    )
    metrics = {key: float(v) for key, v in summary.items() if key.startswith("eval/")}
    # token entropy of the sampled responses under the policy (eval sampling temperature)
    ent_sum, tok = 0.0, 0.0
    rep_prompts = [p for p in prompt_ids for _ in range(k)]
    for s in range(0, len(rep_prompts), cfg.train.micro_batch_size):
        sl = slice(s, s + cfg.train.micro_batch_size)
        _, ent, m = response_logprobs(
            model, rep_prompts[sl], gens.response_ids[sl], tokenizer.pad_token_id, device,
            cfg.train.logprob_chunk, e.temperature, with_entropy=True,
        )
        ent_sum += float((ent * m).sum())
        tok += float(m.sum())
    metrics[runfiles.EVAL_ENTROPY] = ent_sum / max(tok, 1.0)
    metrics["eval/verify_timeouts"] = float(sum(r.timed_out for r in results))
    metrics["timing_s/eval"] = time.perf_counter() - t0
    if e.save_samples:
        sample_writer.write(
            [
                {
                    "step": step, "problem_id": ids[i // k], "sample": i % k, "prompt": problems[i // k].prompt,
                    "response": texts[i], "answer": answers[i], "pred": results[i].pred,
                    "correct": bool(results[i].correct), "length": gens.lengths[i], "truncated": gens.truncated[i],
                }
                for i in range(len(texts))
            ]
        )
    return metrics


# =========================================================================== #
# The loop                                                                      #
# =========================================================================== #
def train(cfg: DictConfig) -> dict[str, Any]:
    """Train one run as configured; returns the run summary (also written to summary.json).

    A run whose ``summary.json`` says ``finished`` is skipped (a re-run sweep does
    not redo finished jobs). A run with checkpoints resumes from the newest one.
    """
    # ---- 0. checks before any compute --------------------------------------------
    validate(cfg)
    from dapo_exp.models import check_model_source
    from dapo_exp.tasks import check_task_sources

    check_model_source(cfg.model.path)
    check_task_sources(cfg.task)
    out = Path(cfg.out_dir).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    previous = read_summary(out)
    if previous and previous.get("status") == runfiles.STATUS_FINISHED:
        log.info("%s already finished (summary.json); skipping", out)
        print(f"[dapo-exp] {out} already finished; skipping (delete summary.json to re-run)")
        return previous

    t_start = time.perf_counter()
    label, switches = config_label(cfg), fix_switches(cfg)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    commit = git_commit()
    write_json(out / "config.json", {"config": resolved, "git_commit": commit})
    summary: dict[str, Any] = {
        "status": runfiles.STATUS_RUNNING, "label": label, "preset": cfg.preset, "switches": switches,
        "seed": cfg.seed, "config": resolved, "git_commit": commit, "error": None,
    }
    cleanup: list = []  # what _train opened: closed here if it fails
    try:
        return _train(cfg, out, summary, t_start, label, switches, resolved, commit, cleanup)
    except BaseException as exc:  # KeyboardInterrupt too: record it, keep the checkpoints, re-raise
        summary.update(status=runfiles.STATUS_FAILED, error=f"{type(exc).__name__}: {exc}",
                       traceback=traceback.format_exc())
        write_json(out / runfiles.SUMMARY, summary)
        for close in reversed(cleanup):
            try:
                close()
            except Exception:  # noqa: BLE001 - best effort; the original error is what matters
                log.warning("cleanup after failure failed", exc_info=True)
        raise


def _train(cfg, out, summary, t_start, label, switches, resolved, commit, cleanup) -> dict[str, Any]:
    from tqdm.auto import tqdm

    from dapo_exp.models import load_policy, resolve_model_path
    from dapo_exp.tasks import load_task
    from dapo_exp.tasks.base import render_prompt
    from dapo_exp.tasks.verifier import get_verifier
    from dapo_exp.tracking import start_tracker

    a, r, t = cfg.algo, cfg.rollout, cfg.train
    seed_everything(cfg.seed)
    device = pick_device(t.device)
    # autocast on CUDA in model.dtype (train.bf16: auto = when model.dtype is 16-bit, true = always bf16)
    half = {"bfloat16": torch.bfloat16, "float16": torch.float16, "auto": torch.bfloat16}.get(cfg.model.dtype)
    bf16_flag = str(t.bf16).lower()
    autocast = device.type == "cuda" and (bf16_flag == "true" or (bf16_flag == "auto" and half is not None))
    autocast_dtype = half or torch.bfloat16

    # ---- 1. task, policy, engine, optimizer -------------------------------------
    task = load_task(cfg.task)
    model_path = resolve_model_path(cfg.model, cfg.task, r.max_response_len)
    # master weights stay float32 whatever model.dtype says: at the paper's lr 1e-6 an
    # AdamW update is far below bfloat16's resolution and would round away. model.dtype
    # is the compute dtype (bf16 autocast on CUDA, train.bf16) and the vLLM engine's dtype.
    tokenizer, model = load_policy(model_path, "float32", str(device), cfg.model.trust_remote_code)
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    verifier = get_verifier(cfg.task.verifier, cfg.task.verifier_timeout_s, cfg.task.verifier_workers)
    use_chat = bool(cfg.task.chat_template)
    train_prompts = [render_prompt(p.prompt, tokenizer, use_chat) for p in task.train]
    eval_prompts = [render_prompt(p.prompt, tokenizer, use_chat) for p in task.eval]
    too_long = sum(len(p) > cfg.task.max_prompt_len for p in train_prompts)
    if too_long:
        log.warning("%d training prompts exceed task.max_prompt_len=%d; they are left-truncated",
                    too_long, cfg.task.max_prompt_len)
        train_prompts = [p[-cfg.task.max_prompt_len:] for p in train_prompts]
    eval_too_long = sum(len(p) > cfg.task.max_prompt_len for p in eval_prompts)
    if eval_too_long:
        log.warning("%d eval prompts exceed task.max_prompt_len=%d; they are left-truncated",
                    eval_too_long, cfg.task.max_prompt_len)
        eval_prompts = [p[-cfg.task.max_prompt_len:] for p in eval_prompts]
    ref_model = copy.deepcopy(model).eval().requires_grad_(False) if a.kl_coef > 0 else None
    engine = make_engine(cfg, model, tokenizer, model_path)
    cleanup.append(engine.close)  # a sweep's next job must not find this one's vLLM holding the GPU
    if t.torch_compile:
        # compile the decoder's forward in place (used by generation and by the chunked
        # log-prob path alike); the module and its state_dict keys stay as they are
        decoder = model.get_decoder()
        decoder.forward = torch.compile(decoder.forward)

    o = cfg.optim
    optimizer = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=(o.beta1, o.beta2), weight_decay=o.weight_decay)
    warm = o.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)

    # ---- 2. resume ------------------------------------------------------------------
    state: dict[str, Any] = {
        "sampler_position": 0, "cum_rollouts": 0, "cum_gen_tokens": 0, "cum_trained_rollouts": 0,
        "carry": [], "evals": {}, "wall_time_s": 0.0, "wandb_id": None,
    }
    start_step = 0
    ckpt_root = out / runfiles.CHECKPOINTS
    last = checkpoint.latest(ckpt_root)
    if last is not None:
        start_step, state = checkpoint.load(last, model, optimizer, scheduler)
        engine.sync_weights(model)
        log.info("resumed from %s (step %d)", last, start_step)
        print(f"[dapo-exp] resuming {out.name} from step {start_step}")
    else:
        for f in (runfiles.METRICS, runfiles.EVAL_SAMPLES, runfiles.TRAIN_SAMPLES):
            (out / f).unlink(missing_ok=True)
    for f in (runfiles.METRICS, runfiles.EVAL_SAMPLES, runfiles.TRAIN_SAMPLES):
        truncate_jsonl(out / f, start_step)
    metrics_out = JsonlWriter(out / runfiles.METRICS)
    eval_out = JsonlWriter(out / runfiles.EVAL_SAMPLES)
    samples_out = JsonlWriter(out / runfiles.TRAIN_SAMPLES)
    sampler = PromptSampler(len(train_prompts), cfg.seed, state["sampler_position"])

    # ---- 3. tracking (a W&B run or a no-op; the loop never branches on it) ---------
    # stable across processes (Python's hash() is salted), so a restarted run continues its W&B run
    state["wandb_id"] = state.get("wandb_id") or f"{label}-s{cfg.seed}-{hashlib.sha1(str(out).encode()).hexdigest()[:8]}"
    tracker = start_tracker(
        cfg.logger.backend, out_dir=str(out), config={**resolved, "git_commit": commit, "label": label},
        project=cfg.logger.project, group=cfg.logger.group or cfg.sweep, name=f"{label}-s{cfg.seed}",
        tags=[k for k, v in switches.items() if v] + [f"preset:{cfg.preset}", f"label:{label}"]
        + list(cfg.logger.tags),
        mode=cfg.logger.mode, entity=cfg.logger.entity, run_id=state["wandb_id"],
    )
    cleanup.append(lambda: tracker.finish(exit_code=1))
    n_params = sum(p.numel() for p in model.parameters())
    log.info("%s: %s, %.2fM params, %d train / %d eval problems, device %s",
             label, model_path, n_params / 1e6, len(train_prompts), len(eval_prompts), device)

    def run_eval(step: int) -> dict[str, float]:
        m = evaluate(model, engine, tokenizer, verifier, task.eval, eval_prompts, cfg, step, device, eval_out)
        state["evals"][step] = m
        metrics_out.write({"step": step, **m})
        tracker.log(m, step)
        return m

    if cfg.eval.before_training and start_step == 0:
        run_eval(0)

    # ---- 4. the rollout steps -----------------------------------------------------
    G, L = r.n, r.max_response_len
    answers = [p.answer for p in task.train]
    counters: dict[str, float] = defaultdict(float)
    bar = tqdm(range(start_step + 1, t.steps + 1), initial=start_step, total=t.steps, desc=label,
               dynamic_ncols=True, file=sys.stderr, disable=None)
    step = start_step
    for step in bar:
        t_step = time.perf_counter()
        counters.clear()

        # 4a. rollouts, rewards, dynamic sampling ------------------------------------
        def generate_round(round_idx: int, n_prompts: int, _step=step) -> list[Group]:
            idx = sampler.take(n_prompts)
            gens = engine.generate(
                [train_prompts[i] for i in idx],
                SamplingSpec(n=G, max_new_tokens=L, temperature=r.temperature, top_p=r.top_p,
                             seed=cfg.seed * 1_000_003 + _step * 101 + round_idx),
            )
            counters["gen_seconds"] += gens.stats.get("gen_seconds", 0.0)
            return score_groups(idx, [train_prompts[i] for i in idx], gens, G, [answers[i] for i in idx],
                                tokenizer, verifier, a, L, counters)

        engine.wake()
        groups, state["carry"], ds = collect_groups(
            generate_round, t.prompts_per_step, a.dynamic_sampling, a.ds_signal, a.ds_max_rounds, a.ds_on_cap,
            a.ds_surplus, a.ds_oversample, state["carry"],
        )
        engine.sleep()
        t_gen = time.perf_counter() - t_step
        state["sampler_position"] = sampler.position
        state["cum_rollouts"] += ds.rollouts_generated
        state["cum_gen_tokens"] += ds.gen_tokens

        m: dict[str, float] = {}
        if groups:
            # 4b. advantages and masks ---------------------------------------------------
            rewards = torch.tensor([g.reward for g in groups], dtype=torch.float32)  # (N, G)
            adv = objective.group_advantages(rewards, a.adv_norm_std, a.adv_eps).reshape(-1)  # (B,)
            prompts = [g.prompt_ids for g in groups for _ in range(G)]
            responses = [resp for g in groups for resp in g.response_ids]
            truncated = torch.tensor([tr for g in groups for tr in g.truncated])
            group_index = torch.arange(len(groups)).repeat_interleave(G)
            lengths = [len(x) for x in responses]
            B = len(responses)
            width = max(1, max(lengths))
            resp_mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).float()  # (B, T)
            loss_mask = objective.overlong_filtering(resp_mask, truncated) if a.overlong_filtering else resp_mask

            # 4c. old (and reference) log-probs by the trainer, entropy of the samples ----
            t_train = time.perf_counter()
            model.eval()
            old_logp = torch.zeros(B, width)
            ref_logp = torch.zeros(B, width) if ref_model is not None else None
            ent_sum = 0.0
            with torch.no_grad():
                for mb in micro_batches([len(p) + n for p, n in zip(prompts, lengths)], t.micro_batch_size,
                                        t.token_budget):
                    lp, ent, mk = response_logprobs(model, [prompts[i] for i in mb], [responses[i] for i in mb],
                                                    tokenizer.pad_token_id, device, t.logprob_chunk,
                                                    r.temperature, with_entropy=True, autocast=autocast,
                                                    autocast_dtype=autocast_dtype)
                    old_logp[mb, : lp.shape[1]] = lp.cpu()
                    ent_sum += float((ent * mk).sum())
                    if ref_model is not None:
                        rl, _, _ = response_logprobs(ref_model, [prompts[i] for i in mb], [responses[i] for i in mb],
                                                     tokenizer.pad_token_id, device, t.logprob_chunk, r.temperature,
                                                     autocast=autocast, autocast_dtype=autocast_dtype)
                        ref_logp[mb, : rl.shape[1]] = rl.cpu()
            tok_adv = adv[:, None].expand(B, width).clone()
            if groups[0].sampled_logprobs is not None:
                from dapo_exp.rollout.mismatch import rollout_mismatch_stats, truncated_is_weights

                eng_logp = torch.zeros(B, width)
                for i, lp_list in enumerate(lp for g in groups for lp in g.sampled_logprobs):
                    eng_logp[i, : len(lp_list)] = torch.tensor(lp_list[:width])
                m.update(rollout_mismatch_stats(old_logp, eng_logp, resp_mask))
                if a.tis_cap is not None:
                    tok_adv = tok_adv * truncated_is_weights(old_logp, eng_logp, a.tis_cap)

            # 4d. PPO-style updates over mini-batches of whole groups --------------------
            model.train()
            upd = defaultdict(float)
            n_updates = 0
            groups_per_mb = max(1, t.mini_batch_size // G)
            for epoch in range(t.ppo_epochs):
                gen_perm = torch.Generator().manual_seed(cfg.seed * 31 + step * 7 + epoch)
                order = torch.randperm(len(groups), generator=gen_perm).tolist()
                for s in range(0, len(order), groups_per_mb):
                    rows = [gi * G + j for gi in order[s : s + groups_per_mb] for j in range(G)]
                    mb_mask = loss_mask[rows]
                    weights = objective.loss_normaliser(mb_mask, a.loss_agg, group_index[rows], max_len=L)
                    row_lens = [len(prompts[i]) + lengths[i] for i in rows]
                    for micro in micro_batches(row_lens, t.micro_batch_size, t.token_budget):
                        sel = [rows[i] for i in micro]
                        # padding waste: the tensor is [max prompt | max response] wide
                        upd["slots"] += len(sel) * (max(len(prompts[i]) for i in sel) + max(lengths[i] for i in sel))
                        upd["real_tokens"] += sum(row_lens[i] for i in micro)
                        lp, _, _ = response_logprobs(model, [prompts[i] for i in sel], [responses[i] for i in sel],
                                                     tokenizer.pad_token_id, device, t.logprob_chunk,
                                                     r.temperature, autocast=autocast, autocast_dtype=autocast_dtype)
                        w_ = lp.shape[1]
                        loss, st = objective.policy_loss(
                            lp, old_logp[sel, :w_].to(device), tok_adv[sel, :w_].to(device),
                            loss_mask[sel, :w_].to(device), weights[micro].to(device), a.eps_low, a.eps_high,
                            a.dual_clip, None if ref_logp is None else ref_logp[sel, :w_].to(device), a.kl_coef,
                            a.kl_estimator,
                        )
                        loss.backward()
                        for key, v in st.items():
                            upd[key] += float(v)
                    gn = torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip if o.grad_clip > 0 else 1e12)
                    upd["grad_norm"] += float(gn)
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    n_updates += 1
            model.eval()
            engine.sync_weights(model)
            t_train = time.perf_counter() - t_train

            # 4e. metrics of the step (names: README "Metrics") -------------------------
            acc = torch.tensor([g.correct for g in groups], dtype=torch.float32)
            n_tok = max(upd["n_tokens"], 1.0)
            lm_tokens = float(loss_mask.sum())
            m.update({
                "reward/mean": float(rewards.mean()),
                "reward/acc_mean": float(acc.mean()),
                "reward/overlong_penalty_mean": float(np.mean([p for g in groups for p in g.penalty])),
                "reward/verify_timeouts": counters["verify_timeouts"],
                "actor/entropy": ent_sum / max(float(resp_mask.sum()), 1.0),
                "actor/pg_loss": upd["pg_loss"] / max(n_updates, 1),
                "actor/pg_clipfrac_higher": upd["n_clipped_high"] / n_tok,
                "actor/pg_clipfrac_lower": upd["n_clipped_low"] / n_tok,
                "actor/pg_clipfrac_dual": upd["n_clipped_dual"] / n_tok,
                "actor/ppo_ratio_mean": upd["ratio_sum"] / n_tok,
                "actor/grad_norm": upd["grad_norm"] / max(n_updates, 1),
                "actor/masked_token_frac": 1.0 - lm_tokens / max(float(resp_mask.sum()), 1.0),
                "actor/zero_adv_token_frac": float(((tok_adv == 0).float() * loss_mask).sum()) / max(lm_tokens, 1.0),
                "actor/n_updates": float(n_updates),
                "perf/padding_waste": 1.0 - upd["real_tokens"] / max(upd["slots"], 1.0),
                "response_length/mean": float(np.mean(lengths)),
                "response_length/max": float(np.max(lengths)),
                "response_length/min": float(np.min(lengths)),
                "response_length/clip_ratio": float(truncated.float().mean()),
                "timing_s/update_actor": t_train,
                "perf/train_tokens_per_s": float(resp_mask.sum()) * t.ppo_epochs / max(t_train, 1e-9),
            })
            if "kl" in upd:
                m["actor/kl"] = upd["kl"] / max(n_updates, 1)
            state["cum_trained_rollouts"] += B
            samples_out.write([
                {"step": step, "group": gi, "prompt_index": g.prompt_index, "response": g.meta["texts"][j],
                 "correct": g.correct[j], "reward": g.reward[j], "length": len(g.response_ids[j]),
                 "truncated": g.truncated[j]}
                for gi, g in enumerate(groups[:2]) for j in range(G)
            ])
        else:
            log.warning("step %d: no group kept (dynamic sampling partial batch); no update", step)
        scheduler.step()

        # 4f. cost of dynamic sampling, compute counters, timing -----------------------
        t_total = time.perf_counter() - t_step
        m.update({
            "dynamic_sampling/zero_var_frac": ds.zero_var_groups / max(ds.groups_generated, 1),
            "dynamic_sampling/gen_rounds": float(ds.rounds),
            "dynamic_sampling/rollouts_generated": float(ds.rollouts_generated),
            "dynamic_sampling/kept_groups": float(ds.kept_groups),
            "dynamic_sampling/rollouts_per_trained": ds.rollouts_generated / max(ds.kept_groups * G, 1),
            "dynamic_sampling/surplus_groups": float(ds.surplus_groups),
            "dynamic_sampling/cap_hit": float(ds.cap_hit),
            "compute/rollouts_total": float(state["cum_rollouts"]),
            "compute/gen_tokens_total": float(state["cum_gen_tokens"]),
            "compute/trained_rollouts_total": float(state["cum_trained_rollouts"]),
            "optim/lr": optimizer.param_groups[0]["lr"],
            "timing_s/gen": t_gen,
            "timing_s/step": t_total,
            "perf/gen_tokens_per_s": ds.gen_tokens / max(counters["gen_seconds"], 1e-9),
        })
        metrics_out.write({"step": step, **m})
        tracker.log(m, step)

        # 4g. periodic eval and checkpoint -----------------------------------------------
        ev = {}
        if cfg.eval.every and step % cfg.eval.every == 0 or step == t.steps:
            ev = run_eval(step)
        bar.set_postfix(reward=f"{m.get('reward/mean', float('nan')):.2f}",
                        acc=f"{m.get('reward/acc_mean', float('nan')):.2f}",
                        ent=f"{m.get('actor/entropy', float('nan')):.2f}", s_step=f"{t_total:.1f}",
                        **({"eval": f"{ev['eval/acc_avg']:.2f}"} if ev else {}))
        if cfg.checkpoint.every and step % cfg.checkpoint.every == 0 or step == t.steps:
            state["wall_time_s"] += time.perf_counter() - t_start
            t_start = time.perf_counter()
            checkpoint.save(ckpt_root, step, model, optimizer, scheduler, state, cfg.checkpoint.keep)
    bar.close()

    if t.steps == 0 or (start_step == t.steps and not state["evals"]):
        run_eval(t.steps)

    # ---- 5. summary -----------------------------------------------------------------
    state["wall_time_s"] += time.perf_counter() - t_start
    evals = {int(k): v for k, v in state["evals"].items()}
    final_step = max(evals)
    # best over the evaluations of the trained policy (step 0 is the base policy, reported as `base`)
    trained = [s_ for s_ in evals if s_ > 0] or list(evals)
    best_step = max(trained, key=lambda s_: (evals[s_].get(runfiles.EVAL_ACC, -1), -s_))
    summary.update(
        status=runfiles.STATUS_FINISHED, steps_done=step, wall_time_s=state["wall_time_s"],
        final={"step": final_step, **evals[final_step]}, best={"step": best_step, **evals[best_step]},
        base={"step": 0, **evals[0]} if 0 in evals else {},
        compute={"rollouts_total": state["cum_rollouts"], "gen_tokens_total": state["cum_gen_tokens"]},
        model_path=model_path, n_params=n_params,
    )
    write_json(out / runfiles.SUMMARY, summary)
    tracker.summary({k: v for k, v in summary.items() if k not in ("config", "traceback")}
                    | {"final/" + k: v for k, v in summary["final"].items()})
    tracker.finish()
    engine.close()
    _print_summary(summary)
    return summary


def _print_summary(s: dict[str, Any]) -> None:
    """One screen at the end of a run."""
    keys = [runfiles.EVAL_ACC, runfiles.EVAL_PASS, runfiles.EVAL_MAJ, runfiles.EVAL_LEN, runfiles.EVAL_TRUNC,
            runfiles.EVAL_ENTROPY]
    lines = [f"[dapo-exp] run {s['label']} seed {s['seed']}: finished {s['steps_done']} steps in "
             f"{s['wall_time_s']:.0f}s (commit {s['git_commit'][:12]})"]
    lines.append(f"  {'metric':28s} {'base':>8s} {'final':>8s} {'best':>8s}")
    for k in keys:
        def fmt(d: dict) -> str:
            v = d.get(k)
            return f"{v:8.3f}" if isinstance(v, (int, float)) and not math.isnan(v) else f"{'-':>8s}"
        lines.append(f"  {k:28s} {fmt(s.get('base', {}))} {fmt(s['final'])} {fmt(s['best'])}")
    lines.append(f"  switches: {', '.join(k for k, v in s['switches'].items() if v) or 'none (GRPO)'}")
    print("\n".join(lines))
