"""Generation throughput: HF ``generate`` (HFEngine) vs vLLM (VLLMEngine), same prompts, same sampling.

    python -m dapo_exp.benchmarks.gen_throughput                     # both sizes, both engines
    python -m dapo_exp.benchmarks.gen_throughput --sizes 21M --prompts 32 --n 16 --max-new-tokens 128

For each model size (random-weight Qwen2 built in code, :mod:`dapo_exp.benchmarks.random_models`)
both engines sample ``--n`` responses for each of ``--prompts`` random prompts of
``--prompt-len`` tokens, temperature 1, top-p 1, up to ``--max-new-tokens`` tokens
(EOS ends a response early: the random models emit it with probability ~1/V per
token). One untimed warm-up call per engine, then ``--repeats`` timed calls; the
table reports generated tokens per second (tokens actually produced / wall time of
the ``generate`` call), best and mean. vLLM's start-up time and the time of
``sync_weights`` (push of the trainer's state_dict, in place) are reported too.

Run it on an idle machine: on a shared CPU the figures move with the load (the
load average is printed).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import statistics
import sys
import tempfile
import time


def _prompts(n_prompts: int, length: int, seed: int) -> list[list[int]]:
    import torch

    from dapo_exp.benchmarks.random_models import FIRST_CHAR_ID
    from dapo_exp.models import CHARS

    g = torch.Generator().manual_seed(seed)
    return torch.randint(FIRST_CHAR_ID, FIRST_CHAR_ID + len(CHARS), (n_prompts, length), generator=g).tolist()


def _time_engine(engine, prompts, spec_kwargs, repeats: int) -> dict[str, float]:
    from dapo_exp.rollout.engine import SamplingSpec

    engine.generate(prompts, SamplingSpec(seed=10_000, **spec_kwargs))  # warm-up
    rates, tokens = [], []
    for r in range(repeats):
        t0 = time.perf_counter()
        gens = engine.generate(prompts, SamplingSpec(seed=r, **spec_kwargs))
        dt = time.perf_counter() - t0
        n = sum(gens.lengths)
        rates.append(n / dt)
        tokens.append(n)
    return {"best": max(rates), "mean": statistics.mean(rates), "tokens": statistics.mean(tokens)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="0.4M,21M", help="comma-separated keys of random_models.SIZES")
    ap.add_argument("--engines", default="hf,vllm")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--vllm-cpu-threads", type=int, default=1, help="VLLMEngine(cpu_threads=...) on CPU")
    args = ap.parse_args(argv)

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import torch

    from dapo_exp.benchmarks.random_models import SIZES

    device = "cuda" if torch.cuda.is_available() else "cpu"
    engines = args.engines.split(",")
    spec = dict(n=args.n, max_new_tokens=args.max_new_tokens, temperature=1.0, top_p=1.0)
    prompts = _prompts(args.prompts, args.prompt_len, seed=0)
    rows = [_measure_size(key, SIZES[key], args, engines, prompts, spec, device) for key in args.sizes.split(",")]
    _report(rows, args, argv, device)


def _measure_size(key, size, args, engines, prompts, spec, device) -> dict:
    """Tokens/s of each engine (and vLLM's start-up and weight sync) on one random model size."""
    from dapo_exp.benchmarks.random_models import n_params, save_random_qwen2
    from dapo_exp.models import build_char_tokenizer

    with tempfile.TemporaryDirectory() as d:
        model = save_random_qwen2(d, size, seed=0, dtype=args.dtype).to(device)
        row = {"size": key, "params": n_params(model)}
        if "hf" in engines:
            from dapo_exp.rollout.hf.engine import HFEngine

            tok = build_char_tokenizer(size.vocab_size)
            hf = HFEngine(model, tok, gen_batch_size=len(prompts) * args.n)
            row["hf"] = _time_engine(hf, prompts, spec, args.repeats)
            del hf
        if "vllm" in engines:
            from dapo_exp.rollout.vllm_engine import VLLMEngine

            eng = VLLMEngine(
                d,
                seed=0,
                dtype=args.dtype,
                gpu_memory_utilization=0.3,
                enable_sleep=False,
                enforce_eager=True,
                max_model_len=args.prompt_len + args.max_new_tokens + 16,
                cpu_threads=args.vllm_cpu_threads,
            )
            row["vllm_startup_s"] = eng.startup_s
            row["vllm"] = _time_engine(eng, prompts, spec, args.repeats)
            syncs = []
            for _ in range(5):
                eng.sync_weights(model)
                syncs.append(eng.last_sync_ms)
            row["sync_ms"] = statistics.median(syncs)
            del eng
            gc.collect()
        del model
    return row


def _report(rows: list[dict], args, argv, device) -> None:
    import torch

    print()
    print(f"# gen_throughput  {datetime.datetime.now().isoformat(timespec='seconds')}")
    cli = " ".join(argv if argv is not None else sys.argv[1:])
    print(f"# command: python -m dapo_exp.benchmarks.gen_throughput {cli}")
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",)
    print(
        f"# machine: {platform.platform()}, {device}, {os.cpu_count()} CPUs, torch threads "
        f"{torch.get_num_threads()}, load avg {load[0]:.2f}; torch {torch.__version__}"
    )
    print(
        f"# workload: {args.prompts} prompts x n={args.n}, prompt {args.prompt_len} tokens, "
        f"<= {args.max_new_tokens} new tokens, T=1, top_p=1, {args.dtype}, best/mean of {args.repeats}; "
        f"vLLM CPU threads {args.vllm_cpu_threads}"
    )
    print()
    print(
        "| model | params | HF tok/s (best / mean) | vLLM tok/s (best / mean) | vLLM / HF "
        "| vLLM start-up s | sync_weights ms |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        hf, vl = r.get("hf"), r.get("vllm")
        ratio = f"{vl['best'] / hf['best']:.2f}x" if hf and vl else "-"
        hf_s = f"{hf['best']:.0f} / {hf['mean']:.0f}" if hf else "-"
        vl_s = f"{vl['best']:.0f} / {vl['mean']:.0f}" if vl else "-"
        startup, sync = r.get("vllm_startup_s", float("nan")), r.get("sync_ms", float("nan"))
        print(f"| {r['size']} | {r['params'] / 1e6:.2f}M | {hf_s} | {vl_s} | {ratio} | {startup:.1f} | {sync:.1f} |")


if __name__ == "__main__":
    main()
