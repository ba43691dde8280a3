"""The TensorRT-LLM 1.2 engine flow on GPUs: ``trtllm-build`` engines served by Triton's C++
``tensorrt_llm`` backend (NVIDIA's ``inflight_batcher_llm`` repository)."""

from __future__ import annotations

from pipeline.targets.base import TargetDefinition

DEFINITION = TargetDefinition(
    name="tensorrt",
    title="TensorRT-LLM 1.2 engines on GPUs",
    builds_engines=True,
    on_gpus=True,
    lora_on_bfloat16=False,  # TensorRT-LLM 1.2.1 serves no adapters to a bfloat16 engine
    dynamic_eagle_trees=False,  # the Triton backend exposes eagle_choices only
    http_body_limit=None,
)
