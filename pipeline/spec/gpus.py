"""GPU types a spec can name: compute capability and memory, for planning before renting.

Memory is the total nvidia-smi reports (MiB); the planner leaves headroom on top.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuType:
    name: str
    compute_capability: tuple[int, int]
    memory_mib: int

    @property
    def memory_gib(self) -> float:
        return self.memory_mib / 1024

    @property
    def supports_fp8(self) -> bool:
        # FP8 tensor cores exist from Ada (8.9) and Hopper (9.0) on.
        return self.compute_capability >= (8, 9)


GPU_TYPES: dict[str, GpuType] = {
    gpu.name: gpu
    for gpu in (
        GpuType("a10g", (8, 6), 23028),
        GpuType("a100-40gb", (8, 0), 40960),
        GpuType("a100-80gb", (8, 0), 81920),
        GpuType("l4", (8, 9), 23034),
        GpuType("l40s", (8, 9), 46068),
        GpuType("rtx-4090", (8, 9), 24564),
        GpuType("rtx-6000-ada", (8, 9), 49140),
        GpuType("h100-pcie-80gb", (9, 0), 81559),
        GpuType("h100-sxm-80gb", (9, 0), 81559),
        GpuType("h100-nvl-94gb", (9, 0), 95830),
        GpuType("h200-141gb", (9, 0), 143771),
        GpuType("gh200-96gb", (9, 0), 97871),
        GpuType("b200-180gb", (10, 0), 183359),
    )
}


def gpu_type(name: str) -> GpuType:
    try:
        return GPU_TYPES[name]
    except KeyError:
        raise ValueError(f"unknown GPU type '{name}' (known: {', '.join(GPU_TYPES)})") from None
