"""The non-toy path end to end, without a hub: a Qwen2 model with a real byte-level BPE
tokenizer and a chat template (random weights, built here, saved to a directory), loaded
through ``model.path=<dir>`` exactly as a user loads Qwen2.5, trained for two steps on
``task=dapo_math`` from a local parquet in the official schema, evaluated on a local
AIME-shaped parquet (``tests/fixtures_aime.py``; no file outside the repository)."""

import json
from pathlib import Path

import pandas as pd
import pytest
from fixtures_aime import write_aime_parquet

from dapo_exp import rundir
from dapo_exp.tasks.math_data import apply_template
from dapo_exp.train import train

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
def test_qwen_like_model_trains_on_dapo_math_with_aime_eval(tmp_path, small_cfg):
    model_dir, data = tmp_path / "qwen-like", tmp_path / "dapo-math.parquet"
    build_qwen_like(model_dir)
    write_dapo_parquet(data)
    aime = write_aime_parquet(tmp_path / "aime-2024.parquet")
    cfg = small_cfg(
        tmp_path / "run", "task=dapo_math", f"task.train_source={data}", f"task.eval_source={aime}",
        "task.eval_limit=3", f"model.path={model_dir}", "model.name=hf", "rollout.max_response_len=12",
        "algo.overlong_cache_len=4", "train.prompts_per_step=2", "rollout.n=2", "train.mini_batch_size=4",
        "train.micro_batch_size=2", "eval.k=2", "fixes=full", "algo.ds_on_cap=partial", "algo.ds_max_rounds=2",
        "eval.final_samples=null",  # the final evaluation like the others, as the real-scale presets set it
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


# --------------------------------------------------------------------------- #
# A hub id with no network: one short request, then one clear line              #
# --------------------------------------------------------------------------- #
def _closed_port() -> int:
    import socket

    with socket.socket() as s:  # bound, then released: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def no_hub(monkeypatch):
    """The hub at a closed local port, an empty view of the HF cache, a fresh probe memo;
    counts the hub requests and fails if transformers is asked to load anything."""
    import huggingface_hub
    import transformers

    from dapo_exp import models

    endpoint = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(models, "_HUB_STATUS", {})
    monkeypatch.setattr(models, "_in_hf_cache", lambda model_id: False)
    calls = []
    real_info = huggingface_hub.HfApi.model_info

    def counted(self, *a, **k):
        calls.append(k.get("timeout"))
        return real_info(self, *a, **k)

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", counted)

    def refuse(*a, **k):
        raise AssertionError("transformers was asked to load from an unreachable hub")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    return endpoint, calls


def test_hub_model_offline_fails_fast_in_one_line(no_hub):
    from dapo_exp.config import ConfigError
    from dapo_exp.models import HUB_TIMEOUT_S, ModelSourceError, load_policy

    endpoint, calls = no_hub
    with pytest.raises(ModelSourceError) as err:
        load_policy("Qwen/Qwen2.5-0.5B")
    msg = str(err.value)
    # fast by construction (transformers' own retries took ~61 s): one request, short time-out; not timed
    assert calls == [HUB_TIMEOUT_S] and HUB_TIMEOUT_S <= 10
    assert isinstance(err.value, ConfigError)  # run.py prints it as one `error:` line, exit 2
    assert "\n" not in msg and len(msg) < 800
    assert msg.startswith("model.path='Qwen/Qwen2.5-0.5B': cannot reach the Hugging Face hub at " + endpoint)
    assert "model.path=/path/to/model_dir" in msg and "HF_HUB_OFFLINE=1" in msg
    assert err.value.__cause__ is None and err.value.__suppress_context__  # no chained traceback


def test_hub_model_offline_uses_the_cached_copy_without_asking_again(no_hub, monkeypatch, caplog):
    import transformers

    from dapo_exp import models

    _, calls = no_hub
    monkeypatch.setattr(models, "_in_hf_cache", lambda model_id: model_id == "Qwen/Qwen2.5-0.5B")
    seen = []

    class Stop(Exception):
        pass

    def fake_tokenizer(path, trust_remote_code=False, local_files_only=False):
        seen.append(("tokenizer", local_files_only))
        return transformers.PreTrainedTokenizerFast(tokenizer_object=models.build_char_tokenizer()._tokenizer,
                                                    eos_token="<eos>")

    def fake_model(path, **kwargs):
        seen.append(("model", kwargs.get("local_files_only", False)))
        raise Stop

    monkeypatch.setattr(models, "load_tokenizer", fake_tokenizer)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_model)
    with caplog.at_level("WARNING", logger="dapo_exp.models"), pytest.raises(Stop):
        models.load_policy("Qwen/Qwen2.5-0.5B")
    assert seen == [("tokenizer", True), ("model", True)]  # read from the cache, no hub retries
    assert "loading the cached copy" in caplog.text
    assert models.check_hub_model("Qwen/Qwen2.5-0.5B") == "cache" and len(calls) == 1  # asked once


def test_hub_offline_env_without_cached_model_is_one_line(no_hub, monkeypatch):
    from dapo_exp.models import ModelSourceError, check_hub_model

    _, calls = no_hub
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelSourceError, match=r"HF_HUB_OFFLINE is set .*model.path=/path/to/model_dir"):
        check_hub_model("Qwen/Qwen2.5-0.5B")
    assert calls == []  # offline: the hub is not asked at all
    assert check_hub_model("tiny") == "local" and check_hub_model("./some/dir") == "local"


def test_damaged_weights_in_a_model_directory_are_one_line_naming_the_file(tmp_path):
    """Issue 34: a payload file as model weights ended in 68 lines naming neither the file nor model.path."""
    import shutil
    import subprocess
    import sys

    from helpers import shipped_default_model

    shipped = shipped_default_model()
    model = tmp_path / "model"
    shutil.copytree(shipped, model)
    (model / "model.safetensors").write_bytes(b"#!/bin/sh\necho not weights\n" * 40)
    out = subprocess.run([sys.executable, "run.py", f"model.path={model}", "logger=none", "train.steps=1",
                          f"hydra.run.dir={tmp_path / 'run'}"], cwd=Path(__file__).resolve().parents[1],
                         capture_output=True, text=True, timeout=300)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
    assert lines[0].startswith(f"error: model.path={model}: cannot load the model from model.safetensors, config.json")
    assert not (tmp_path / "run").exists()


def test_a_model_directory_holding_only_a_pickled_model_is_one_line_naming_the_file(tmp_path):
    """``pytorch_model.bin`` holding a whole pickled model (``torch.save(model)``) instead of a state dict: torch
    refuses to unpickle it weights-only (it would run code), and that refusal is one line naming the file and the
    fix, exit 2, no run directory."""
    import shutil
    import subprocess
    import sys

    import torch
    from helpers import shipped_default_model
    from transformers import AutoModelForCausalLM

    model = tmp_path / "model"
    shutil.copytree(shipped_default_model(), model)
    torch.save(AutoModelForCausalLM.from_pretrained(model), model / "pytorch_model.bin")
    (model / "model.safetensors").unlink()
    out = subprocess.run([sys.executable, "run.py", f"model.path={model}", "logger=none", "train.steps=1",
                          f"hydra.run.dir={tmp_path / 'run'}"], cwd=Path(__file__).resolve().parents[1],
                         capture_output=True, text=True, timeout=300)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
    assert lines[0].startswith(f"error: model.path={model}: ") and "pytorch_model.bin" in lines[0], lines[0]
    assert "save_pretrained" in lines[0] and not (tmp_path / "run").exists()
