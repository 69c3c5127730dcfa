"""The non-toy path end to end, without a hub: a Qwen2 model with a real byte-level BPE
tokenizer and a chat template (random weights, built here, saved to a directory), loaded
through ``model.path=<dir>`` exactly as a user loads Qwen2.5, trained for two steps on
``task=dapo_math`` from a local parquet in the official schema, evaluated on AIME 2024
problems from the shared parquet."""

import json
from pathlib import Path

import pandas as pd
import pytest

from dapo_exp import rundir
from dapo_exp.tasks.math_data import apply_template
from dapo_exp.train import train

ROOT = Path(__file__).resolve().parents[1]
AIME = ROOT.parent / "shared" / "data" / "aime-2024.parquet"

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_qwen_like(path: Path) -> None:
    """A byte-level BPE tokenizer trained on a little math text, and a small Qwen2 model."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [apply_template(f"Find {i} + {i * 7} modulo {i + 3}.") + f"\nAnswer: {i}" for i in range(200)]
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=CHAT_TEMPLATE
    )
    cfg = Qwen2Config(
        vocab_size=len(hf_tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=8192, tie_word_embeddings=True,
        eos_token_id=hf_tok.eos_token_id, pad_token_id=hf_tok.pad_token_id, bos_token_id=None,
    )
    model = Qwen2ForCausalLM(cfg)
    model.generation_config.eos_token_id = hf_tok.eos_token_id
    model.generation_config.pad_token_id = hf_tok.pad_token_id
    model.save_pretrained(path)
    hf_tok.save_pretrained(path)


def write_dapo_parquet(path: Path) -> None:
    """Official DAPO-Math-17k schema, each prompt repeated (as the released file) plus a bad row."""
    rows = []
    for rep in range(3):
        for i in range(6):
            rows.append({
                "data_source": "math_dapo",
                "prompt": [{"role": "user", "content": apply_template(f"What is {i} + {i}?")}],
                "ability": "MATH",
                "reward_model": {"ground_truth": str(2 * i), "style": "rule-lighteval/MATH_v2"},
                "extra_info": {"index": f"idx-{i}-{rep}"},
            })
    rows.append({"data_source": "math_dapo", "prompt": [{"role": "user", "content": "no answer here"}],
                 "ability": "MATH", "reward_model": {"ground_truth": None, "style": "rule"},
                 "extra_info": {"index": "bad"}})
    pd.DataFrame(rows).to_parquet(path)


@pytest.mark.slow
@pytest.mark.skipif(not AIME.exists(), reason=f"shared AIME parquet not found at {AIME}")
def test_qwen_like_model_trains_on_dapo_math_with_aime_eval(tmp_path, small_cfg):
    model_dir, data = tmp_path / "qwen-like", tmp_path / "dapo-math.parquet"
    build_qwen_like(model_dir)
    write_dapo_parquet(data)
    cfg = small_cfg(
        tmp_path / "run", "task=dapo_math", f"task.train_source={data}", f"task.eval_source={AIME}",
        "task.eval_limit=3", f"model.path={model_dir}", "model.name=hf", "rollout.max_response_len=12",
        "algo.overlong_cache_len=4", "train.prompts_per_step=2", "rollout.n=2", "train.mini_batch_size=4",
        "train.micro_batch_size=2", "eval.k=2", "fixes=full", "algo.ds_on_cap=partial", "algo.ds_max_rounds=2",
    )
    s = train(cfg)
    assert s["status"] == "finished" and s["steps_done"] == 2
    assert s["model_path"] == str(model_dir)
    # the chat template was applied: eval prompts start with the template's tokens
    samples = [json.loads(x) for x in (tmp_path / "run" / rundir.EVAL_SAMPLES).read_text().splitlines()]
    assert {x["problem_id"] for x in samples} == {"aime24-0", "aime24-1", "aime24-2"}
    assert len(samples) == 2 * 3 * 2  # before and after training, 3 problems x k=2
    assert all(x["answer"].isdigit() for x in samples)
    rows = [json.loads(x) for x in (tmp_path / "run" / rundir.METRICS).read_text().splitlines()]
    assert [r["step"] for r in rows if "dynamic_sampling/gen_rounds" in r] == [1, 2]


def test_chat_template_is_used_for_prompts(tmp_path):
    from dapo_exp.models import load_tokenizer
    from dapo_exp.tasks.base import render_prompt

    build_qwen_like(tmp_path)
    tok = load_tokenizer(str(tmp_path))
    ids = render_prompt("What is 1 + 1?", tok, use_chat_template=True)
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>user\n") and text.endswith("<|im_start|>assistant\n")
    raw = tok.decode(render_prompt("What is 1 + 1?", tok, use_chat_template=False))
    assert raw == "What is 1 + 1?"
