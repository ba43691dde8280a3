"""The quantize stage: ModelOpt FP8 post-training quantization -> unified HF FP8 checkpoint.

On a CUDA host the model is dispatched over every visible GPU, each keeping free the working
memory the plan computed for calibration (``stage.resources``); CPU or disk offload only when
the spec asks (``quantization.offload``; the disk offload folder is inside the stage's temp
folder, removed before it is published, and with it when a run dies).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from pipeline.plan.types import StagePlan, VariantPlan
from pipeline.quantize.fp8 import quantize_fp8
from pipeline.quantize.placement import Placement, gpu_placement, local_gpu_memory_gib


def placement_for(variant: VariantPlan, stage: StagePlan, offload_dir: Path) -> Placement | None:
    """None on a host without CUDA (the model stays one module in host RAM)."""
    gpus = local_gpu_memory_gib()
    if not gpus:
        return None
    working = stage.resources.working_gib_per_gpu if stage.resources is not None else 0.0
    try:
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    except (ValueError, OSError):
        host = None
    return gpu_placement(
        gpus, working_gib=working, offload=variant.quant.offload, offload_dir=offload_dir, host_memory_gib=host
    )


def run(variant: VariantPlan, stage: StagePlan, out: Path) -> None:
    quant = variant.quant
    offload_dir = out / ".offload"
    try:
        # Heads live in their own folder and are merged by the convert stage, unquantized.
        summary = quantize_fp8(
            stage.inputs["model"],
            out,
            kv_cache_fp8=quant.kv_cache_fp8,
            calib_path=quant.calibration_data,
            calib_size=quant.calibration_size,
            calib_max_len=quant.calibration_max_seq_len,
            dtype=stage.params["dtype"] if stage.params["dtype"] != "float32" else "bfloat16",
            placement=placement_for(variant, stage, offload_dir),
            progress=lambda message: print(f"[{variant.name}] quantize: {message}", flush=True),
        )
    finally:
        shutil.rmtree(offload_dir, ignore_errors=True)
    print(
        f"[{variant.name}] quantize: {summary.num_quantized_linears} linears FP8 on {summary.device}, "
        f"{summary.calib_samples} calibration samples ({summary.calib_tokens} tokens), "
        f"{summary.elapsed_s:.1f} s",
        flush=True,
    )
