"""The package stage: the engine + the model's tokenizer -> a Triton model repository.

Reads the engine folder the build stage wrote and the tokenizer of ``variant.model_dir``
(both are the stage's fingerprinted inputs), checks the engine matches the plan, and writes
``triton_repo/<variant>/`` (see :mod:`pipeline.triton.repository`). Every config.pbtxt is
parsed back with Triton's own schema before the runner publishes the folder.

On a target without engines (the PyTorch backend) it writes the LLM API's configuration instead
(:mod:`pipeline.llm_api.deployment`).

``run_spec`` is the same stage for a whole spec (``plan.repository``), after every variant's:
``triton_repo/<spec>/`` serves all variants from one server (:mod:`pipeline.triton.spec_repository`).
"""

from __future__ import annotations

from pathlib import Path

from pipeline import targets
from pipeline.llm_api.deployment import emit_deployment
from pipeline.plan.types import Plan, StagePlan, VariantPlan
from pipeline.triton.repository import emit_repository
from pipeline.triton.spec_repository import emit_spec_repository


def run(variant: VariantPlan, stage: StagePlan, out: Path) -> None:
    if not targets.definition(variant.target).builds_engines:  # the LLM API's configuration, no engine
        emit_deployment(variant, stage, out)
        return
    emit_repository(
        variant,
        out,
        engine_dir=stage.inputs["engine"],
        tokenizer_dir=stage.inputs["tokenizer"],
        lora_task_id=stage.params.get("lora_task_id"),  # a shared fine-tune: its models set its task id
    )


def run_spec(plan: Plan, out: Path) -> None:
    emit_spec_repository(plan, out)
