"""Synthetic Llama-shaped HF checkpoints of any size, written in bounded memory.

For benchmarks and memory tests: the tensors are random, the layout (names, shapes, config.json)
is that of a real Llama export, and nothing larger than one chunk is ever held in memory.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch

from pipeline.checkpoint.safetensors_io import DTYPE_NAMES, HeaderEntry, StreamWriter
from pipeline.geometry import ModelGeometry

_CHUNK_ELEMENTS = 4 * 1024 * 1024
# Random values are expensive to draw (randn runs at ~100 MB/s here); a pool drawn once and
# sliced at varying offsets gives every tensor different, realistic-looking bytes at memcpy speed.
_POOL_ELEMENTS = 2 * _CHUNK_ELEMENTS


# The default shape: a 1B-class Llama (vocab 32000, 8 layers of hidden 1024, GQA 16/4).
DEFAULT_SYNTHETIC = ModelGeometry(
    "synthetic-llama",
    vocab_size=32000,
    hidden_size=1024,
    num_layers=8,
    num_heads=16,
    num_kv_heads=4,
    head_dim=64,
    intermediate_size=2816,
    max_position_embeddings=4096,
    rope_theta=500000.0,
)


def tensors(model: ModelGeometry) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every tensor of a HF Llama checkpoint of this shape, in file order."""
    H, inter, d = model.hidden_size, model.intermediate_size, model.head_dim
    q, kv = model.num_heads * d, model.num_kv_heads * d
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (model.vocab_size, H))]
    for i in range(model.num_layers):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", (H,)),
            (p + "self_attn.q_proj.weight", (q, H)),
            (p + "self_attn.k_proj.weight", (kv, H)),
            (p + "self_attn.v_proj.weight", (kv, H)),
            (p + "self_attn.o_proj.weight", (H, q)),
            (p + "post_attention_layernorm.weight", (H,)),
            (p + "mlp.gate_proj.weight", (inter, H)),
            (p + "mlp.up_proj.weight", (inter, H)),
            (p + "mlp.down_proj.weight", (H, inter)),
        ]
    out.append(("model.norm.weight", (H,)))
    if not model.tie_word_embeddings:
        out.append(("lm_head.weight", (model.vocab_size, H)))
    return out


def nbytes(model: ModelGeometry, dtype: torch.dtype) -> int:
    size = torch.empty((), dtype=dtype).element_size()
    return sum(torch.Size(s).numel() for _, s in tensors(model)) * size


def hf_config(model: ModelGeometry, dtype: torch.dtype) -> dict:
    """The checkpoint's config.json."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "vocab_size": model.vocab_size,
        "hidden_size": model.hidden_size,
        "intermediate_size": model.intermediate_size,
        "num_hidden_layers": model.num_layers,
        "num_attention_heads": model.num_heads,
        "num_key_value_heads": model.num_kv_heads,
        "head_dim": model.head_dim,
        "tie_word_embeddings": model.tie_word_embeddings,
        "max_position_embeddings": model.max_position_embeddings,
        "rms_norm_eps": model.norm_epsilon,
        "rope_parameters": {"rope_type": "default", "rope_theta": model.rope_theta},
        "dtype": {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}[dtype],
    }


def scaled_to(
    target_bytes: int, dtype: torch.dtype = torch.bfloat16, base: ModelGeometry = DEFAULT_SYNTHETIC
) -> ModelGeometry:
    """``base`` with as many layers as fit ``target_bytes`` (at least one)."""
    one, two = replace(base, num_layers=1), replace(base, num_layers=2)
    per_layer = nbytes(two, dtype) - nbytes(one, dtype)
    fixed = nbytes(one, dtype) - per_layer
    return replace(base, num_layers=int(max(1, (target_bytes - fixed) // per_layer)))


def write_synthetic_llama(
    folder: Path, model: ModelGeometry, dtype: torch.dtype = torch.bfloat16, seed: int = 0
) -> int:
    """Write config.json + model.safetensors into ``folder``; returns the safetensors file size."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(hf_config(model, dtype), indent=2))
    assert dtype in DTYPE_NAMES
    entries = [HeaderEntry(name, dtype, shape) for name, shape in tensors(model)]
    path = folder / "model.safetensors"
    writer = StreamWriter(path, entries)
    gen = torch.Generator().manual_seed(seed)
    pool = (torch.randn(_POOL_ELEMENTS, generator=gen) * 0.02).to(dtype)
    norm_pool = (1.0 + 0.1 * torch.randn(_CHUNK_ELEMENTS, generator=gen)).to(dtype)
    try:
        for i, entry in enumerate(entries):
            n = torch.Size(entry.shape).numel()
            src = norm_pool if entry.name.endswith("norm.weight") else pool
            for start in range(0, n, _CHUNK_ELEMENTS):
                count = min(_CHUNK_ELEMENTS, n - start, src.numel())
                offset = (i * 7919 + start // _CHUNK_ELEMENTS * 104729) % (src.numel() - count + 1)
                writer.write_tensor_bytes(src[offset : offset + count])
        writer.close(sync=False)
    finally:
        writer.abort()
    return path.stat().st_size
