"""Benchmark: the trainer's update step (log-probs + clipped loss + backward + AdamW).

Builds a random-weight Qwen2 of a named shape in memory (nothing downloaded),
feeds it random ``prompt + response`` rows exactly as the training loop does
(``dapo_exp.logprobs.ResponseForward`` + ``dapo_exp.objective.policy_loss``) and
prints training tokens/s, peak memory and, on CUDA, model FLOPs utilisation
(MFU = 6 * params * tokens/s / peak bf16 FLOP/s; attention FLOPs not counted).

    python -m dapo_exp.benchmarks.trainer_throughput --shape 0.4M --batch 16 --prompt 32 --response 64
    python -m dapo_exp.benchmarks.trainer_throughput --shape qwen2.5-0.5b --batch 8 --prompt 256 --response 1024  # GPU
    python -m dapo_exp.benchmarks.trainer_throughput --batch 32 --prompt 13 --group 8 --share-prompts

``--group G`` repeats each prompt over G consecutive rows (a GRPO group; default 1: every row
its own prompt); ``--share-prompts`` runs each distinct prompt once per micro-batch
(``train.share_prompt_forward``). Tokens/s counts every row's prompt and response either way.

Peak memory: ``torch.cuda.max_memory_allocated`` on CUDA; on CPU the growth of the
process's peak resident set (``ru_maxrss``) during the timed steps.
"""

from __future__ import annotations

import argparse
import datetime
import resource
import time

import torch

from dapo_exp import objective

SHAPES = {
    # hidden, layers, heads, kv heads, intermediate, vocab
    "0.4M": (96, 3, 3, 1, 288, 80),
    "21M": (512, 6, 8, 2, 1376, 4096),
    "qwen2.5-0.5b": (896, 24, 14, 2, 4864, 151936),
}
PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}


def build(shape: str, device: torch.device):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    h, n_layers, heads, kv, inter, vocab = SHAPES[shape]
    cfg = Qwen2Config(hidden_size=h, num_hidden_layers=n_layers, num_attention_heads=heads, num_key_value_heads=kv,
                      intermediate_size=inter, vocab_size=vocab, max_position_embeddings=32768,
                      tie_word_embeddings=shape == "qwen2.5-0.5b")
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).to(device)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="0.4M", choices=sorted(SHAPES))
    ap.add_argument("--batch", type=int, default=16, help="rows per micro-batch")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--response", type=int, default=64)
    ap.add_argument("--steps", type=int, default=5, help="timed steps (after one warm-up step)")
    ap.add_argument("--chunk", type=int, default=1024, help="train.logprob_chunk")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--grad-ckpt", action="store_true")
    ap.add_argument("--group", type=int, default=1, help="rows per distinct prompt (must divide --batch)")
    ap.add_argument("--share-prompts", action="store_true", help="train.share_prompt_forward=true")
    args = ap.parse_args(argv)
    if args.group < 1 or args.batch % args.group:
        ap.error(f"--group {args.group} must be >= 1 and divide --batch {args.batch}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    model = build(args.shape, device)
    if args.grad_ckpt:
        model.gradient_checkpointing_enable()
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = [p for _ in range(args.batch // args.group)
               for p in [torch.randint(2, vocab, (args.prompt,), generator=g).tolist()] * args.group]
    responses = [torch.randint(2, vocab, (args.response,), generator=g).tolist() for _ in range(args.batch)]
    from functools import partial

    from dapo_exp.logprobs import ResponseForward

    fwd = ResponseForward(0, device, args.chunk, 1.0, torch.bfloat16 if device.type == "cuda" else None,
                          share_prompts=args.share_prompts)
    surrogate = partial(objective.clipped_surrogate, eps_low=0.2, eps_high=0.28)

    def step() -> None:
        with torch.no_grad():
            old, _, mask = fwd(model, prompts, responses, with_entropy=True)
        adv = torch.randn(args.batch, 1, device=device)
        w = objective.loss_normaliser(mask, "token-mean")
        lp, _, _ = fwd(model, prompts, responses)
        loss, _ = objective.policy_loss(logp=lp, old_logp=old, advantages=adv, mask=mask, weights=w,
                                        surrogate=surrogate)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # warm-up (allocations, kernels)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    report(args, device, n_params, args.steps * args.batch * (args.prompt + args.response) / secs, rss0)


def report(args: argparse.Namespace, device: torch.device, n_params: int, tps: float, rss0: int) -> None:
    """The result as a markdown row, with the command that made it."""
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated() / 2**30
        name = torch.cuda.get_device_name()
        peak_flops = next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)
        # forward (old log-probs, no grad) + forward and backward of the update: 2 + 6 = 8 N FLOPs per token
        mfu = 8 * n_params * tps / peak_flops if peak_flops else float("nan")
        mem = f"{peak:.2f} GiB (max allocated)"
    else:
        name = "CPU"
        mem = f"+{(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 2**20:.3f} GiB peak RSS growth"
        mfu = float("nan")
    print(f"# trainer throughput, {datetime.date.today()}, {name}, torch {torch.__version__}, "
          f"threads {torch.get_num_threads()}")
    print(f"# command: python -m dapo_exp.benchmarks.trainer_throughput --shape {args.shape} --batch {args.batch} "
          f"--prompt {args.prompt} --response {args.response} --steps {args.steps} --chunk {args.chunk}"
          f"{' --grad-ckpt' if args.grad_ckpt else ''} --group {args.group}{' --share-prompts' if args.share_prompts else ''}")
    print("| shape | params | rows x (prompt + response) | tokens/s (old logp + update) | peak memory | MFU |")
    print("|---|---|---|---|---|---|")
    print(f"| {args.shape} | {n_params / 1e6:.1f}M | {args.batch} x ({args.prompt} + {args.response}) | "
          f"{tps:,.0f} | {mem} | {'n/a' if mfu != mfu else f'{mfu:.1%}'} |")


if __name__ == "__main__":
    main()
