"""Model geometries, read from a Hugging Face config or from a named preset.

Presets let ``plan``/``validate`` run for a 70B model before anyone downloads the
weights: the numbers below are the published ``config.json`` values of each model.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from pipeline.errors import InputError
from pipeline.geometry import ModelGeometry
from pipeline.io.files import read_json


def _llama3_scaling(factor: float, original: int) -> dict[str, Any]:
    return {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": original,
    }


_LLAMA31_8B = ModelGeometry(
    "llama-3.1-8b", 128256, 4096, 32, 32, 8, 128, 14336, 131072, 500000.0, _llama3_scaling(8.0, 8192)
)
_LLAMA31_70B = ModelGeometry(
    "llama-3.1-70b", 128256, 8192, 80, 64, 8, 128, 28672, 131072, 500000.0, _llama3_scaling(8.0, 8192)
)
_LLAMA2_7B = ModelGeometry("llama-2-7b", 32000, 4096, 32, 32, 32, 128, 11008, 4096, 10000.0, norm_epsilon=1e-5)

PRESETS: dict[str, ModelGeometry] = {
    arch.name: arch
    for arch in (
        _LLAMA31_8B,
        _LLAMA31_70B,
        dataclasses.replace(_LLAMA31_70B, name="llama-3.3-70b"),
        ModelGeometry("llama-3-8b", 128256, 4096, 32, 32, 8, 128, 14336, 8192, 500000.0),
        ModelGeometry("llama-3-70b", 128256, 8192, 80, 64, 8, 128, 28672, 8192, 500000.0),
        ModelGeometry(
            "llama-3.2-1b",
            128256,
            2048,
            16,
            32,
            8,
            64,
            8192,
            131072,
            500000.0,
            _llama3_scaling(32.0, 8192),
            tie_word_embeddings=True,
        ),
        ModelGeometry(
            "llama-3.2-3b",
            128256,
            3072,
            28,
            24,
            8,
            128,
            8192,
            131072,
            500000.0,
            _llama3_scaling(32.0, 8192),
            tie_word_embeddings=True,
        ),
        _LLAMA2_7B,
        dataclasses.replace(_LLAMA2_7B, name="vicuna-7b-v1.3", max_position_embeddings=2048, norm_epsilon=1e-6),
        ModelGeometry(
            "smollm2-135m-instruct", 49152, 576, 30, 9, 3, 64, 1536, 8192, 100000.0, tie_word_embeddings=True
        ),
    )
}


def preset(name: str) -> ModelGeometry:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown architecture preset '{name}' (known: {', '.join(PRESETS)})") from None


def geometry_from_hf_config(config_path: Path) -> ModelGeometry:
    """The geometry of a Hugging Face folder, by the converter's own config rules."""
    config = read_json(config_path, "model config")
    if not isinstance(config, dict):
        raise InputError(f"{config_path}: model config must be a JSON object, got {type(config).__name__}")
    return ModelGeometry.from_hf(config, str(config_path), name=config_path.parent.name)
