"""What LoRA adapters cost in memory: the one place the planner computes it.

An adapter of rank r on module m of every layer holds r * (in_m + out_m) values per layer (lora_A
[r, in] and lora_B [out, r]); with tensor parallelism each rank holds its shard (in or out split
by tp, as TensorRT-LLM's ``LoraModule::localInDim/localOutDim``), so per GPU about 1/tp of it.

>>> from pipeline.spec.presets import preset
>>> round(adapter_bytes(preset("llama-3.1-8b"), 16, ALL_LINEAR, 2) / 1e6)  # rank 16, every projection, fp16
84
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.geometry import ModelGeometry
from pipeline.lora.rules import module_dims

ALL_LINEAR = ("attn_q", "attn_k", "attn_v", "attn_dense", "mlp_h_to_4h", "mlp_4h_to_h", "mlp_gate")
GIB = 1 << 30


def adapter_bytes(arch: ModelGeometry, rank: int, modules: Sequence[str], dtype_bytes: int, tp: int = 1) -> int:
    """Bytes of one adapter of ``rank`` on ``modules`` of every decoder layer, per tp rank."""
    dims = module_dims(arch.hidden_size, arch.num_heads, arch.num_kv_heads, arch.head_dim, arch.intermediate_size)
    per_layer = sum(rank * (dims[m][0] + dims[m][1]) for m in modules)
    return -(-arch.num_layers * per_layer * dtype_bytes // tp)


@dataclass(frozen=True)
class LoraCacheSize:
    """The LoRA cache a group's engine gets (Triton ``lora_cache_*`` parameters), per GPU.

    * host: every adapter of the group, so none is ever evicted to disk-less oblivion (TensorRT-LLM's
      host cache holds the prefetched adapters; default 1 GiB, never less than that here);
    * GPU: the adapters one batch can use at once (``min(adapters, max_batch_size)`` of the largest),
      what TensorRT-LLM's device cache must hold for a step to run without reloading.
    """

    host_bytes: int
    gpu_bytes: int
    max_adapter_bytes: int
    optimal_adapter_size: int  # lora_cache_optimal_adapter_size: the group's most common rank
    max_adapter_size: int  # lora_cache_max_adapter_size: the group's largest rank

    @property
    def gpu_gib(self) -> float:
        return self.gpu_bytes / GIB


def cache_size(
    arch: ModelGeometry,
    ranks: Sequence[int],
    modules: Sequence[str],
    dtype_bytes: int,
    max_batch_size: int,
    tp: int = 1,
) -> LoraCacheSize:
    """The cache for adapters of these ranks, each sized as if on every one of ``modules``."""
    sizes = [adapter_bytes(arch, r, modules, dtype_bytes, tp) for r in ranks]
    largest = max(sizes)
    common = max(set(ranks), key=lambda r: (ranks.count(r), r))
    host = max(sum(sizes), 1 << 30)
    return LoraCacheSize(host, min(len(sizes), max_batch_size) * largest, largest, common, max(ranks))
