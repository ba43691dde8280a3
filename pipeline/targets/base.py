"""What a target is: :class:`TargetDefinition`, the runtime a variant is built for and served by.

A spec's ``target`` names one (``tensorrt``, ``reference``); every module that treats targets
differently asks its definition (``definition(name).on_gpus``, ...) instead of comparing names, so
the next runtime (TensorRT-LLM's PyTorch backend) is one more definition plus its build and launch
code.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class TargetDefinition:
    """One deployment target, as the planner, the stages and the deployment see it."""

    name: str  # spec.target
    title: str  # how a person reads it
    on_gpus: bool  # runs on GPUs: memory is planned per GPU, Kubernetes manifests request them, trtllm-build builds
    lora_on_bfloat16: bool  # serves LoRA adapters on a bfloat16 engine
    dynamic_eagle_trees: bool  # serves EAGLE-2's dynamic trees (else only a static eagle_choices tree)
    http_body_limit: int | None  # the largest HTTP request body its server survives (None: no known limit)
