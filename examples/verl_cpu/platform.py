"""A CPU device platform for verl (test-only): stands in for verl's CUDA platform on a machine
without a GPU, so that verl's workers run their FSDP2 engine on CPU tensors over gloo.

verl ≥ 0.8 resolves its device platform once per process (`VERL_PLATFORM` names a registered
one); this module registers `CPUPlatform` as "trustlens_cpu". Ray still places verl's workers on
"GPU" resources: run Ray with fake GPUs (`ray.init(num_gpus=N)`), which only count slots.
verl's FSDP engine is registered for "cuda" only: select it with `VERL_ENGINE_DEVICE=cuda`.

Import this module before verl's workers are imported (`verl_cpu.plugin` is imported when verl is).
"""

from __future__ import annotations

import functools
from contextlib import nullcontext
from types import SimpleNamespace

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry
from verl.utils import distributed

NAME = "trustlens_cpu"


def _no_memory(*args, **kwargs) -> int:
    """The memory statistics verl logs (there are none for a CPU)."""
    return 0


# torch.cpu plus the parts of the CUDA API verl calls around updates and weight syncs
DEVICE_MODULE = SimpleNamespace(
    **{k: getattr(torch.cpu, k) for k in dir(torch.cpu) if not k.startswith("_")},
    max_memory_allocated=_no_memory,
    max_memory_reserved=_no_memory,
    memory_allocated=_no_memory,
    memory_reserved=_no_memory,
    reset_peak_memory_stats=lambda *args: None,
    mem_get_info=lambda *args: (0, 0),
    empty_cache=lambda: None,
    get_device_name=lambda *args: "CPU",  # verl's MFU estimate: unknown device, no peak FLOPs
)


@PlatformRegistry.register(platform=NAME)
class CPUPlatform(PlatformBase):
    """verl's device interface on the CPU: device "cpu", gloo collectives, Ray "GPU" slots."""

    device_name = "cpu"
    vendor_name = "cpu"
    device_module = DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def current_device(self) -> str:
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index) -> None:
        pass

    def synchronize(self, device_index=None) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def nvtx_range(self, msg: str):
        return nullcontext()

    def profiler_start(self) -> None:
        pass

    def profiler_stop(self) -> None:
        pass

    def cudart(self) -> None:
        return None


def _gloo_process_group(init):
    """verl's workers ask for the backends "cpu:gloo,<device>:<backend>", which torch rejects
    when the device is the CPU too: ask for plain gloo instead."""

    @functools.wraps(init)
    def init_gloo(timeout_second=None, backend=None):
        return init(timeout_second=timeout_second, backend=backend or "gloo")

    return init_gloo


distributed.initialize_global_process_group_ray = _gloo_process_group(distributed.initialize_global_process_group_ray)
