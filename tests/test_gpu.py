"""GPU checks; they skip with a reason on machines without CUDA (CI has none)."""

import json

import pytest
import torch

from dapo_exp import rundir

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none on this machine)"),
]


def test_toy_run_on_cuda_with_bf16_autocast_and_token_budget(tmp_path, small_cfg):
    from dapo_exp.train import train

    s = train(small_cfg(tmp_path, "train.device=cuda", "train.bf16=auto", "train.token_budget=256"))
    assert s["status"] == "finished"
    rows = [json.loads(x) for x in (tmp_path / rundir.METRICS).read_text().splitlines()]
    assert all(0.0 <= r["perf/padding_waste"] < 1.0 for r in rows if "perf/padding_waste" in r)
    # the step's peak GPU memory is logged on CUDA (allocated <= reserved)
    assert all(0.0 < r["perf/gpu_mem_peak_gib"] <= r["perf/gpu_mem_reserved_gib"] for r in rows if "timing_s/step" in r)


def test_chunked_logprobs_peak_memory_on_cuda():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from dapo_exp.logprobs import naive_token_logprobs, token_logprobs

    cfg = Qwen2Config(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=256, vocab_size=50_000)
    model = Qwen2ForCausalLM(cfg).cuda()
    ids = torch.randint(0, 50_000, (4, 512), device="cuda")
    att = torch.ones_like(ids)
    full = 4 * 511 * 50_000 * 4  # bytes of the float32 [B, L, V] log-softmax
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    lp, ent = token_logprobs(model, ids, att, chunk=64, with_entropy=True)
    chunked_peak = torch.cuda.max_memory_allocated() - base
    ref_lp, ref_ent = naive_token_logprobs(model, ids, att)
    assert torch.allclose(lp, ref_lp, atol=1e-4) and torch.allclose(ent, ref_ent, atol=1e-3)
    assert chunked_peak < full


def test_compiled_decode_with_cuda_graphs_samples_what_eager_samples():
    """rollout.decode=compiled on CUDA (torch.compile mode reduce-overhead: CUDA graphs) against the eager loop."""
    from dapo_exp.models import build_char_tokenizer, build_tiny_model
    from dapo_exp.rollout.engine import SamplingSpec
    from dapo_exp.rollout.hf.engine import HFEngine

    tok = build_char_tokenizer()
    model = build_tiny_model(tok, hidden_size=96, num_layers=3, num_heads=3, seed=0).cuda().eval()
    prompts = [tok(t)["input_ids"] for t in ("3+4=", "12+7+1=", "9=", "5+5+5+5+5=")]
    out = {}
    for decode in ("static", "compiled"):
        eng = HFEngine(model, tok, gen_batch_size=256, decode=decode)
        spec = SamplingSpec(n=8, max_new_tokens=40, temperature=0.9, top_p=0.95, seed=3)
        out[decode] = [eng.generate(prompts, spec).response_ids for _ in range(2)]  # the 2nd call replays the graphs
        assert eng.decode_used == decode
    assert out["compiled"][0] == out["static"][0] and out["compiled"][1] == out["static"][0]
    # the generate path agrees with both when nothing is padded (32 rows)
    ref = HFEngine(model, tok, gen_batch_size=256, decode="generate").generate(prompts, spec).response_ids
    agree = sum(a == b for a, b in zip(ref, out["static"][0])) / len(ref)
    assert agree >= 0.9  # CUDA kernels may round differently between the two cache layouts; most rows identical


