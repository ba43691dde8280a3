"""The plan's records: what each variant builds and serves, and where (:class:`Plan`, :class:`VariantPlan`,
:class:`StagePlan`, ...).

A leaf: every later layer (stages, evaluation, serving, release) imports these types, and
:mod:`pipeline.plan.planner` makes them.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline import methods, trees
from pipeline.geometry import ModelGeometry
from pipeline.lora.types import AutoDecision, LoraBuild, LoraGroupPlan
from pipeline.plan import resources
from pipeline.plan.memory import MemoryEstimate
from pipeline.plan.speculative import SpeculativeConfig
from pipeline.spec import gpus
from pipeline.spec.deploy import DeploySpec
from pipeline.spec.document import ServingSpec

# The pre/postprocessing model.py sources copied into every repository: a change re-packages.
TRITON_PYTHON_MODELS = Path(__file__).parents[1] / "triton" / "models"


@dataclass(frozen=True)
class QuantPlan:
    weights_fp8: bool
    kv_cache_fp8: bool
    prequantized: bool  # the input already is a ModelOpt FP8 checkpoint: no quantize stage
    quantize_heads: bool
    calibration_data: Path
    calibration_size: int
    calibration_max_seq_len: int
    offload: str = "none"  # where the quantize stage may put weights that do not fit the GPUs

    @property
    def quant_algo(self) -> str | None:
        return "FP8" if self.weights_fp8 else None

    @property
    def kv_cache_quant_algo(self) -> str | None:
        return "FP8" if self.kv_cache_fp8 else None


@dataclass(frozen=True)
class BuildConfig:
    """What trtllm-build is asked for, and what it will store in the engine's config.json."""

    dtype: str
    max_batch_size: int
    max_input_len: int
    max_seq_len: int  # as requested (passed to trtllm-build)
    max_num_tokens: int  # as requested (passed to trtllm-build)
    max_draft_len: int
    speculative_decoding_mode: str | None
    engine_max_seq_len: int  # trtllm-build adds max_draft_len (+ num_eagle_layers for EAGLE)
    engine_max_num_tokens: int  # raised to max_batch_size * (max_draft_len + 1) when smaller
    use_fp8_context_fmha: bool
    gemm_plugin: str
    max_beam_width: int = 1
    kv_cache_type: str = "paged"
    remove_input_padding: bool = True
    use_paged_context_fmha: bool = True
    multiple_profiles: bool = True
    tokens_per_block: int = 32
    extra_flags: dict[str, Any] = field(default_factory=dict)
    workers: int | None = None  # build.workers: ranks built at once (None: all of them)
    lora: LoraBuild | None = None  # the LoRA plugin: this engine serves a LoRA group (pipeline.lora.group)


@dataclass(frozen=True)
class StagePlan:
    name: str
    output: Path
    inputs: dict[str, Path]  # files/folders whose identity is fingerprinted
    params: dict[str, Any]  # the spec-derived values the stage reads (fingerprinted)
    resources: resources.StageResources | None = None  # what the stage needs of a machine (not fingerprinted)


@dataclass(frozen=True)
class VariantPlan:
    name: str
    target: str
    arch: ModelGeometry
    model_dir: Path | None  # None only when planning from a preset without weights
    builtin: str | None
    weights_present: bool
    heads_dir: Path | None
    speculative: SpeculativeConfig
    tp: int
    pp: int
    gpu: gpus.GpuType | None
    gpu_count: int | None
    quant: QuantPlan
    build: BuildConfig
    serving: ServingSpec
    memory: MemoryEstimate
    stages: tuple[StagePlan, ...]
    notes: tuple[str, ...]
    serve_resources: resources.StageResources | None = None  # the server's needs (serving is not a stage)
    # method: best: what the evaluate stage measures (the heads' candidates) and their build; None otherwise.
    # ``speculative`` and ``build`` are then the measured choice's (pipeline/evaluation/apply.py).
    rehearsal: SpeculativeConfig | None = None
    rehearsal_build: BuildConfig | None = None
    deploy: DeploySpec = DeploySpec()  # the Kubernetes manifests; mount_path roots every packaged engine path

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    @property
    def method(self) -> str:
        return self.speculative.method

    def stage(self, name: str) -> StagePlan:
        return next(stage for stage in self.stages if stage.name == name)

    def rehearsed(self) -> VariantPlan:
        """This variant as the evaluate stage measures it: with the candidates' config (method: best)."""
        if self.rehearsal is None or self.rehearsal_build is None:
            return self
        return dataclasses.replace(self, speculative=self.rehearsal, build=self.rehearsal_build)

    def to_dict(self) -> dict[str, Any]:
        data = jsonable(dataclasses.asdict(self))
        data["speculative"] = jsonable(self.speculative.to_dict())  # an added method's config under its name
        data["rehearsal"] = jsonable(self.rehearsal.to_dict()) if self.rehearsal is not None else None
        data["world_size"] = self.world_size
        data["memory"]["total_gib"] = round(self.memory.total_gib, 3)
        data["memory"]["fits"] = self.memory.fits
        data["speculative"]["max_draft_len"] = self.speculative.max_draft_len
        for method in methods.definitions():  # trees in the compact form Triton takes
            config = getattr(self.speculative, method.name, None) if method.drafts_tree else None
            if config is not None and config.tree is not None:
                data["speculative"][method.name]["tree"] = trees.to_triton_choices(config.tree)
        data["serving"] = self.serving.model_dump()
        data["deploy"] = self.deploy.model_dump()
        return data


@dataclass(frozen=True)
class Plan:
    spec_file: Path
    spec_name: str
    variants: tuple[VariantPlan, ...]
    # triton_repo/<spec>/: every variant in one Triton repository, after all variants' package
    # stages (pipeline.triton.spec_repository); None for a spec with one variant.
    repository: StagePlan | None = None
    # LoRA fine-tunes served as adapters of one engine per base (pipeline.lora.group).
    lora_groups: tuple[LoraGroupPlan, ...] = ()
    # serving.lora auto: the planner's choice per fine-tune of each base (pipeline.lora.auto).
    lora_decisions: tuple[AutoDecision, ...] = ()

    def lora_of(self, variant: VariantPlan) -> dict[str, Any] | None:
        """How a LoRA fine-tune is served: shared (its group and task id) or merged, with the planner's
        decision when serving.lora was auto; None without adapter."""
        decided = {c.name: c.to_dict() for d in self.lora_decisions for c in d.choices}
        decision = {"decision": decided[variant.name]} if variant.name in decided else {}
        for group in self.lora_groups:
            for member in group.members:
                if member.variant == variant.name:
                    return {"mode": "shared", "group": group.name, "lora_task_id": member.task_id} | decision
        merged = variant.stages and any(s.name == "merge" for s in variant.stages)
        return {"mode": "merged"} | decision if merged else None

    def to_json(self) -> str:
        variants = []
        for variant in self.variants:
            data = variant.to_dict()
            data["lora"] = self.lora_of(variant)
            variants.append(data)
        body = {
            "spec": str(self.spec_file),
            "name": self.spec_name,
            "variants": variants,
            "repository": None if self.repository is None else str(self.repository.output),
            "lora_groups": [group.to_dict() for group in self.lora_groups],
            "lora_decisions": [decision.to_dict() for decision in self.lora_decisions],
        }
        return json.dumps(body, indent=2)


@dataclass(frozen=True)
class OutputRoots:
    engines: Path
    triton_repo: Path
    cache: Path


def jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float):
        return round(value, 6)
    return value
