"""The checkpoint stage (targets whose runtime loads the Hugging Face checkpoint, the PyTorch backend):
the model folder the LLM API loads, at ``<engines>/<variant>/checkpoint`` (see
:mod:`pipeline.checkpoint.served`): the base, its merged fine-tune, or ModelOpt's FP8 export, and an
EAGLE-3 drafter in ``checkpoint/eagle3/``."""

from __future__ import annotations

from pathlib import Path

from pipeline.checkpoint.served import place_checkpoint
from pipeline.plan.types import StagePlan, VariantPlan


def run(variant: VariantPlan, stage: StagePlan, out: Path) -> None:
    drafter = Path(stage.inputs["drafter"]) if "drafter" in stage.inputs else None
    files, size = place_checkpoint(Path(stage.inputs["model"]), Path(stage.inputs["tokenizer"]), out, drafter)
    print(f"[{variant.name}] checkpoint: {files} files ({size / 2**30:.2f} GiB) <- {stage.inputs['model']}", flush=True)
