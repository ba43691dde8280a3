"""Model architectures, read from a Hugging Face config or from a named preset.

Presets let ``plan``/``validate`` run for a 70B model before anyone downloads the
weights: the numbers below are the published ``config.json`` values of each model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import InputError
from pipeline.files import read_json
from pipeline.hf_config import parse_llama_config


@dataclass(frozen=True)
class ModelArch:
    name: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int
    rope_theta: float
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    norm_epsilon: float = 1e-5
    architecture: str = "LlamaForCausalLM"

    def decoder_layer_params(self) -> int:
        attention = self.hidden_size * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        mlp = 3 * self.hidden_size * self.intermediate_size
        return attention + mlp + 2 * self.hidden_size

    def total_params(self) -> int:
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * self.decoder_layer_params() + embeddings + self.hidden_size

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _llama3_scaling(factor: float, original: int) -> dict[str, Any]:
    return {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": original,
    }


_LLAMA31_8B = ModelArch("llama-3.1-8b", 128256, 4096, 32, 32, 8, 128, 14336, 131072, 500000.0,
                        _llama3_scaling(8.0, 8192))
_LLAMA31_70B = ModelArch("llama-3.1-70b", 128256, 8192, 80, 64, 8, 128, 28672, 131072, 500000.0,
                         _llama3_scaling(8.0, 8192))
_LLAMA2_7B = ModelArch("llama-2-7b", 32000, 4096, 32, 32, 32, 128, 11008, 4096, 10000.0, norm_epsilon=1e-5)

PRESETS: dict[str, ModelArch] = {
    arch.name: arch
    for arch in (
        _LLAMA31_8B,
        _LLAMA31_70B,
        dataclasses.replace(_LLAMA31_70B, name="llama-3.3-70b"),
        ModelArch("llama-3-8b", 128256, 4096, 32, 32, 8, 128, 14336, 8192, 500000.0),
        ModelArch("llama-3-70b", 128256, 8192, 80, 64, 8, 128, 28672, 8192, 500000.0),
        ModelArch("llama-3.2-1b", 128256, 2048, 16, 32, 8, 64, 8192, 131072, 500000.0,
                  _llama3_scaling(32.0, 8192), tie_word_embeddings=True),
        ModelArch("llama-3.2-3b", 128256, 3072, 28, 24, 8, 128, 8192, 131072, 500000.0,
                  _llama3_scaling(32.0, 8192), tie_word_embeddings=True),
        _LLAMA2_7B,
        dataclasses.replace(_LLAMA2_7B, name="vicuna-7b-v1.3", max_position_embeddings=2048, norm_epsilon=1e-6),
        ModelArch("smollm2-135m-instruct", 49152, 576, 30, 9, 3, 64, 1536, 8192, 100000.0,
                  tie_word_embeddings=True),
    )
}


def preset(name: str) -> ModelArch:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown architecture preset '{name}' (known: {', '.join(PRESETS)})") from None


def arch_from_hf_config(config_path: Path) -> ModelArch:
    """The architecture of a Hugging Face folder, by the converter's own config rules."""
    config = read_json(config_path, "model config")
    if not isinstance(config, dict):
        raise InputError(f"{config_path}: model config must be a JSON object, got {type(config).__name__}")
    spec = parse_llama_config(config, str(config_path))
    return ModelArch(
        name=config_path.parent.name, vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
        num_layers=spec.num_layers, num_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim, intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_position_embeddings, rope_theta=spec.rope_theta,
        rope_scaling=spec.rope_scaling, tie_word_embeddings=spec.tie_word_embeddings,
        norm_epsilon=spec.rms_norm_eps, architecture="LlamaForCausalLM",
    )
