"""The HF engine's static-cache decode loop (issue 14, item 2): same samples as transformers
``generate`` for a fixed seed, eager and compiled, and a logged fallback when compiling fails."""

import logging
import shutil

import pytest
import torch

from dapo_exp.models import build_char_tokenizer, build_tiny_model
from dapo_exp.rollout.engine import SamplingSpec
from dapo_exp.rollout.hf.engine import HFEngine
from dapo_exp.rollout.hf.static_decode import padded_len, padded_rows, resolve_decode, top_p_filter


@pytest.fixture(scope="module")
def tiny():
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, seed=0).eval()
    return model, tok


def _prompts(tok, n=4):
    # different lengths, so the chunks are left-padded
    texts = ["3+4=", "12+7+1=", "9=", "5+5+5+5+5="][:n]
    return [tok(t)["input_ids"] for t in texts]


def _gen(model, tok, decode, prompts, **spec):
    eng = HFEngine(model, tok, gen_batch_size=256, decode=decode)
    s = {"n": 8, "max_new_tokens": 24, "temperature": 1.0, "top_p": 1.0, "seed": 7, **spec}
    return eng, eng.generate(prompts, SamplingSpec(**s))


@pytest.mark.parametrize("spec", [{}, {"temperature": 0.7, "top_p": 0.8}])
def test_static_loop_samples_what_generate_samples(tiny, spec):
    model, tok = tiny
    prompts = _prompts(tok)  # 4 x 8 = 32 rows, a power of two: no padding rows
    _, ref = _gen(model, tok, "generate", prompts, **spec)
    eng, got = _gen(model, tok, "static", prompts, **spec)
    assert eng.decode_used == "static"
    assert got.response_ids == ref.response_ids
    assert got.truncated == ref.truncated
    # the random tiny model ends some responses early and runs others to the cap: both paths cut alike
    assert 0 < sum(ref.truncated) < len(ref.truncated)


def test_static_loop_pads_rows_and_drops_them(tiny):
    model, tok = tiny
    prompts = _prompts(tok, 3)  # 3 x 5 = 15 rows -> padded to 16
    eng = HFEngine(model, tok, gen_batch_size=256, decode="static")
    g = eng.generate(prompts, SamplingSpec(n=5, max_new_tokens=16, seed=1))
    assert len(g.response_ids) == 15 and all(1 <= len(r) <= 16 for r in g.response_ids)
    eos = tok.eos_token_id
    for r, tr in zip(g.response_ids, g.truncated):
        assert (eos not in r) == tr and (tr or r[-1] == eos)
    # resumable: the same seed gives the same samples
    assert eng.generate(prompts, SamplingSpec(n=5, max_new_tokens=16, seed=1)).response_ids == g.response_ids


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="torch.compile's CPU backend (inductor) needs a C++ compiler")
def test_compiled_decode_samples_what_eager_samples(tiny):
    model, tok = tiny
    prompts = _prompts(tok)
    spec = {"temperature": 0.9, "top_p": 0.9}
    _, ref = _gen(model, tok, "static", prompts, **spec)
    eng, got = _gen(model, tok, "compiled", prompts, **spec)
    assert eng.decode_used == "compiled"  # no fallback happened
    assert got.response_ids == ref.response_ids and got.truncated == ref.truncated
    # a second call reuses the compiled step and the cache (reset between calls)
    again = eng.generate(prompts, SamplingSpec(n=8, max_new_tokens=24, seed=7, **spec))
    assert again.response_ids == ref.response_ids
    eng.close()  # drops the compiled graphs: a sweep's next run in this process compiles afresh
    assert eng._decoder is None


def test_failed_compile_falls_back_to_generate_and_says_why(tiny, caplog, monkeypatch):
    model, tok = tiny
    prompts = _prompts(tok)
    _, ref = _gen(model, tok, "generate", prompts)
    eng = HFEngine(model, tok, gen_batch_size=256, decode="compiled")

    def broken(*a, **k):
        raise RuntimeError("InductorError: no working C++ compiler found")

    monkeypatch.setattr(eng._decoder, "_step", broken)
    with caplog.at_level(logging.WARNING, logger="dapo_exp.rollout.hf.engine"):
        got = eng.generate(prompts, SamplingSpec(n=8, max_new_tokens=24, seed=7))
    assert eng.decode_used == "generate"
    assert "falling back to transformers generate" in caplog.text and "no working C++ compiler" in caplog.text
    assert got.response_ids == ref.response_ids  # the chunk was redone from its seed: nothing lost


