"""HF Llama (plain or ModelOpt FP8) + Medusa/EAGLE heads -> TensorRT-LLM 1.2 checkpoints.

Modules: ``safetensors_io`` (bounded-memory format I/O), ``hf_reader`` (input folder),
``heads`` (Medusa/EAGLE inputs), ``sharding`` (TP/PP split rules), ``layout`` (per-rank
plan incl. FP8 scale fusion), ``trtllm_writer`` (config.json + streamed rank files),
``convert`` (entry point), ``reference_forward`` (rank-by-rank forward proving exactness),
``synthetic`` (random Llama-shaped checkpoints of any size, for benchmarks and memory tests).
"""

from pipeline.checkpoint.convert import CheckpointSummary, convert_checkpoint
from pipeline.checkpoint.heads import EagleOptions, MedusaOptions
from pipeline.checkpoint.reference_forward import ReferenceModel, forward_logits

__all__ = [
    "CheckpointSummary",
    "EagleOptions",
    "MedusaOptions",
    "ReferenceModel",
    "convert_checkpoint",
    "forward_logits",
]
