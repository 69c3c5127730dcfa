"""Keyed randomness (train.randomness=keyed): the draws follow the warped softmax on every decode
path, the keys are a pure function of their purpose, and the default stream is untouched."""

import shutil

import numpy as np
import pytest
import torch
from scipy import stats

from dapo_exp import keyed
from dapo_exp.build import PromptSampler
from dapo_exp.models import build_char_tokenizer, build_tiny_model
from dapo_exp.rollout.engine import SamplingSpec
from dapo_exp.rollout.hf.engine import HFEngine
from dapo_exp.rollout.hf.static_decode import warp

P_MIN = 1e-3  # the keys are fixed, so each test's p-value is a fixed number, not a flaky one
HAS_CXX = shutil.which("g++") is not None or shutil.which("c++") is not None
DECODES = ["generate", "static", "fused", pytest.param("compiled", marks=pytest.mark.skipif(
    not HAS_CXX, reason="torch.compile's CPU backend (inductor) needs a C++ compiler"))]
WARPS = [{"temperature": 1.0, "top_p": 1.0}, {"temperature": 0.7, "top_p": 0.8}]


def chi2_p(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square goodness of fit of ``counts`` to ``probs``; bins expected under 5 draws are pooled,
    and a draw of a zero-probability token fails outright."""
    n = counts.sum()
    assert counts[probs == 0].sum() == 0, "a token outside the warped support was drawn"
    exp = probs * n
    big = exp >= 5
    obs_b, exp_b = list(counts[big]), list(exp[big])
    if (~big & (probs > 0)).any():
        obs_b.append(counts[~big].sum())
        exp_b.append(exp[~big].sum())
    return float(stats.chisquare(obs_b, np.asarray(exp_b) * sum(obs_b) / sum(exp_b)).pvalue)


@pytest.fixture(scope="module")
def tiny():
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, seed=0).eval()
    return model, tok


def test_keys_are_distinct_per_purpose_and_stable():
    assert keyed.derive("a", 1, 2) == keyed.derive("a", 1, 2)
    assert keyed.derive("a", 1, 2) != keyed.derive("a", 12)  # the tuple, not its concatenation
    assert keyed.derive(1) != keyed.derive("1")
    ev = set(keyed.eval_sample_keys(0, 64))
    tr = {k for s in range(1, 31) for r in range(3) for k in keyed.train_sample_keys(0, s, r, range(64))}
    assert len(ev) == 64 and len(tr) == 30 * 3 * 64 and not ev & tr
    assert set(keyed.eval_sample_keys(0, 64, replica=1)).isdisjoint(ev)
    assert set(keyed.eval_sample_keys(1, 64)).isdisjoint(ev)
    rows = keyed.row_keys(list(ev) + list(tr), 16)
    assert len(set(rows)) == len(rows)


def test_uniforms_are_uniform_and_independent_across_rows_positions_and_tokens():
    keys = keyed.keys_tensor(keyed.row_keys([keyed.derive("t", 0)], 4000))
    u0, u1 = keyed.uniforms(keys, 0, 50), keyed.uniforms(keys, 1, 50)
    assert ((u0 > 0) & (u0 < 1)).all()
    # 200,000 uniforms in 20 bins
    assert stats.chisquare(np.histogram(u0.numpy().ravel(), 20, (0, 1))[0]).pvalue > P_MIN
    # no correlation between positions, neighbouring tokens, neighbouring rows
    for a, b in ((u0, u1), (u0[:, :-1], u0[:, 1:]), (u0[:-1], u0[1:])):
        r = np.corrcoef(a.numpy().ravel(), b.numpy().ravel())[0, 1]
        assert abs(r) < 4 / np.sqrt(a.numel())
    # same key, same numbers, on any batch composition
    assert torch.equal(keyed.uniforms(keys[7:9], 3, 50), keyed.uniforms(keys, 3, 50)[7:9])


@pytest.mark.parametrize("warp_kw", WARPS)
def test_gumbel_argmax_follows_the_warped_softmax_at_every_position(warp_kw):
    torch.manual_seed(0)
    logits = torch.randn(1, 12) * 1.5
    scores = warp(logits, warp_kw["temperature"], warp_kw["top_p"])
    probs = torch.softmax(scores, -1)[0].double().numpy()
    keys = keyed.keys_tensor(keyed.row_keys([keyed.derive("g", 1)], 12000))
    draws = {}
    for pos in (0, 1, 37):
        tok = keyed.gumbel_argmax(scores.expand(len(keys), -1), keys, pos).numpy()
        assert chi2_p(np.bincount(tok, minlength=12), probs) > P_MIN
        draws[pos] = tok
    # positions are independent: the joint of two positions' tokens is the product of the marginals
    # (tokens outside the 5 most likely pooled, so that no cell expects fewer than 5 draws)
    top = np.argsort(-probs)[:5]
    pooled = {pos: np.where(np.isin(d, top), d, 12) for pos, d in draws.items()}
    for later in (1, 37):
        table = np.zeros((13, 13))
        np.add.at(table, (pooled[0], pooled[later]), 1)
        table = table[table.sum(1) > 0][:, table.sum(0) > 0]
        assert stats.chi2_contingency(table).pvalue > P_MIN


def _first_token_probs(model, prompt, temperature, top_p):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt])).logits[:, -1]
    return torch.softmax(warp(logits, temperature, top_p), -1)[0].double().numpy()


@pytest.mark.parametrize("decode", DECODES)
@pytest.mark.parametrize("warp_kw", WARPS)
def test_keyed_draws_follow_the_warped_softmax_on_every_decode_path(tiny, decode, warp_kw):
    model, tok = tiny
    prompt = tok("12+7+1=")["input_ids"]
    probs = _first_token_probs(model, prompt, **warp_kw)
    eng = HFEngine(model, tok, gen_batch_size=4096, decode=decode)
    assert eng.decode_used == decode
    n = 4096
    g = eng.generate([prompt], SamplingSpec(n=n, max_new_tokens=1, keys=[keyed.derive("test", decode)], **warp_kw))
    first = np.array([r[0] for r in g.response_ids])
    assert chi2_p(np.bincount(first, minlength=len(probs)), probs) > P_MIN
    eng.close()


@pytest.mark.parametrize("warp_kw", WARPS)
def test_every_decode_path_draws_the_same_tokens_for_the_same_keys(tiny, warp_kw):
    model, tok = tiny
    prompts = [tok(t)["input_ids"] for t in ("3+4=", "12+7+1=", "9=")]  # 3 x 5 = 15 rows: padded by static
    spec = SamplingSpec(n=5, max_new_tokens=20, keys=[11, 22, 33], **warp_kw)
    ref = HFEngine(model, tok, decode="generate").generate(prompts, spec)
    assert 0 < sum(ref.truncated) < len(ref.truncated)
    for decode in ("static", "fused"):
        assert HFEngine(model, tok, decode=decode).generate(prompts, spec).response_ids == ref.response_ids
    # chunking, the batch's other rows and the global stream change nothing
    torch.manual_seed(123)
    small = HFEngine(model, tok, gen_batch_size=4, decode="fused").generate(prompts, spec)
    assert small.response_ids == ref.response_ids
    alone = HFEngine(model, tok, decode="fused").generate(prompts[1:2], SamplingSpec(
        n=5, max_new_tokens=20, keys=[22], **warp_kw))
    assert alone.response_ids == ref.response_ids[5:10]
    other = HFEngine(model, tok, decode="fused").generate(prompts, SamplingSpec(
        n=5, max_new_tokens=20, keys=[11, 22, 34], **warp_kw))
    assert other.response_ids[:10] == ref.response_ids[:10] and other.response_ids[10:] != ref.response_ids[10:]


def test_stream_mode_is_unchanged_by_the_keyed_code(tiny):
    """keys=None samples from the seeded torch stream exactly as before (multinomial per step)."""
    model, tok = tiny
    prompts = [tok(t)["input_ids"] for t in ("3+4=", "9=")]
    spec = SamplingSpec(n=4, max_new_tokens=12, seed=3)
    a = HFEngine(model, tok, decode="fused").generate(prompts, spec)
    b = HFEngine(model, tok, decode="generate").generate(prompts, spec)
    assert a.response_ids == b.response_ids
    k = HFEngine(model, tok, decode="fused").generate(prompts, SamplingSpec(n=4, max_new_tokens=12, seed=3,
                                                                            keys=[1, 2]))
    assert k.response_ids != a.response_ids


def test_keyed_prompt_sampler_depends_on_step_and_slot_only():
    a, b = PromptSampler(100, seed=5, keyed=True), PromptSampler(100, seed=5, keyed=True)
    # arm a refills twice at step 1, arm b never: step 2's first round is the same in both
    a1 = a.take(8, step=1, round_idx=0)
    a.take(8, step=1, round_idx=1), a.take(8, step=1, round_idx=2)
    b1 = b.take(8, step=1, round_idx=0)
    assert a1 == b1
    assert a.take(8, step=2, round_idx=0) == b.take(8, step=2, round_idx=0)
    # a refill round draws on its own slots, the same in any arm that reaches it
    assert PromptSampler(100, 5, keyed=True).take(8, step=3, round_idx=1) == b.take(8, step=3, round_idx=1)
    # the first rounds walk a permutation: every prompt once per epoch
    s = PromptSampler(100, seed=5, keyed=True)
    epoch = [i for step in range(1, 26) for i in s.take(4, step=step, round_idx=0)]
    assert sorted(epoch) == list(range(100))
    # the default stream walk is unchanged: one position shared by every round
    st = PromptSampler(100, seed=5)
    assert st.take(8) + st.take(8) == PromptSampler(100, seed=5).take(16)


# --------------------------------------------------------------------------- #
# Whole runs                                                                    #
# --------------------------------------------------------------------------- #
def _recorded_run(small_cfg, out, monkeypatch, *overrides):
    """Train a small run; every engine call's (prompts, spec, responses) in order."""
    from dapo_exp.train import train

    calls = []
    real = HFEngine.generate

    def spy(self, prompt_ids, spec):
        g = real(self, prompt_ids, spec)
        calls.append((prompt_ids, spec, g.response_ids))
        return g

    monkeypatch.setattr(HFEngine, "generate", spy)
    summary = train(small_cfg(out, "seed=5", "train.randomness=keyed", "eval.before_training=true", *overrides))
    monkeypatch.setattr(HFEngine, "generate", real)
    return calls, summary


def test_arms_that_differ_in_a_fix_share_prompts_first_samples_and_eval_noise(tmp_path, small_cfg, monkeypatch):
    off, _ = _recorded_run(small_cfg, tmp_path / "off", monkeypatch, "fixes=grpo", "clip_higher=disabled")
    on, _ = _recorded_run(small_cfg, tmp_path / "on", monkeypatch, "fixes=grpo", "clip_higher=enabled")
    assert len(off) == len(on) == 4  # eval at 0, step 1, step 2, final eval
    # step-0 evaluation: same problems, same keys, same samples (the same base policy)
    assert off[0][1].keys == on[0][1].keys and off[0][2] == on[0][2]
    # every step: the same prompts and the same noise keys; step 1 (before any update): the same samples
    for i in (1, 2):
        assert off[i][0] == on[i][0] and off[i][1].keys == on[i][1].keys
    assert off[1][2] == on[1][2]
    # the final evaluation draws with the same keys as step 0's (evaluation noise is keyed per problem,
    # sample and position, not per step), and no training call reuses an evaluation key
    assert off[3][1].keys == off[0][1].keys == on[3][1].keys
    assert not set(off[0][1].keys) & {k for c in off[1:3] for k in c[1].keys}


def test_same_seed_same_config_keyed_runs_are_identical(tmp_path, small_cfg, monkeypatch):
    a, sa = _recorded_run(small_cfg, tmp_path / "a", monkeypatch, "fixes=grpo")
    b, sb = _recorded_run(small_cfg, tmp_path / "b", monkeypatch, "fixes=grpo")
    assert [c[2] for c in a] == [c[2] for c in b]
    assert sa["final"]["eval/acc_avg"] == sb["final"]["eval/acc_avg"]


def test_final_evaluation_size_repeats_and_endpoint(tmp_path, small_cfg, monkeypatch):
    calls, s = _recorded_run(small_cfg, tmp_path / "r", monkeypatch, "fixes=grpo", "task.arith_n_eval=12",
                             "eval.problems=8", "eval.final_problems=12", "eval.final_samples=3",
                             "eval.final_repeats=2", "eval.endpoint=last_k_mean", "eval.endpoint_k=2")
    sizes = [(len(c[0]), c[1].n) for c in calls if c[1].keys is not None and len(c[1].keys) != 4]
    assert sizes == [(8, 2), (12, 3), (12, 3), (12, 3)]  # step 0; the final evaluation and its 2 repeats
    assert calls[-1][1].keys != calls[-2][1].keys != calls[-3][1].keys  # the repeats draw fresh noise
    ep = s["endpoint"]
    assert ep["name"] == "last_k_mean" and ep["steps"] == [2] and len(ep["final_repeats"]) == 2
    assert (ep["final_problems"], ep["final_samples"]) == (12, 3) and "last 1 evaluations" in ep["label"]
    assert s["final"]["eval/acc_avg_rep2"] == ep["final_repeats"][1]
