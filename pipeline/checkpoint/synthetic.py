"""Synthetic Llama-shaped HF checkpoints of any size, written in bounded memory.

For benchmarks and memory tests: the tensors are random, the layout (names, shapes, config.json)
is that of a real Llama export, and nothing larger than one chunk is ever held in memory.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from pipeline.checkpoint.safetensors_io import DTYPE_NAMES, HeaderEntry, StreamWriter

_CHUNK_ELEMENTS = 4 * 1024 * 1024
# Random values are expensive to draw (randn runs at ~100 MB/s here); a pool drawn once and
# sliced at varying offsets gives every tensor different, realistic-looking bytes at memcpy speed.
_POOL_ELEMENTS = 2 * _CHUNK_ELEMENTS


@dataclass(frozen=True)
class SyntheticLlama:
    hidden_size: int = 1024
    intermediate_size: int = 2816
    num_hidden_layers: int = 8
    num_attention_heads: int = 16
    num_key_value_heads: int = 4
    vocab_size: int = 32000
    tie_word_embeddings: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        H, inter, d = self.hidden_size, self.intermediate_size, self.head_dim
        q, kv = self.num_attention_heads * d, self.num_key_value_heads * d
        out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (self.vocab_size, H))]
        for i in range(self.num_hidden_layers):
            p = f"model.layers.{i}."
            out += [(p + "input_layernorm.weight", (H,)), (p + "self_attn.q_proj.weight", (q, H)),
                    (p + "self_attn.k_proj.weight", (kv, H)), (p + "self_attn.v_proj.weight", (kv, H)),
                    (p + "self_attn.o_proj.weight", (H, q)), (p + "post_attention_layernorm.weight", (H,)),
                    (p + "mlp.gate_proj.weight", (inter, H)), (p + "mlp.up_proj.weight", (inter, H)),
                    (p + "mlp.down_proj.weight", (H, inter))]
        out.append(("model.norm.weight", (H,)))
        if not self.tie_word_embeddings:
            out.append(("lm_head.weight", (self.vocab_size, H)))
        return out

    def nbytes(self, dtype: torch.dtype) -> int:
        size = torch.empty((), dtype=dtype).element_size()
        return sum(torch.Size(s).numel() for _, s in self.tensors()) * size

    def config(self, dtype: torch.dtype) -> dict:
        cfg = dict(asdict(self))
        cfg.update(architectures=["LlamaForCausalLM"], model_type="llama", head_dim=self.head_dim,
                   hidden_act="silu", max_position_embeddings=4096, rms_norm_eps=1e-5,
                   rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
                   dtype={torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}[dtype])
        return cfg


def scaled_to(target_bytes: int, dtype: torch.dtype = torch.bfloat16, base: SyntheticLlama | None = None
              ) -> SyntheticLlama:
    """``base`` with as many layers as fit ``target_bytes`` (at least one)."""
    base = base or SyntheticLlama()
    one = SyntheticLlama(**{**asdict(base), "num_hidden_layers": 1})
    two = SyntheticLlama(**{**asdict(base), "num_hidden_layers": 2})
    per_layer = two.nbytes(dtype) - one.nbytes(dtype)
    fixed = one.nbytes(dtype) - per_layer
    layers = max(1, (target_bytes - fixed) // per_layer)
    return SyntheticLlama(**{**asdict(base), "num_hidden_layers": int(layers)})


def write_synthetic_llama(folder: Path, model: SyntheticLlama, dtype: torch.dtype = torch.bfloat16,
                          seed: int = 0) -> int:
    """Write config.json + model.safetensors into ``folder``; returns the safetensors file size."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(model.config(dtype), indent=2))
    assert dtype in DTYPE_NAMES
    entries = [HeaderEntry(name, dtype, shape) for name, shape in model.tensors()]
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
                writer.write_tensor_bytes(src[offset:offset + count])
        writer.close(sync=False)
    finally:
        writer.abort()
    return path.stat().st_size
