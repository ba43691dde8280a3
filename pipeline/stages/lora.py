"""The lora stage: a LoRA group's adapters in the runtime's format, one folder per task id.

* engine targets: ``<engines>/<base>/lora/<task id>/model.lora_{weights,config}.npy``, the layout
  TensorRT-LLM's ``lora_prefetch_dir`` loads at startup (see :mod:`pipeline.lora.rules`), in the dtype
  the engine takes and its repository declares for ``lora_weights``
  (:data:`pipeline.lora.rules.ADAPTER_NUMPY_DTYPE`), so NVIDIA's client can send a folder of it
  unchanged (``--lora-path``);
* the PyTorch backend (``format: peft``): ``<engines>/<base>/lora/<task id>/`` a checked PEFT folder,
  which the LLM API loads per request (``LoRARequest.lora_path``).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.lora.convert import convert_adapter, copy_peft_adapter
from pipeline.lora.rules import ADAPTER_NUMPY_DTYPE
from pipeline.plan.types import StagePlan, VariantPlan


def run(variant: VariantPlan, stage: StagePlan, out: Path) -> None:
    base = Path(stage.inputs["model"])  # each adapter is checked against the base's tensor shapes
    peft = stage.params.get("format") == "peft"
    for task_id, adapter in sorted((k, v) for k, v in stage.inputs.items() if k != "model"):
        if peft:
            config = copy_peft_adapter(Path(adapter), base, out / task_id)
            what = f"PEFT, rank {config.r}"
        else:
            lora = convert_adapter(Path(adapter), ADAPTER_NUMPY_DTYPE[stage.params["dtype"]], base)
            lora.save(out / task_id)
            what = f"{lora.config.shape[1]} modules x layers"
        print(f"[{variant.name}] lora: task {task_id} <- {adapter} ({what})", flush=True)
