"""The fused decode step (rollout.decode=fused, issue 14 item 2): the samples transformers
``generate`` draws for a fixed seed, on Qwen2 and Llama layouts (GQA, biases, untied head,
left padding, EOS, min_new_tokens, temperature and top-p), and a logged fallback to
``generate`` for models it does not fuse."""

import logging

import pytest
import torch

from dapo_exp.models import build_char_tokenizer, build_tiny_model
from dapo_exp.rollout.engine import SamplingSpec
from dapo_exp.rollout.hf.engine import HFEngine
from dapo_exp.rollout.hf.fused_decode import FusedDecoder


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _llama(tok, **kw):
    from transformers import LlamaConfig, LlamaForCausalLM

    kw = {"max_position_embeddings": 128, **kw}
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **kw)
    torch.manual_seed(1)
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.pad_token_id = tok.pad_token_id
    return model


def _qwen2(tok):
    return build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=2, seed=0).eval()


def _prompts(tok):
    texts = ["3+4=", "12+7+1=", "9=", "5+5+5+5+5="]  # different lengths: the batch is left-padded
    return [tok(t)["input_ids"] for t in texts]


def _gen(model, tok, decode, **spec):
    eng = HFEngine(model, tok, gen_batch_size=256, decode=decode)
    s = {"n": 8, "max_new_tokens": 24, "temperature": 1.0, "top_p": 1.0, "seed": 7, **spec}
    return eng, eng.generate(_prompts(tok), SamplingSpec(**s))


@pytest.mark.parametrize("family", ["qwen2", "llama", "llama_biases", "llama_dynamic_rope"])
@pytest.mark.parametrize("spec", [{}, {"temperature": 0.7, "top_p": 0.8}])
def test_fused_loop_samples_what_generate_samples(tok, family, spec):
    model = {"qwen2": lambda: _qwen2(tok), "llama": lambda: _llama(tok),
             "llama_biases": lambda: _llama(tok, attention_bias=True, mlp_bias=True),
             # frequencies that depend on the length seen so far: the rotary module is called per step
             "llama_dynamic_rope": lambda: _llama(tok, max_position_embeddings=16, rope_parameters={
                 "rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})}[family]()
    if family == "llama_dynamic_rope":  # (a transformers that ignored the key would test default RoPE)
        assert model.model.rotary_emb.rope_type == "dynamic"
    _, ref = _gen(model, tok, "generate", **spec)
    eng, got = _gen(model, tok, "fused", **spec)
    assert eng.decode_used == "fused"
    assert got.response_ids == ref.response_ids
    assert got.truncated == ref.truncated
    # random weights end some responses early and run others to the cap: both cut alike
    assert 0 < sum(ref.truncated) < len(ref.truncated)


def test_fused_step_logits_match_the_models_forward(tok):
    """Teacher-forced: the fused step's logits at every position equal the model's own forward."""
    from transformers import DynamicCache

    model = _llama(tok, attention_bias=True)
    fused = FusedDecoder(model)
    ids = torch.tensor([[0, 0, 5, 6, 7], [4, 9, 5, 6, 7]])  # one left-padded row
    att = (ids != 0).long()
    cont = torch.tensor([[11, 12, 13, 14], [15, 16, 17, 18]])
    got = fused.teacher_forced_logits(ids, att, cont)
    full = torch.cat([ids, cont], 1)
    full_att = torch.cat([att, torch.ones_like(cont)], 1)
    with torch.no_grad():
        ref = model(input_ids=full, attention_mask=full_att, position_ids=(full_att.cumsum(-1) - 1).clamp(min=0),
                    past_key_values=DynamicCache()).logits[:, ids.shape[1] - 1 : -1]
    assert got.shape == ref.shape
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_min_new_tokens_is_honoured_like_generate(tok):
    model = _qwen2(tok)
    model.generation_config.min_new_tokens = 24
    _, ref = _gen(model, tok, "generate")
    _, got = _gen(model, tok, "fused")
    assert got.response_ids == ref.response_ids and all(len(r) == 24 for r in got.response_ids)


def test_the_weights_are_read_at_every_call(tok):
    """The trainer changes the weights between rollouts: the fused matrices must follow."""
    model = _qwen2(tok)
    eng = HFEngine(model, tok, gen_batch_size=256, decode="fused")
    spec = SamplingSpec(n=8, max_new_tokens=16, seed=3)
    before = eng.generate(_prompts(tok), spec).response_ids
    with torch.no_grad():
        model.get_decoder().layers[0].mlp.up_proj.weight.mul_(-3.0)
    after = eng.generate(_prompts(tok), spec).response_ids
    _, ref = _gen(model, tok, "generate", max_new_tokens=16, seed=3)
    assert after == ref.response_ids and after != before


def test_fused_weights_are_built_once_per_rollout_and_dropped_after(tok, monkeypatch):
    model = _qwen2(tok)
    eng = HFEngine(model, tok, gen_batch_size=8, decode="fused")  # 32 rows: 4 chunks
    builds = []
    real = FusedDecoder._build_layers
    monkeypatch.setattr(FusedDecoder, "_build_layers", lambda self: builds.append(1) or real(self))
    got = eng.generate(_prompts(tok), SamplingSpec(n=8, max_new_tokens=8, seed=3))
    assert len(builds) == 1 and eng._decoder._fused is None
    ref = HFEngine(model, tok, gen_batch_size=8, decode="generate").generate(
        _prompts(tok), SamplingSpec(n=8, max_new_tokens=8, seed=3))
    assert got.response_ids == ref.response_ids


def _remote_llama(tok):
    from transformers import LlamaForCausalLM

    model = _llama(tok)
    model.__class__ = type("RemoteLlamaForCausalLM", (LlamaForCausalLM,), {"__module__": __name__})
    return model


def _gpt2(tok):
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=2, n_positions=64,
                                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id))


@pytest.mark.parametrize("make, reason", [
    (_gpt2, "model_type 'gpt2' is not one of the fused families"),
    (lambda tok: _llama(tok, hidden_act="gelu"), "hidden_act='gelu'"),
    (lambda tok: _llama(tok, pretraining_tp=2), "pretraining_tp=2"),
    (_remote_llama, "is not transformers' own llama implementation"),
])
def test_models_it_does_not_fuse_fall_back_to_generate_and_say_why(tok, caplog, make, reason):
    model = make(tok)
    with caplog.at_level(logging.WARNING, logger="dapo_exp.rollout.hf.engine"):
        eng = HFEngine(model, tok, gen_batch_size=256, decode="fused")
    assert eng.decode_used == "generate"
    assert "falling back to transformers generate" in caplog.text and reason in caplog.text
    g = eng.generate(_prompts(tok), SamplingSpec(n=2, max_new_tokens=4, seed=0))
    assert len(g.response_ids) == 8


def test_generation_config_it_does_not_implement_means_generate(tok, caplog):
    model = _qwen2(tok)
    model.generation_config.repetition_penalty = 1.1
    with caplog.at_level(logging.WARNING, logger="dapo_exp.rollout.hf.engine"):
        eng = HFEngine(model, tok, gen_batch_size=256, decode="auto")  # auto = fused on CPU
    assert eng.decode_used == "generate" and "repetition_penalty=1.1" in caplog.text


def test_auto_on_cpu_is_fused(tok):
    assert HFEngine(_qwen2(tok), tok, gen_batch_size=256, decode="auto").decode_used == "fused"
