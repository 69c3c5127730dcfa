"""Chunked per-token log-probs/entropy (dapo_exp.logprobs) against the naive full-logits reference.

Exactness runs in float64; the memory test reads the CPU allocator's timeline from
``torch.profiler`` (deterministic: the same ops allocate the same bytes every run).
"""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from dapo_exp.logprobs import naive_token_logprobs, rows_to_tensors, token_logprobs

LENGTHS = [13, 9, 4]  # unequal, right-padded to 13
V = 97


def tiny_qwen2(vocab=V, hidden=32, layers=2, dtype=torch.float64, seed=0):
    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg).to(dtype)


def batch(lengths=LENGTHS, vocab=V, seed=1):
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(2, vocab, (n,), generator=g)
        attn[i, :n] = 1
    return ids, attn


@pytest.fixture(scope="module")
def model():
    return tiny_qwen2().eval()


@pytest.mark.parametrize("chunk", [1, 3, 5, 12, 13, 100])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_equals_naive_values(model, chunk, temperature):
    ids, attn = batch()
    with torch.no_grad():
        lp, en = token_logprobs(model, ids, attn, chunk=chunk, with_entropy=True, temperature=temperature)
        ref_lp, ref_en = naive_token_logprobs(model, ids, attn, temperature=temperature)
    assert lp.shape == en.shape == (len(LENGTHS), max(LENGTHS) - 1)
    assert lp.dtype == torch.float64
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-12)
    torch.testing.assert_close(en, ref_en, rtol=0, atol=1e-12)


def test_entropy_is_zeros_when_not_asked(model):
    ids, attn = batch()
    with torch.no_grad():
        _, en = token_logprobs(model, ids, attn, chunk=4)
    assert torch.count_nonzero(en) == 0


@pytest.mark.parametrize("chunk", [1, 5, 100])
def test_chunked_equals_naive_gradients(chunk):
    ids, attn = batch()
    valid = attn[:, 1:].double()  # position t scores token t + 1: real iff token t + 1 is real
    g = torch.Generator().manual_seed(7)
    w_lp, w_en = torch.randn(valid.shape, generator=g, dtype=torch.float64), torch.randn(valid.shape, generator=g)

    def grads(fn):
        m = tiny_qwen2()
        lp, en = fn(m)
        ((lp * w_lp * valid).sum() + (en * w_en.double() * valid).sum()).backward()
        return {k: p.grad.clone() for k, p in m.named_parameters()}

    got = grads(lambda m: token_logprobs(m, ids, attn, chunk=chunk, with_entropy=True, temperature=0.8))
    ref = grads(lambda m: naive_token_logprobs(m, ids, attn, temperature=0.8))
    assert got.keys() == ref.keys()
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-9, atol=1e-12, msg=k)


def test_padded_row_equals_the_row_alone(model):
    """Position ids and the attention mask: padding changes nothing on a row's real tokens."""
    ids, attn = batch()
    with torch.no_grad():
        lp, _ = token_logprobs(model, ids, attn, chunk=4)
        for i, n in enumerate(LENGTHS):
            alone, _ = token_logprobs(model, ids[i : i + 1, :n], attn[i : i + 1, :n], chunk=4)
            torch.testing.assert_close(lp[i, : n - 1], alone[0], rtol=0, atol=1e-12)


def test_bf16_autocast_is_close_and_float32(model):
    m = tiny_qwen2(dtype=torch.float32).eval()
    ids, attn = batch()
    with torch.no_grad():
        ref, ref_en = token_logprobs(m, ids, attn, chunk=5, with_entropy=True)
        lp, en = token_logprobs(m, ids, attn, chunk=5, with_entropy=True, autocast_dtype=torch.bfloat16)
    assert lp.dtype == en.dtype == torch.float32
    assert (lp - ref).abs().max() < 0.05 and (en - ref_en).abs().max() < 0.05
    # and it trains: the grad reaches the weights through the checkpointed chunks
    lp, _ = token_logprobs(m, ids, attn, chunk=5, autocast_dtype=torch.bfloat16)
    lp.sum().backward()
    assert m.lm_head.weight.grad is not None and torch.isfinite(m.lm_head.weight.grad).all()


def test_refuses_models_that_post_process_logits():
    m = tiny_qwen2(dtype=torch.float32)
    m.config.final_logit_softcapping = 30.0
    ids, attn = batch()
    with pytest.raises(NotImplementedError, match="soft-capping"):
        token_logprobs(m, ids, attn)


