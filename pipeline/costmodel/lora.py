"""The price of LoRA in a decoding step: the low-rank GEMMs per target module and the adapter mixing.

An unmerged LoRA adapter of rank ``r`` on a module with ``in`` input and ``out`` output features adds
``y += (x @ A^T) @ B^T`` (A: [r, in], B: [out, r]) to the module's projection, for every row the step
feeds. Per decoder layer and target module, over ``rows`` rows in the step (batch x rows per request):

* FLOPs: ``2 x rows x r x (in + out)`` (the two thin GEMMs; the scaling folds into B);
* bytes: ``r x (in + out) x 2`` (bf16 A and B) for **each distinct adapter** in the step: a batch
  mixing N adapters reads N adapters' weights, not one (the activations are the base projection's).

A batch that mixes adapters is served as one gather-GEMM group per distinct adapter: S-LoRA's MBGMM
(Sheng et al. 2023, arXiv 2311.03285, section 5) and Punica's SGMV (Chen et al. 2023, arXiv
2310.18547, section 4) gather each adapter's rows (or index its weights per row) and run the two thin
GEMMs per group inside one kernel launch. The price, per layer and module:

* ``LoRA GEMMs``: the roofline of one adapter's bytes and every row's FLOPs, plus the two kernels
  (shrink to r, expand to out) at ``LORA_KERNEL_S`` each;
* ``LoRA adapter mixing``: for each distinct adapter beyond the first, its weight read (bytes /
  bandwidth) and ``LORA_GROUP_S`` per GEMM for the extra group's tiles.

Tensor parallelism splits A or B with the module, so bytes and FLOPs are divided by tp (the extra
all-gather TensorRT-LLM's LoRA plugin may need on row-parallel modules is left out).

Module names are PEFT's (``q_proj`` ... ``down_proj``, the Llama names of adapter_config.json's
``target_modules``). Worked example, SmolLM2-135M (hidden 576, 9 heads of 64, 3 KV heads,
intermediate 1536, 30 layers) with rank 8 on q_proj and v_proj, one request:

    >>> from pipeline import presets
    >>> arch = presets.preset("smollm2-135m-instruct")
    >>> load = LoraLoad(rank=8, modules=("q_proj", "v_proj"))
    >>> module_features(arch, "v_proj")
    (576, 192)
    >>> lora_flops(arch, load, rows=1)  # 30 x 2 x 8 x ((576 + 576) + (576 + 192))
    921600
    >>> lora_bytes(arch, load)  # 30 x 8 x 1920 x 2
    921600
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.costmodel.pricing import target_step
from pipeline.costmodel.step import Deployment, StepCost
from pipeline.costmodel.step_gpu import roofline_s
from pipeline.geometry import ModelGeometry

LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTER_BYTES = 2  # bf16 A and B (TensorRT-LLM's LoRA cache holds them in the engine's activation dtype)
# The shortest a small GEMM kernel runs on a GPU, inside a CUDA graph (an assumption: one wave of a
# few thread blocks; cuBLAS and CUTLASS grouped GEMMs do not go below a few microseconds).
LORA_KERNEL_S = 3e-6
# One more gather-GEMM group in a kernel: its tiles and its slice of the row indices (an assumption).
LORA_GROUP_S = 0.5e-6


@dataclass(frozen=True)
class LoraLoad:
    """The LoRA work of a step: the rank, the target modules, and how many distinct adapters it mixes."""

    rank: int
    modules: tuple[str, ...]
    adapters: int = 1

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"LoRA rank {self.rank} must be >= 1")
        if self.adapters < 1:
            raise ValueError(f"distinct adapters per step {self.adapters} must be >= 1")
        if not self.modules:
            raise ValueError("no LoRA target modules")
        unknown = [m for m in self.modules if m not in LORA_MODULES]
        if unknown:
            raise ValueError(f"unknown LoRA target module(s) {', '.join(unknown)}: one of {', '.join(LORA_MODULES)}")
        if len(set(self.modules)) != len(self.modules):
            raise ValueError(f"LoRA target modules repeat: {', '.join(self.modules)}")


def module_features(arch: ModelGeometry, module: str) -> tuple[int, int]:
    """(in, out) features of a Llama decoder layer's module."""
    h, d = arch.hidden_size, arch.head_dim
    return {
        "q_proj": (h, arch.num_heads * d),
        "k_proj": (h, arch.num_kv_heads * d),
        "v_proj": (h, arch.num_kv_heads * d),
        "o_proj": (arch.num_heads * d, h),
        "gate_proj": (h, arch.intermediate_size),
        "up_proj": (h, arch.intermediate_size),
        "down_proj": (arch.intermediate_size, h),
    }[module]


def _features(arch: ModelGeometry, load: LoraLoad) -> int:
    """sum over the target modules of (in + out), one layer."""
    return sum(sum(module_features(arch, m)) for m in load.modules)


def lora_flops(arch: ModelGeometry, load: LoraLoad, rows: int) -> int:
    """FLOPs of the low-rank GEMMs over ``rows`` rows, every layer (whatever the adapter mix)."""
    return arch.num_layers * 2 * rows * load.rank * _features(arch, load)


def lora_bytes(arch: ModelGeometry, load: LoraLoad, adapters: int = 1) -> int:
    """Bytes of ``adapters`` distinct adapters' A and B, every layer."""
    return adapters * arch.num_layers * load.rank * _features(arch, load) * ADAPTER_BYTES


def add_lora(cost: StepCost, d: Deployment, load: LoraLoad, rows: int) -> StepCost:
    """Add the LoRA parts of a step feeding ``rows`` rows (batch x rows per request) to ``cost``."""
    k = d.constants()
    groups = min(load.adapters, rows)  # a step cannot mix more adapters than it has rows
    kernels = d.arch.num_layers * len(load.modules) * 2
    gemms = roofline_s(d.gpu, lora_bytes(d.arch, load) / d.tp, lora_flops(d.arch, load, rows) / d.tp, "bfloat16", k)
    cost.add("LoRA GEMMs", gemms + kernels * LORA_KERNEL_S)
    if groups > 1:
        extra_bytes = lora_bytes(d.arch, load, groups - 1) / d.tp
        read = roofline_s(d.gpu, extra_bytes, 0.0, "bfloat16", k)
        cost.add("LoRA adapter mixing", read + (groups - 1) * kernels * LORA_GROUP_S)
    return cost


def shared_speedup(d: Deployment, load: LoraLoad, batch: int) -> float:
    """A fine-tune's predicted speedup on the shared LoRA engine (no speculation) over plain decoding
    of the base: plain step / (plain step + its LoRA parts), at ``batch`` requests in flight. The
    shared option's figure in the fleet's decision (pipeline/fleet/lora_decision.py)."""
    plain = target_step(d, batch, 1, logit_rows=1)
    with_lora = add_lora(target_step(d, batch, 1, logit_rows=1), d, load, batch)
    return plain.total_s / with_lora.total_s
