"""Where the quantize stage puts the model: one device, or dispatched by accelerate.

A model that does not fit one GPU is loaded with ``device_map`` (accelerate's big-model
inference, as ModelOpt's own PTQ examples do): transformers builds it on the meta device and
streams each checkpoint shard straight to the device its layers were assigned, at the target
dtype, so no full copy of the weights ever sits in host RAM. ``max_memory`` per GPU is the GPU's
memory minus what the plan keeps free for calibration (``pipeline.plan.resources``); weights that
do not fit go to the CPU or to disk only when asked (``quantization.offload``). Calibration runs
through accelerate's hooks, which move activations from GPU to GPU (and offloaded weights in
and out), so ModelOpt sees the same forward passes as on one device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import StageUnavailable

OFFLOADS = ("none", "cpu", "disk")
MAX_CALIB_BATCH = 32  # samples per forward; more gains little and grows activations linearly
CALIB_MEMORY_SHARE = 0.5  # of the smallest free GPU memory, for calibration activations


@dataclass(frozen=True)
class Placement:
    """``device_map`` None: one device (the CPU; on CUDA hosts, "auto" over every GPU).

    A dict maps module names to a GPU index, "cpu" or "disk" (explicit dispatch); "auto"
    lets accelerate balance the model over ``max_memory_gib`` (GPU index or "cpu" -> GiB).
    ``offload`` says what may leave the GPUs; ``calib_batch`` None sizes the calibration
    batch to the free GPU memory (on the CPU: one sample per forward).
    """

    device_map: str | dict[str, int | str] | None = None
    max_memory_gib: dict[int | str, float] = field(default_factory=dict)
    offload: str = "none"
    offload_dir: Path | None = None
    calib_batch: int | None = None

    def load_kwargs(self, cuda: bool) -> dict[str, Any]:
        """Keyword arguments for ``from_pretrained``."""
        device_map = self.device_map if self.device_map is not None else ("auto" if cuda else None)
        if device_map is None:
            return {}
        kwargs: dict[str, Any] = {"device_map": device_map}
        if self.max_memory_gib:
            kwargs["max_memory"] = {device: f"{gib:.2f}GiB" for device, gib in self.max_memory_gib.items()}
        if self.offload_dir is not None:
            kwargs["offload_folder"] = str(self.offload_dir)
        return kwargs


def gpu_placement(
    gpu_memory_gib: list[float],
    *,
    working_gib: float,
    offload: str,
    offload_dir: Path,
    host_memory_gib: float | None = None,
) -> Placement:
    """Dispatch over these GPUs, keeping ``working_gib`` free on each for calibration."""
    if offload not in OFFLOADS:
        raise ValueError(f"offload must be one of {OFFLOADS}, not {offload!r}")
    budget: dict[int | str, float] = {i: max(0.0, total - working_gib) for i, total in enumerate(gpu_memory_gib)}
    if offload == "cpu":
        # Leave the host room for the process itself and the export shards.
        budget["cpu"] = max(1.0, (host_memory_gib or 0.0) * 0.8 - 16.0)
    elif offload == "disk":
        budget["cpu"] = 0.0  # past the GPUs, straight to the offload folder
    return Placement("auto", budget, offload, offload_dir if offload == "disk" else None)


def local_gpu_memory_gib() -> list[float]:
    """Total memory of each visible CUDA GPU (empty without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_properties(i).total_memory / 1024**3 for i in range(torch.cuda.device_count())]


def check_device_map(model: Any, placement: Placement, cuda: bool) -> dict[str, Any] | None:
    """The device map the model was loaded with; StageUnavailable (exit 3) when weights left the
    GPUs without offload being asked for."""
    mapped = getattr(model, "hf_device_map", None)
    if not mapped:
        return None
    if cuda and placement.offload == "none" and not isinstance(placement.device_map, dict):
        spilled = sorted({str(device) for device in mapped.values() if device in ("cpu", "disk")})
        if spilled:
            gpus = sorted(d for d in placement.max_memory_gib if isinstance(d, int))
            raise StageUnavailable(
                f"the model does not fit the {len(gpus) or 'visible'} GPU(s) of this host "
                f"(it would spill to {' and '.join(spilled)}); run on a host with more GPU "
                "memory, or set quantization.offload: cpu or disk (much slower)"
            )
    return dict(mapped)


def input_device(mapped: dict[str, Any] | None, default: str) -> str:
    """Where calibration inputs go: the device of the embedding (accelerate moves them on)."""
    if not mapped:
        return default
    first = next((device for name, device in mapped.items() if "embed" in name), next(iter(mapped.values())))
    return f"cuda:{first}" if isinstance(first, int) else ("cpu" if first in ("cpu", "disk") else str(first))


def describe(mapped: dict[str, Any] | None, default: str) -> str:
    """The devices used, e.g. "cuda:0+cuda:1" or "cpu+disk"."""
    if not mapped:
        return default
    devices = dict.fromkeys(f"cuda:{d}" if isinstance(d, int) else str(d) for d in mapped.values())
    return "+".join(devices)


def calibration_batch(
    placement: Placement, mapped: dict[str, Any] | None, *, cuda: bool, bytes_per_sample: int, samples: int
) -> int:
    """Samples per calibration forward: as asked, else one on the CPU, else what fits in
    half of the smallest free memory of the GPUs the model is on."""
    if placement.calib_batch is not None:
        return max(1, min(placement.calib_batch, samples))
    if not cuda:
        return 1
    import torch

    used = sorted({d for d in mapped.values() if isinstance(d, int)}) if mapped else []
    used = used or [0]
    free = min(torch.cuda.mem_get_info(i)[0] for i in used)
    fit = int(free * CALIB_MEMORY_SHARE // max(1, bytes_per_sample))
    return max(1, min(fit, MAX_CALIB_BATCH, samples))