# --------------------------------------------------------------------------- #
# Memory: one chunk of logits at a time                                         #
# --------------------------------------------------------------------------- #
def _peak_cpu_bytes(fn) -> int:
    """Peak of live CPU bytes allocated inside ``fn``, from the profiler's allocation events.

    Each op's net allocation (``self_cpu_memory_usage``: allocations minus frees) and
    each unattributed ``[memory]`` event is placed at its start time; the peak of the
    running sum is the high-water mark at op granularity.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    points = []
    for e in prof.events():
        delta = e.cpu_memory_usage if e.name == "[memory]" else e.self_cpu_memory_usage
        if delta:
            points.append((e.time_range.start, delta))
    live = peak = 0
    for _, delta in sorted(points):
        live += delta
        peak = max(peak, live)
    return peak


def test_chunked_peak_memory_below_one_full_logits_tensor():
    vocab, b, length = 8192, 4, 257  # naive logits: 4 x 256 x 8192 float32 = 32 MiB
    m = tiny_qwen2(vocab=vocab, hidden=32, layers=1, dtype=torch.float32)
    ids, attn = batch([length] * b, vocab=vocab)
    logits_bytes = b * (length - 1) * vocab * 4

    def step(fn):
        def run():
            m.zero_grad(set_to_none=True)
            lp, en = fn()
            (lp.sum() + en.sum()).backward()

        return run

    step(lambda: token_logprobs(m, ids, attn, chunk=16, with_entropy=True))()  # warm-up: lazy inits
    chunked = _peak_cpu_bytes(step(lambda: token_logprobs(m, ids, attn, chunk=16, with_entropy=True)))
    naive = _peak_cpu_bytes(step(lambda: naive_token_logprobs(m, ids, attn)))
    assert naive > 2 * logits_bytes, f"the reference should hold several full logits tensors: {naive / 2**20:.1f} MiB"
    assert chunked < logits_bytes / 2, (
        f"chunked peak {chunked / 2**20:.1f} MiB should stay well below one (B, L, V) float32 tensor "
        f"({logits_bytes / 2**20:.1f} MiB); naive peak {naive / 2**20:.1f} MiB"
    )


@pytest.mark.parametrize("ckpt_min_bytes", [0, 2**40])  # every chunk checkpointed / none
def test_gradients_equal_naive_with_and_without_checkpointing(monkeypatch, ckpt_min_bytes):
    import dapo_exp.logprobs as L

    monkeypatch.setattr(L, "CKPT_MIN_BYTES", ckpt_min_bytes)
    ids, attn = batch()
    g = torch.Generator().manual_seed(3)
    w = torch.randn(attn[:, 1:].shape, generator=g, dtype=torch.float64)

    def grads(fn):
        m = tiny_qwen2()
        lp, _ = fn(m)
        (lp * w * attn[:, 1:].double()).sum().backward()
        return {k: p.grad.clone() for k, p in m.named_parameters()}

    got = grads(lambda m: token_logprobs(m, ids, attn, chunk=3, temperature=0.9))
    ref = grads(lambda m: naive_token_logprobs(m, ids, attn, temperature=0.9))
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-9, atol=1e-12, msg=k)


def test_start_projects_only_the_positions_from_start():
    ids, attn = batch()
    m = tiny_qwen2()
    full_lp, full_en = token_logprobs(m, ids, attn, chunk=4, with_entropy=True)
    for start in (1, 5):
        lp, en = token_logprobs(m, ids, attn, chunk=4, with_entropy=True, start=start)
        assert lp.shape == (ids.shape[0], ids.shape[1] - 1 - start)
        torch.testing.assert_close(lp, full_lp[:, start:], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(en, full_en[:, start:], rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- #
# Shared prompt forward (train.share_prompt_forward)                            #
# --------------------------------------------------------------------------- #
def _groups(seed=5):
    """3 prompts of unequal lengths x 4 responses each, ragged (one empty), group-major."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for plen in (5, 2, 7):
        p = torch.randint(2, V, (plen,), generator=g).tolist()
        for j in range(4):
            prompts.append(p)
            n = 0 if (plen, j) == (2, 1) else int(torch.randint(1, 9, (1,), generator=g))
            responses.append(torch.randint(2, V, (n,), generator=g).tolist())
    return prompts, responses


