"""The quantize stage: ModelOpt FP8 post-training quantization -> unified HF FP8 checkpoint."""

from __future__ import annotations

from pathlib import Path

from pipeline.plan import StagePlan, VariantPlan
from pipeline.quantize.fp8 import quantize_fp8


def run(variant: VariantPlan, stage: StagePlan, out: Path) -> None:
    quant = variant.quant
    # Heads live in their own folder and are merged by the convert stage, unquantized.
    summary = quantize_fp8(
        stage.inputs["model"], out,
        kv_cache_fp8=quant.kv_cache_fp8,
        calib_path=quant.calibration_data,
        calib_size=quant.calibration_size,
        calib_max_len=quant.calibration_max_seq_len,
        dtype=stage.params["dtype"] if stage.params["dtype"] != "float32" else "bfloat16",
        progress=lambda message: print(f"[{variant.name}] quantize: {message}", flush=True),
    )
    print(f"[{variant.name}] quantize: {summary.num_quantized_linears} linears FP8 on {summary.device}, "
          f"{summary.calib_samples} calibration samples ({summary.calib_tokens} tokens), "
          f"{summary.elapsed_s:.1f} s", flush=True)
