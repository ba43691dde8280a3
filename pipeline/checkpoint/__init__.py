"""HF Llama (plain or ModelOpt FP8) + Medusa/EAGLE heads -> TensorRT-LLM 1.2 checkpoints.

Modules: ``safetensors_io`` (bounded-memory format I/O), ``hf_reader`` (input folder),
``heads`` (Medusa/EAGLE inputs), ``sharding`` (TP/PP split rules), ``layout`` (per-rank
plan incl. FP8 scale fusion), ``trtllm_writer`` (config.json + streamed rank files),
``convert`` (entry point), ``reference_forward`` (rank-by-rank forward proving exactness),
``synthetic`` (random Llama-shaped checkpoints of any size, for benchmarks and memory tests).
"""

from __future__ import annotations

import importlib
from typing import Any

# The entry points, imported on first use: they import torch, and reading a submodule's headers
# (``validate`` of a spec) should not pay for it.
_EXPORTS = {
    "CheckpointSummary": "convert",
    "convert_checkpoint": "convert",
    "EagleOptions": "heads",
    "MedusaOptions": "heads",
    "ReferenceModel": "reference_forward",
    "forward_logits": "reference_forward",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'pipeline.checkpoint' has no attribute {name!r}")
    return getattr(importlib.import_module(f"pipeline.checkpoint.{_EXPORTS[name]}"), name)
