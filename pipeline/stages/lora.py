"""The lora stage: a LoRA group's adapters in the runtime's format, one folder per task id.

``<engines>/<base>/lora/<task id>/model.lora_{weights,config}.npy``, the layout TensorRT-LLM's
``lora_prefetch_dir`` loads at startup (see :mod:`pipeline.lora.rules`), in the engine's dtype:
float32 and float16 as they are; numpy has no bfloat16, so a bfloat16 engine's adapters are written
in float16, which only the CPU reference target serves (widened); on GPUs the planner refuses a
bfloat16 group (:data:`pipeline.lora.rules.BFLOAT16_REFUSAL`).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.lora.convert import convert_adapter
from pipeline.plan import StagePlan, VariantPlan

NPY_DTYPE = {"float32": "float32", "float16": "float16", "bfloat16": "float16"}


def run(variant: VariantPlan, stage: StagePlan, out: Path) -> None:
    dtype = NPY_DTYPE[stage.params["dtype"]]
    base = Path(stage.inputs["model"])  # each adapter is checked against the base's tensor shapes
    for task_id, adapter in sorted((k, v) for k, v in stage.inputs.items() if k != "model"):
        lora = convert_adapter(Path(adapter), dtype, base)
        lora.save(out / task_id)
        print(
            f"[{variant.name}] lora: task {task_id} <- {adapter} ({lora.config.shape[1]} modules x layers)", flush=True
        )
