"""The Llama layer math of the reference backend, shared by the engine, the EAGLE drafter and the
checkpoint test oracle (``pipeline.checkpoint.reference_forward``).

Conventions are TensorRT-LLM's: rope_gpt_neox (rotate-half), the GatedMLP's fc/gate/proj naming,
per-tensor FP8 E4M3 quantize-dequantize for FP8 linears and an FP8 KV cache, and tensor parallelism
computed rank by rank: column-parallel qkv/fc/gate shards, row-parallel dense/proj partial sums,
then an all-reduce (:func:`all_reduce`, a sum in rank order).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from pipeline.errors import InputError
from pipeline.runtime.model.gemm import Gemm

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


def fake_quant_fp8(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Per-tensor FP8 E4M3 quantize-dequantize, as the engine quantizes GEMM inputs and KV."""
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).float() * scale


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope_inv_freq(head_size: int, base: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """Inverse frequencies for rope_gpt_neox, with ``linear`` or ``llama3`` scaling applied."""
    inv = 1.0 / (base ** (torch.arange(0, head_size, 2, dtype=torch.int64).float() / head_size))
    if not scaling:
        return inv
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return inv
    factor = float(scaling["factor"])
    if kind == "linear":
        return inv / factor
    if kind == "llama3":
        # Meta's Llama 3.1 rule: long wavelengths slowed by `factor`, short ones kept, a smooth
        # blend between the low/high frequency cut-offs of the original context length.
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_ctx = float(scaling["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_ctx / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(medium, blended, scaled)
    raise InputError(
        f"rotary_scaling type {kind!r} is not supported by the reference forward (default, linear, llama3)"
    )


def rope_tables(position_ids: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [T, d] of the rotary angles at these positions (shared by every layer of a step)."""
    freqs = position_ids.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [heads, T, d]; rotate-half (GPT-NeoX) convention."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def apply_rope(x: torch.Tensor, position_ids: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    return rotate(x, *rope_tables(position_ids, inv_freq))


@dataclass
class Linear:
    weight: torch.Tensor  # float32 [out, in], dequantized if stored as FP8
    act_scale: float | None = None  # FP8 linear: its inputs are fake-quantized with this scale
    bias: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.act_scale is not None:
            x = fake_quant_fp8(x, self.act_scale)
        y = x @ self.weight.T
        return y if self.bias is None else y + self.bias


@dataclass
class LayerShard:
    """One tp rank's part of a decoder layer."""

    input_layernorm: torch.Tensor | None  # None for EAGLE's first drafter layer
    qkv: Linear | Gemm  # Gemm once the engine prepared it (prepare_linear)
    dense: Linear | Gemm
    post_layernorm: torch.Tensor
    fc: Linear | Gemm
    gate: Linear | Gemm
    proj: Linear | Gemm
    kv_cache_scale: float | None = None


@dataclass(frozen=True)
class Geometry:
    heads: int  # query heads on this rank
    kv_heads: int  # KV heads on this rank (after replication)
    head_size: int
    eps: float


def prepare_linear(linear: Linear | Gemm, bf16: bool) -> Linear | Gemm:
    """The engine's form of a checkpoint linear. FP8 linears (activation scale set) keep their
    float32 fake-quant path: the bf16 rounding would not be what the FP8 kernel does."""
    if isinstance(linear, Gemm) or linear.act_scale is not None:
        return linear
    return Gemm(linear.weight, linear.bias, bf16)


def mlp(w: LayerShard, x: torch.Tensor) -> torch.Tensor:
    # TRT-LLM GatedMLP: fc (= HF gate_proj) is activated, gate (= HF up_proj) multiplies it.
    return w.proj(F.silu(w.fc(x)) * w.gate(x))


def all_reduce(partials: Sequence[torch.Tensor]) -> torch.Tensor:
    """The tp all-reduce: a sum in rank order (the test oracle's order, so results match)."""
    return partials[0] if len(partials) == 1 else torch.stack(list(partials)).sum(0)
