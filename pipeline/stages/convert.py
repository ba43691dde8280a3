"""The convert stage: HF (or ModelOpt FP8) checkpoint + heads -> TensorRT-LLM 1.2 checkpoint."""

from __future__ import annotations

import tempfile
from pathlib import Path

from pipeline.checkpoint.convert import convert_checkpoint
from pipeline.checkpoint.heads import heads_options
from pipeline.errors import StageError
from pipeline.heads.expand import expand_medusa, is_compact_medusa
from pipeline.plan.types import StagePlan, VariantPlan
from pipeline.progress import byte_progress


def run(variant: VariantPlan, stage: StagePlan, out: Path) -> None:
    if variant.speculative.medusa is not None and is_compact_medusa(stage.inputs["heads"]):
        # Shipped ResBlocks-only heads: write the standard folder (lm_heads = base lm_head) aside.
        with tempfile.TemporaryDirectory(prefix="medusa-heads-", dir=out.parent) as expanded:
            heads = expand_medusa(stage.inputs["heads"], stage.inputs["model"], Path(expanded) / "heads")
            _convert(variant, stage, out, heads)
    else:
        _convert(variant, stage, out, stage.inputs.get("heads"))


def _convert(variant: VariantPlan, stage: StagePlan, out: Path, heads: Path | None) -> None:
    medusa = eagle = None
    if variant.speculative.medusa is not None or variant.speculative.eagle is not None:
        if heads is None:
            raise StageError(f"[{variant.name}] convert: the plan has no heads folder for {variant.method}")
        medusa, eagle = heads_options(variant.speculative, heads)
    with byte_progress(f"[{variant.name}] convert tp={variant.tp} pp={variant.pp}") as progress:
        summary = convert_checkpoint(
            stage.inputs["model"],
            out,
            tp=variant.tp,
            pp=variant.pp,
            dtype=variant.build.dtype,
            medusa=medusa,
            eagle=eagle,
            kv_cache_fp8=variant.quant.kv_cache_fp8,
            progress=progress,
        )
    for warning in summary.warnings:
        print(f"[{variant.name}] convert: note: {warning}", flush=True)
    print(
        f"[{variant.name}] convert: {summary.architecture}, {summary.num_tensors} tensors, "
        f"{summary.total_bytes / 2**30:.2f} GiB in {len(summary.files) - 1} rank file(s)",
        flush=True,
    )
