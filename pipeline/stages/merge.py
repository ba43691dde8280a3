"""The merge stage: base HF checkpoint + PEFT LoRA adapters -> merged HF checkpoint (quantize/convert read it).

Streams tensor by tensor (see :mod:`pipeline.checkpoint.merge`). Variants sharing a base and an
adapter list share the output folder, so the second one finds it up to date and skips.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.checkpoint.merge import merge_adapters
from pipeline.plan.types import StagePlan, VariantPlan
from pipeline.progress import byte_progress


def run(variant: VariantPlan, stage: StagePlan, out: Path) -> None:
    adapters = [Path(path) for path in stage.params["adapters"]]  # in order; each is also a fingerprinted input
    with byte_progress(f"[{variant.name}] merge {len(adapters)} adapter(s)") as progress:
        summary = merge_adapters(stage.inputs["model"], adapters, out, progress=progress)
    ratio, tensor = summary.largest_change
    print(
        f"[{variant.name}] merge: {summary.updated_tensors} tensors updated, {summary.replaced_tensors} replaced, "
        f"{summary.copied_tensors} copied ({summary.total_bytes / 2**30:.2f} GiB); largest update "
        f"{ratio:.3g}x its tensor's largest value ({tensor})",
        flush=True,
    )
