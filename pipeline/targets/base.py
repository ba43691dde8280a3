"""What a target is: :class:`TargetDefinition`, the runtime a variant is built for and served by.

A spec's ``target`` names one (``tensorrt``, ``reference``, ``pytorch``); every module that treats targets
differently asks its definition (``definition(name).on_gpus``, ...) instead of comparing names, so
a runtime is one more definition plus its build and launch code.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class TargetDefinition:
    """One deployment target, as the planner, the stages and the deployment see it."""

    name: str  # spec.target
    title: str  # how a person reads it
    on_gpus: bool  # runs on GPUs: memory is planned per GPU, Kubernetes manifests request them
    builds_engines: bool  # convert + trtllm-build make an engine (else the runtime loads the HF checkpoint)
    lora_on_bfloat16: bool  # serves LoRA adapters on a bfloat16 engine
    dynamic_eagle_trees: bool  # serves EAGLE-2's dynamic trees (else only a static eagle_choices tree)
    http_body_limit: int | None  # the largest HTTP request body its server survives (None: no known limit)
    lora_speculative_methods: tuple[str, ...] = ()  # methods it runs on a shared LoRA engine (adapted target)
    pipeline_parallel_speculation: bool = True  # whether speculation runs with pp > 1
