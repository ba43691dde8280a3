"""Per-GPU memory estimate, so a plan that cannot fit fails before anyone rents GPUs.

    total = weights + speculative heads + KV cache + activations + runtime overhead

* weights: decoder layers of the largest pipeline stage split over tp; the embedding is
  replicated on the first stage (TensorRT-LLM's default, no parallel embedding) and the
  lm_head, padded to a multiple of tp, split over tp on the last stage.
* heads: Medusa adds per head (ResBlocks H*H + lm_head V*H) / tp; EAGLE adds, for each of
  num_eagle_layers drafter copies TensorRT-LLM instantiates, fc (2H*H), one decoder layer
  and a copy of lm_head, all / tp; EAGLE-3 its drafter once (``Eagle3Config.drafter_params``) / tp.
* KV cache: 2 (K and V) * layers of the stage * kv_heads per rank * head_dim * bytes per
  element * max_batch_size * engine max_seq_len (a worst case: the runtime sizes the
  pool from kv_cache_free_gpu_mem_fraction, so this asks that every sequence can be full).
* activations: max_num_tokens * (4*H + 2*I/tp + V/tp) elements in fp32, a coarse bound on
  the largest live buffers (attention/MLP intermediates and fp32 logits).
* overhead: 2 GiB for CUDA context, cuBLAS/NCCL workspaces.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.geometry import ModelGeometry
from pipeline.plan.speculative import SpeculativeConfig

GIB = 1024**3
# What a GPU keeps free of the planned engines (allocator fragmentation): pipeline.fleet.placement.
RESERVE_FRACTION = 0.05
RUNTIME_OVERHEAD_BYTES = 2 * GIB
BYTES_PER_ELEMENT = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1}


@dataclass(frozen=True)
class MemoryEstimate:
    weights_gib: float
    heads_gib: float
    kv_cache_gib: float
    activations_gib: float
    overhead_gib: float
    gpu_gib: float | None

    @property
    def total_gib(self) -> float:
        return self.weights_gib + self.heads_gib + self.kv_cache_gib + self.activations_gib + self.overhead_gib

    @property
    def fits(self) -> bool | None:
        return None if self.gpu_gib is None else self.total_gib <= self.gpu_gib

    def describe(self) -> str:
        return (
            f"{self.total_gib:.1f} GiB per GPU = weights {self.weights_gib:.1f} + heads {self.heads_gib:.1f}"
            f" + KV cache {self.kv_cache_gib:.1f} + activations {self.activations_gib:.1f}"
            f" + overhead {self.overhead_gib:.1f}"
        )


def estimate_memory(
    arch: ModelGeometry,
    *,
    tp: int,
    pp: int,
    weight_dtype: str,
    kv_dtype: str,
    activation_dtype: str,
    speculative: SpeculativeConfig,
    max_batch_size: int,
    engine_max_seq_len: int,
    max_num_tokens: int,
    gpu_gib: float | None,
) -> MemoryEstimate:
    weight_bytes = BYTES_PER_ELEMENT[weight_dtype]
    dense_bytes = BYTES_PER_ELEMENT[activation_dtype]  # embeddings, lm_head, norms, heads stay high precision
    layers_per_stage = math.ceil(arch.num_layers / pp)
    padded_vocab = math.ceil(arch.vocab_size / tp) * tp
    hidden = arch.hidden_size

    decoder = layers_per_stage * arch.decoder_layer_params() / tp * weight_bytes
    embedding = arch.vocab_size * hidden * dense_bytes
    lm_head = padded_vocab * hidden / tp * dense_bytes
    # With pp > 1 the first and last stages differ; the larger one bounds the estimate.
    edge = embedding + lm_head if pp == 1 else max(embedding, lm_head)
    weights = decoder + edge

    heads = 0.0
    # the method's heads or drafter as the engine holds them (its config says: engine_heads_params)
    engine_heads_params = getattr(speculative.config, "engine_heads_params", None)
    if engine_heads_params is not None:
        heads = engine_heads_params(arch, tp) / tp * dense_bytes

    kv_heads_per_rank = max(1, arch.num_kv_heads // tp)
    kv_cache = (
        2
        * layers_per_stage
        * kv_heads_per_rank
        * arch.head_dim
        * BYTES_PER_ELEMENT[kv_dtype]
        * max_batch_size
        * engine_max_seq_len
    )
    activations = max_num_tokens * (4 * hidden + 2 * arch.intermediate_size / tp + padded_vocab / tp) * 4

    return MemoryEstimate(
        weights_gib=weights / GIB,
        heads_gib=heads / GIB,
        kv_cache_gib=kv_cache / GIB,
        activations_gib=activations / GIB,
        overhead_gib=RUNTIME_OVERHEAD_BYTES / GIB,
        gpu_gib=gpu_gib,
    )
