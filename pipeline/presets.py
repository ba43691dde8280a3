"""Model architectures, read from a Hugging Face config or from a named preset.

Presets let ``plan``/``validate`` run for a 70B model before anyone downloads the
weights: the numbers below are the published ``config.json`` values of each model.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import InputError

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")


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


def rope_from_hf_config(config: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from an HF config of transformers 4 or 5.

    transformers 5 keeps both in ``rope_parameters``; older configs use ``rope_theta`` and
    ``rope_scaling``. Missing the former silently gives TensorRT-LLM's default 10000.
    """
    params = config.get("rope_parameters") or {}
    theta = config.get("rope_theta") or params.get("rope_theta") or 10000.0
    scaling = config.get("rope_scaling") or {k: v for k, v in params.items() if k != "rope_theta"}
    rope_type = scaling.get("rope_type", scaling.get("type")) if scaling else None
    if not rope_type or rope_type == "default":
        return float(theta), None
    return float(theta), dict(scaling)


def arch_from_hf_config(config_path: Path) -> ModelArch:
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise InputError(f"{config_path}: not found; is this a Hugging Face checkpoint folder?") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{config_path}: cannot read model config ({exc})") from None
    architecture = (config.get("architectures") or ["?"])[0]
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise InputError(
            f"{config_path}: architecture '{architecture}' is not supported "
            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)}: the Llama family)"
        )
    try:
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        theta, scaling = rope_from_hf_config(config)
        return ModelArch(
            name=config_path.parent.name,
            vocab_size=int(config["vocab_size"]),
            hidden_size=hidden,
            num_layers=int(config["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            intermediate_size=int(config["intermediate_size"]),
            max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
            rope_theta=theta,
            rope_scaling=scaling,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            norm_epsilon=float(config.get("rms_norm_eps", 1e-5)),
            architecture=architecture,
        )
    except KeyError as exc:
        raise InputError(f"{config_path}: missing key {exc} in model config") from None
