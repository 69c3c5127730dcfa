"""Benchmark: how a training step scales with the model and the batch, against its floor.

    python -m dapo_exp.benchmarks.scaling                              # 1x/4x/16x params x 1x/2x/4x responses, CPU
    python -m dapo_exp.benchmarks.scaling --widths 96 --responses 8 --steps 2 --warmup 1   # a quick look
    python -m dapo_exp.benchmarks.scaling --device cuda --widths 96,384,1536                # one GPU

For each model width (the tiny Qwen2 of ``model.path=tiny``, random weights: the warm start
is skipped, ``model.warmstart_steps=0``, so no width needs minutes of supervised training;
doubling the width is ~4x the parameters) and each group size (``rollout.n``; 16 prompts per
step), it runs dapo-exp's own rollout step (:func:`dapo_exp.train.rollout_groups` then
:func:`dapo_exp.train.train_on`: generation, rewards, advantages, one update over the batch,
on-policy) with exactly ``--tokens`` new tokens per response (EOS suppressed), and times its
two halves: *generation* (``rollout_groups``) and *training* (``train_on``).

Beside each it times the *floor* of the same work on the same model: a bare transformers
``generate`` of the same batch (eager, dynamic cache, the same forced length) and one bare
forward + backward (mean log-prob of the rows) + AdamW step over the same rows in the same
micro-batches. ``step / floor`` above 1 is dapo-exp's overhead; below 1 on the generation
side is the static-cache / compiled decode beating ``generate``. The floor is a little
different work, not more: it projects every position to the vocabulary (the trainer only the
response ones), passes no attention mask (the trainer's left-padded rows need one) and takes
its micro-batches in order rather than shuffled.

Reported per cell: median s/step of each half and of the floor, and tokens/s =
(generated + trained response tokens) / step time. One untimed warm-up step per cell (with a
compiled decode it holds the compile, reported apart) then ``--steps`` timed steps.
Timings are only comparable within one run on one quiet machine: the load average is
printed before and after.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from dapo_exp.config import DECODE_MODES


def overrides(*, width: int, n: int, prompts: int, tokens: int, micro: int, decode: str, device: str, out: Path,
              cache_dir: str, train_compile: bool = False) -> list[str]:
    """dapo-exp's config for one cell (the vs_trl benchmark's work, at this width and group size)."""
    from dapo_exp.benchmarks.vs_trl import work_overrides

    return [*work_overrides(prompts=prompts, n=n, tokens=tokens, micro=micro, decode=decode, device=device, out=out,
                            train_compile=train_compile),
            "model.path=tiny", f"model.hidden_size={width}", "model.num_heads=3", "model.warmstart_steps=0",
            f"model.cache_dir={cache_dir}", "eval.every=0", "eval.before_training=false"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


class Cell:
    """One (width, group size): dapo-exp's step and its floor on the same model."""

    def __init__(self, cfg: Any, tokens: int) -> None:
        from dapo_exp import train as T
        from dapo_exp.benchmarks.vs_trl import open_run

        self.T, self.tokens, self.step_no = T, tokens, 0
        self.run, self.progress = open_run(cfg, tokens, "scaling")
        self.params = sum(p.numel() for p in self.run.model.parameters())

    def step(self) -> dict[str, float]:
        """One rollout step of dapo-exp: seconds of each half, tokens generated and trained."""
        dev = self.run.device
        self.step_no += 1
        _sync(dev)
        t0 = time.perf_counter()
        groups, ds, _, _ = self.T.rollout_groups(self.run, self.progress, self.step_no)
        _sync(dev)
        t1 = time.perf_counter()
        self.T.train_on(self.run, self.progress, groups, self.step_no)
        self.run.scheduler.step()
        _sync(dev)
        t2 = time.perf_counter()
        trained = sum(len(r) for g in groups for r in g.response_ids)
        return {"gen": t1 - t0, "train": t2 - t1, "gen_tokens": ds.gen_tokens, "trained_tokens": trained,
                "rows": [list(g.prompt_ids) + list(r) for g in groups for r in g.response_ids],
                "prompts": [list(g.prompt_ids) for g in groups]}

    def floor(self, rows: list[list[int]], prompts: list[list[int]], micro: int) -> dict[str, float]:
        """A bare generate of the same batch, one bare forward/backward/AdamW over the same rows."""
        model, dev, n = self.run.model, self.run.device, self.run.cfg.rollout.n
        pad = self.run.tokenizer.pad_token_id
        flat = [p for p in prompts for _ in range(n)]
        width = max(len(p) for p in flat)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in flat], device=dev)
        att = (torch.arange(width, device=dev)[None, :] >= torch.tensor([width - len(p) for p in flat], device=dev)[:, None]).long()
        dec = model.get_decoder()
        compiled_forward = dec.__dict__.pop("forward", None)  # train.torch_compile's: the floor is bare eager
        try:
            return self._bare(model, dev, ids, att, pad, rows, micro)
        finally:
            if compiled_forward is not None:
                dec.forward = compiled_forward

    def _bare(self, model, dev, ids, att, pad, rows, micro) -> dict[str, float]:
        model.eval()
        _sync(dev)
        t0 = time.perf_counter()
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=att, do_sample=True, top_k=0, max_new_tokens=self.tokens,
                           pad_token_id=pad)
        _sync(dev)
        t1 = time.perf_counter()
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-12)  # a real AdamW step that changes ~nothing
        for start in range(0, len(rows), micro):
            chunk = rows[start:start + micro]
            w = max(len(r) for r in chunk)
            x = torch.tensor([r + [pad] * (w - len(r)) for r in chunk], device=dev)
            logits = model(input_ids=x).logits[:, :-1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, x[:, 1:, None]).squeeze(-1)
            (-lp.mean() * len(chunk) / len(rows)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(dev)
        t2 = time.perf_counter()
        return {"gen": t1 - t0, "train": t2 - t1}

    def close(self) -> None:
        self.run.engine.close()


def run_cell(args: argparse.Namespace, width: int, n: int, tmp: Path) -> dict[str, Any]:
    from dapo_exp.hydra_setup import compose_config

    cfg = compose_config(overrides(width=width, n=n, prompts=args.prompts, tokens=args.tokens, micro=args.micro_batch,
                                   decode=args.decode, device=args.device, out=tmp / f"w{width}-n{n}",
                                   cache_dir=str(tmp / "cache"), train_compile=args.train_compile))
    cell = Cell(cfg, args.tokens)
    try:
        warm = [cell.step() for _ in range(args.warmup)]
        timed = [cell.step() for _ in range(args.steps)]
        floors = [cell.floor(s["rows"], s["prompts"], args.micro_batch) for s in timed]
        decode = getattr(cell.run.engine, "decode_used", cfg.rollout.engine)
    finally:
        cell.close()
    med = {k: statistics.median(s[k] for s in timed) for k in ("gen", "train")}
    fl = {k: statistics.median(f[k] for f in floors) for k in ("gen", "train")}
    tok = statistics.median(s["gen_tokens"] + s["trained_tokens"] for s in timed)
    step = med["gen"] + med["train"]
    return {"width": width, "params_M": cell.params / 1e6, "n": n, "responses": args.prompts * n, "decode": decode,
            "warmup_s": sum(w["gen"] + w["train"] for w in warm), "gen_s": med["gen"], "train_s": med["train"],
            "step_s": step, "floor_gen_s": fl["gen"], "floor_train_s": fl["train"], "floor_s": fl["gen"] + fl["train"],
            "tok_per_s": tok / step, "floor_tok_per_s": tok / (fl["gen"] + fl["train"])}


def markdown(rows: list[dict[str, Any]]) -> str:
    head = ("| params | responses/step | s/step | generation | training | floor s/step (generate + train) | "
            "step / floor | gen / floor gen | (gen+trained) tok/s | floor tok/s | warm-up (compile) s |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(
            f"| {r['params_M']:.2f}M | {r['responses']} | {r['step_s']:.3f} | {r['gen_s']:.3f} | {r['train_s']:.3f} | "
            f"{r['floor_s']:.3f} ({r['floor_gen_s']:.3f} + {r['floor_train_s']:.3f}) | {r['step_s'] / r['floor_s']:.2f} | "
            f"{r['gen_s'] / r['floor_gen_s']:.2f} | {r['tok_per_s']:.0f} | {r['floor_tok_per_s']:.0f} | "
            f"{r['warmup_s']:.1f} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m dapo_exp.benchmarks.scaling", description=__doc__.split("\n")[0])
    ap.add_argument("--widths", default="96,192,384", help="hidden sizes (96: the toy; x2 width = ~x4 params)")
    ap.add_argument("--responses", default="8,16,32", help="group sizes rollout.n (x 16 prompts per step)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per response, exactly")
    ap.add_argument("--micro-batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per cell")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per cell (the compile happens here)")
    ap.add_argument("--decode", default="auto", choices=DECODE_MODES,
                    help="rollout.decode (default auto: compiled on CUDA, fused on CPU)")
    ap.add_argument("--train-compile", action="store_true", help="train.torch_compile=true")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    args.widths = [int(w) for w in args.widths.split(",")]
    args.responses = [int(n) for n in args.responses.split(",")]
    if any(w % 3 for w in args.widths):
        ap.error("--widths must be multiples of 3 (3 attention heads)")
    if min(args.steps, args.warmup, args.prompts, args.tokens, args.micro_batch, *args.responses) < 1:
        ap.error("--steps, --warmup, --prompts, --tokens, --micro-batch and --responses must be >= 1")
    return args


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    from dapo_exp.rundir import git_commit

    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="scaling-") as tmp:
        for w in args.widths:
            for n in args.responses:
                rows.append(run_cell(args, w, n, Path(tmp)))
                r = rows[-1]
                print(f"width {w} ({r['params_M']:.2f}M) x {r['responses']} responses: {r['step_s']:.3f} s/step "
                      f"(gen {r['gen_s']:.3f}, train {r['train_s']:.3f}); floor {r['floor_s']:.3f}", flush=True)
    print(f"\n# scaling of a dapo-exp step ({datetime.datetime.now().isoformat(timespec='seconds')}, commit "
          f"{git_commit()}; {platform.platform()}, {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, "
          f"device {args.device}, torch {torch.__version__}; decode {rows[0]['decode']}, train.torch_compile "
          f"{str(args.train_compile).lower()}; {args.prompts} prompts x "
          f"group size, {args.tokens} tokens each, micro-batch {args.micro_batch}; median of {args.steps} steps)")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in before)}; after: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    print(markdown(rows))
    return rows


if __name__ == "__main__":
    main()