def _scored(share, m, prompts, responses, w=None):
    from dapo_exp.logprobs import ResponseForward

    m.zero_grad()
    fwd = ResponseForward(pad_id=0, device=torch.device("cpu"), chunk=3, temperature=0.9, share_prompts=share)
    lp, en, mask = fwd(m, prompts, responses, with_entropy=True)
    if w is None:
        w = torch.randn(lp.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    (lp.double() * w * mask).sum().backward()
    return lp.double() * mask, en.double() * mask, {k: p.grad.clone() for k, p in m.named_parameters()}


def tiny_qwen3(seed=0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, max_position_embeddings=512, tie_word_embeddings=False)
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(cfg).to(torch.float64)


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_shared_prompt_forward_equals_full_rows(family, monkeypatch):
    """Same log-probs, entropy and gradients as scoring every [prompt | response] row in full."""
    import dapo_exp.logprobs as L

    calls = []
    real = L.shared_prompt_logprobs
    monkeypatch.setattr(L, "shared_prompt_logprobs", lambda *a, **k: calls.append(1) or real(*a, **k))
    prompts, responses = _groups()
    m = tiny_qwen2(layers=2) if family == "qwen2" else tiny_qwen3()
    lp, en, grads = _scored(True, m, prompts, responses)
    lp0, en0, grads0 = _scored(False, m, prompts, responses)
    assert calls == [1]  # the shared path ran (once), the full rows did not use it
    torch.testing.assert_close(lp, lp0, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(en, en0, rtol=1e-12, atol=1e-12)
    # transformers' RMSNorm computes in float32 even in a float64 model, so a group's summed
    # gradient is rounded once where the full rows round each row: float32 rounding, no more
    for k in grads0:
        torch.testing.assert_close(grads[k], grads0[k], rtol=1e-5, atol=1e-6, msg=k)
    assert any(g.abs().max() > 1e-3 for g in grads0.values())


def test_shared_prompt_forward_without_repeats_is_exact():
    """Each row its own prompt (no group sum): the two ways agree to float64 rounding."""
    from dapo_exp.logprobs import shared_prompt_logprobs, shared_prompt_tensors

    prompts, responses = _groups()
    m = tiny_qwen2(layers=2)
    p_ids, p_att, row_prompt, r_ids, r_att, rmask = shared_prompt_tensors(prompts, responses, 0)
    assert p_ids.shape[0] == 3 and row_prompt.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    w = torch.randn(rmask.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)

    def grads(fn):
        m.zero_grad()
        lp, en = fn()
        (lp * w * rmask).sum().backward()
        return lp * rmask, {k: p.grad.clone() for k, p in m.named_parameters()}

    got_lp, got = grads(lambda: shared_prompt_logprobs(m, p_ids[row_prompt], p_att[row_prompt],
                                                       torch.arange(len(prompts)), r_ids, r_att, chunk=3))
    ids, att, _, width_p = rows_to_tensors(prompts, responses, 0)
    ref_lp, ref = grads(lambda: token_logprobs(m, ids, att, chunk=3, start=width_p - 1))
    torch.testing.assert_close(got_lp, ref_lp, rtol=1e-12, atol=1e-12)
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-9, atol=1e-12, msg=k)


def test_shared_prompt_forward_is_used_only_where_it_applies(monkeypatch):
    import dapo_exp.logprobs as L

    calls = []
    real = L.shared_prompt_logprobs
    monkeypatch.setattr(L, "shared_prompt_logprobs", lambda *a, **k: calls.append(1) or real(*a, **k))
    prompts, responses = _groups()
    m = tiny_qwen2(layers=1)
    fwd = L.ResponseForward(pad_id=0, device=torch.device("cpu"), share_prompts=True)
    fwd(m, prompts, responses)
    assert calls == [1]
    fwd(m, [p + [i] for i, p in enumerate(prompts)], responses)  # no prompt repeats: nothing to share
    L.ResponseForward(pad_id=0, device=torch.device("cpu"))(m, prompts, responses)  # switched off
    m.gradient_checkpointing_enable()  # transformers drops the cache under checkpointing in training
    assert not L.can_share_prompts(m)
    fwd(m.train(), prompts, responses)
    assert calls == [1]
    m.gradient_checkpointing_disable()
    # a micro-batch where a single prompt repeats (groups scattered by train.token_budget): not worth it
    fwd(m, [prompts[0]] + [p + [i] for i, p in enumerate(prompts[1:])], responses)
    assert calls == [1]
    m.config.attention_dropout = 0.1  # one dropout draw per prompt would correlate a group's noise
    assert not L.can_share_prompts(m.train()) and L.can_share_prompts(m.eval())
    m.config.attention_dropout = 0.0
    remote = tiny_qwen2(layers=1)  # remote code declaring the family: not transformers' own layer
    remote.__class__ = type("RemoteQwen2", (type(remote),), {"__module__": __name__})
    assert not L.can_share_prompts(remote)
    m.config.use_sliding_window = True
    assert not L.can_share_prompts(m)


def test_trainer_throughput_benchmark_runs_with_shared_prompts(capsys):
    from dapo_exp.benchmarks import trainer_throughput

    trainer_throughput.main(["--batch", "8", "--prompt", "5", "--response", "6", "--group", "4", "--steps", "1",
                             "--share-prompts"])
    out = capsys.readouterr().out
    assert "--group 4 --share-prompts" in out and "| 0.4M | 0.3M | 8 x (5 + 6) |" in out
    with pytest.raises(SystemExit):
        trainer_throughput.parse_args(["--batch", "8", "--group", "3"])