def test_fused_decode_and_shared_prompt_forward_on_cuda():
    """rollout.decode=fused and train.share_prompt_forward on CUDA, against generate and full rows."""
    from dapo_exp.logprobs import ResponseForward
    from dapo_exp.models import build_char_tokenizer, build_tiny_model
    from dapo_exp.rollout.engine import SamplingSpec
    from dapo_exp.rollout.hf.engine import HFEngine

    tok = build_char_tokenizer()
    model = build_tiny_model(tok, hidden_size=96, num_layers=3, num_heads=3, seed=0).cuda().eval()
    prompts = [tok(t)["input_ids"] for t in ("3+4=", "12+7+1=", "9=", "5+5+5+5+5=")]
    spec = SamplingSpec(n=8, max_new_tokens=40, temperature=0.9, top_p=0.95, seed=3)
    eng = HFEngine(model, tok, gen_batch_size=256, decode="fused")
    got = eng.generate(prompts, spec)
    assert eng.decode_used == "fused"
    ref = HFEngine(model, tok, gen_batch_size=256, decode="generate").generate(prompts, spec)
    agree = sum(a == b for a, b in zip(ref.response_ids, got.response_ids)) / len(ref.response_ids)
    assert agree >= 0.9  # CUDA kernels round the two paths differently; most rows identical
    rows = [p for p in prompts for _ in range(8)]
    def forward(dtype, share):
        model.zero_grad()
        fwd = ResponseForward(tok.pad_token_id, torch.device("cuda"), autocast_dtype=dtype, share_prompts=share)
        lp, en, mask = fwd(model, rows, got.response_ids, with_entropy=True)
        (lp * mask).sum().backward()
        grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        return (lp * mask).detach(), (en * mask).detach(), grad.detach()

    def rel(a, b):
        return ((a - b).norm() / b.norm()).item()

    full32, shared32 = forward(None, False), forward(None, True)
    for a, b in zip(shared32, full32):  # float32: the same numbers up to float32 rounding
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)
    # bf16 autocast, as CUDA trains: log-probs and entropy agree elementwise; the gradients are sums of
    # bf16 products taken in another order, so they are compared as a whole, against bf16's own error
    # (the full rows in bf16 against float32): sharing the prompt must add less than that
    full16, shared16 = forward(torch.bfloat16, False), forward(torch.bfloat16, True)
    for a, b in zip(shared16[:2], full16[:2]):
        assert torch.allclose(a, b, atol=5e-2, rtol=5e-2)
    bf16_error = rel(full16[2], full32[2])
    assert rel(shared16[2], full16[2]) < bf16_error, (rel(shared16[2], full16[2]), bf16_error)


def test_keyed_noise_on_cuda_is_the_cpus_and_every_decode_path_draws_the_same_tokens():
    """train.randomness=keyed on CUDA: the integer hash gives the CPU's uniforms exactly, the compiled
    Gumbel kernel the eager one's noise, and the compiled (CUDA graphs), static and fused decodes draw
    the same tokens for the same keys (most rows: CUDA kernels may round logits differently)."""
    from dapo_exp import keyed
    from dapo_exp.models import build_char_tokenizer, build_tiny_model
    from dapo_exp.rollout.engine import SamplingSpec
    from dapo_exp.rollout.hf.engine import HFEngine

    keys = keyed.keys_tensor([keyed.derive("t", i) for i in range(64)])
    u_cpu = keyed.uniforms(keys, 7, 50_000)
    u_gpu = keyed.uniforms(keys.cuda(), 7, 50_000)
    assert torch.equal(u_gpu.cpu(), u_cpu)
    g_gpu = keyed.gumbel(keys.cuda(), 7, 50_000)  # torch.compile-d on CUDA
    torch.testing.assert_close(g_gpu.cpu(), keyed._gumbel_eager(keys, torch.full_like(keys, 7), 50_000))

    tok = build_char_tokenizer()
    model = build_tiny_model(tok, hidden_size=96, num_layers=3, num_heads=3, seed=0).cuda().eval()
    prompts = [tok(t)["input_ids"] for t in ("3+4=", "12+7+1=", "9=", "5+5+5+5+5=")]
    spec = SamplingSpec(n=8, max_new_tokens=40, temperature=0.9, top_p=0.95, seed=3,
                        keys=[keyed.derive("p", i) for i in range(len(prompts))])
    out = {d: HFEngine(model, tok, gen_batch_size=256, decode=d).generate(prompts, spec).response_ids
           for d in ("static", "fused", "compiled")}
    for d in ("fused", "compiled"):
        agree = sum(a == b for a, b in zip(out[d], out["static"])) / len(out["static"])
        assert agree >= 0.9, (d, agree)