def test_eager_static_errors_are_not_hidden(tiny, monkeypatch):
    model, tok = tiny
    eng = HFEngine(model, tok, gen_batch_size=256, decode="static")
    monkeypatch.setattr(eng._decoder, "_step", lambda *a, **k: (_ for _ in ()).throw(ValueError("a real bug")))
    with pytest.raises(ValueError, match="a real bug"):
        eng.generate(_prompts(tok), SamplingSpec(n=8, max_new_tokens=24, seed=7))


def test_model_without_static_cache_falls_back(tiny, caplog, monkeypatch):
    model, tok = tiny
    monkeypatch.setattr(type(model), "_can_compile_fullgraph", False, raising=False)
    monkeypatch.setattr(type(model), "_supports_static_cache", False, raising=False)
    with caplog.at_level(logging.WARNING, logger="dapo_exp.rollout.hf.engine"):
        eng = HFEngine(model, tok, gen_batch_size=256, decode="static")
    assert eng.decode_used == "generate" and "_can_compile_fullgraph is False" in caplog.text


def test_decode_choice_and_shapes():
    assert resolve_decode("auto", torch.device("cpu")) == "fused"
    assert resolve_decode("auto", torch.device("cuda")) == "compiled"
    assert resolve_decode("static", torch.device("cpu")) == "static"
    with pytest.raises(ValueError, match="rollout.decode='fast'"):
        resolve_decode("fast", torch.device("cpu"))
    assert [padded_rows(n) for n in (1, 8, 9, 128, 129)] == [8, 8, 16, 128, 256]
    assert [padded_len(n) for n in (1, 64, 65, 84)] == [64, 64, 128, 128]


def test_top_p_filter_matches_transformers():
    from transformers.generation.logits_process import TopPLogitsWarper

    g = torch.Generator().manual_seed(0)
    scores = torch.randn(16, 40, generator=g)
    for p in (0.1, 0.5, 0.9, 0.99):
        ref = TopPLogitsWarper(top_p=p)(None, scores.clone())
        assert torch.equal(top_p_filter(scores.clone(), p), ref)


def test_bad_decode_config_fails_before_compute(tmp_path, small_cfg):
    from dapo_exp.config import ConfigError, validate

    with pytest.raises(ConfigError, match="rollout.decode"):
        validate(small_cfg(tmp_path, "rollout.decode=fast"))


def test_min_new_tokens_is_honoured_like_generate(tiny):
    model, tok = tiny
    prompts = _prompts(tok)
    model.generation_config.min_new_tokens = 24  # the benchmarks force exactly this many tokens
    try:
        _, ref = _gen(model, tok, "generate", prompts)
        _, got = _gen(model, tok, "static", prompts)
    finally:
        model.generation_config.min_new_tokens = None
    assert got.response_ids == ref.response_ids
    assert all(len(r) == 24 for r in got.response_ids)


@pytest.mark.parametrize("setting", [{"repetition_penalty": 1.05}, {"no_repeat_ngram_size": 3}])
def test_generation_config_the_loop_does_not_implement_means_generate(tiny, caplog, setting):
    model, tok = tiny
    key, value = next(iter(setting.items()))
    setattr(model.generation_config, key, value)
    try:
        with caplog.at_level(logging.WARNING, logger="dapo_exp.rollout.hf.engine"):
            eng = HFEngine(model, tok, gen_batch_size=256, decode="compiled")
    finally:
        setattr(model.generation_config, key, None)
    assert eng.decode_used == "generate" and f"{key}={value!r}" in caplog.text
    # the identity settings change nothing and keep the static loop
    model.generation_config.repetition_penalty = 1.0
    try:
        assert HFEngine(model, tok, gen_batch_size=256, decode="static").decode_used == "static"
    finally:
        model.generation_config.repetition_penalty = None


def test_model_that_does_not_declare_compile_support_falls_back(tiny, caplog, monkeypatch):
    model, tok = tiny
    monkeypatch.setattr(type(model), "_can_compile_fullgraph", False, raising=False)  # the transformers default
    with caplog.at_level(logging.WARNING, logger="dapo_exp.rollout.hf.engine"):
        eng = HFEngine(model, tok, gen_batch_size=256, decode="compiled")
    assert eng.decode_used == "generate" and "_can_compile_fullgraph is False" in caplog.text


def test_only_the_last_shapes_keep_a_cache(tiny):
    from dapo_exp.rollout.hf.static_decode import KEEP_CACHES

    model, tok = tiny
    eng = HFEngine(model, tok, gen_batch_size=256, decode="static")
    for n in (1, 2, 3, 5):  # 8, 16, 32 and 64 rows: four shapes
        eng.generate(_prompts(tok, 1), SamplingSpec(n=8 * n, max_new_tokens=4, seed=0))
    assert list(eng._decoder._caches) == [(32, 64), (64, 64)][-KEEP_CACHES:]
