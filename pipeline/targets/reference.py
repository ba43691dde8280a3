"""The CPU reference backend: the same Triton repository served by tritonserver 2.51 with the
project's Python ``tensorrt_llm`` model (pipeline/runtime/), on this host."""

from __future__ import annotations

from pipeline.targets.base import TargetDefinition

# tritonserver 2.51 is reported to crash on HTTP bodies of ~4 MB (triton-inference-server/server#5840).
CPU_HTTP_MAX_REQUEST_BYTES = 4 * (1 << 20) - 1

DEFINITION = TargetDefinition(
    name="reference",
    title="the CPU reference backend",
    builds_engines=True,
    on_gpus=False,
    lora_on_bfloat16=True,
    dynamic_eagle_trees=True,
    http_body_limit=CPU_HTTP_MAX_REQUEST_BYTES,
)
