"""The shape of a Llama-family model: one record from the spec to the runtime.

:class:`ModelGeometry` is what the planner (presets, memory, resources), the converter, the head
trainer, the synthetic checkpoints and the reference runtime know of a model. It is built from a
Hugging Face ``config.json`` (:meth:`ModelGeometry.from_hf`), a TensorRT-LLM ``pretrained_config``
(:meth:`ModelGeometry.from_trtllm`), or a preset (pipeline/spec/presets.py).

``from_hf`` is one parser for the planner and the converter, so ``validate`` refuses exactly the
configs the converter would: wrong types (``"sixty-four"``, a list for an object), non-integers
where TensorRT-LLM needs integers (``num_attention_heads: 4.7`` is not truncated to 4), non-finite
numbers (``rope_theta: "nan"``) and architectures the converter does not take.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from pipeline.errors import InputError

SUPPORTED_ARCHITECTURE = "LlamaForCausalLM"
# ModelOpt's Medusa wrapper exports a Llama base plus ``medusa_heads.*`` under this name.
_ARCHITECTURE_ALIASES = ("MedusaLlamaForCausalLM",)
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class ModelGeometry:
    name: str  # the preset's name, or the checkpoint folder's
    vocab_size: int
    hidden_size: int
    num_layers: int  # decoder layers (HF num_hidden_layers)
    num_heads: int  # query heads (HF num_attention_heads)
    num_kv_heads: int  # HF num_key_value_heads
    head_dim: int  # TensorRT-LLM head_size
    intermediate_size: int
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0  # TensorRT-LLM rotary_base
    # None for plain RoPE; otherwise the HF dict minus rope_theta, kept whole (llama3 needs
    # factor, low/high_freq_factor and original_max_position_embeddings). TensorRT-LLM rotary_scaling.
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    norm_epsilon: float = 1e-5  # HF rms_norm_eps
    architecture: str = SUPPORTED_ARCHITECTURE

    def decoder_layer_params(self) -> int:
        attention = self.hidden_size * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        mlp = 3 * self.hidden_size * self.intermediate_size
        return attention + mlp + 2 * self.hidden_size

    def total_params(self) -> int:
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * self.decoder_layer_params() + embeddings + self.hidden_size

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_hf(
        cls, cfg: dict[str, Any], where: str, *, name: str = "", require_architecture: bool = True
    ) -> ModelGeometry:
        """Validate a HF LlamaConfig dict; ``where`` names the file in error messages."""
        return _from_hf(cfg, where, name, require_architecture)

    @classmethod
    def from_trtllm(cls, pc: dict[str, Any], where: str) -> ModelGeometry:
        """From a TensorRT-LLM checkpoint's (or engine's) ``pretrained_config``."""
        return _from_trtllm(pc, where)


_MISSING = object()
# Larger than any real model; keeps every derived product inside TensorRT-LLM's int32 sizes.
_MAX_DIM = 1 << 24


def _int(cfg: dict[str, Any], key: str, where: str, default: Any = _MISSING) -> int:
    """``cfg[key]`` as a positive int; a float, string or bool is refused (``int(4.7)`` would truncate)."""
    value = cfg.get(key)
    if value is None:
        if default is _MISSING:
            raise InputError(f"{where}: missing field {key}")
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise InputError(f"{where}: {key} must be a whole number, got {type(value).__name__} {value!r}")
    if not 0 < value <= _MAX_DIM:
        raise InputError(f"{where}: {key} must be between 1 and {_MAX_DIM}, got {value}")
    return value


def _float(cfg: dict[str, Any], key: str, where: str, default: float) -> float:
    """``cfg[key]`` as a positive finite number; strings ("nan") and bools are refused."""
    value = cfg.get(key)
    if value is None:
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not (math.isfinite(value) and value > 0):
        raise InputError(f"{where}: {key} must be a positive finite number, got {value!r}")
    return float(value)


def _bool(cfg: dict[str, Any], key: str, where: str) -> bool:
    value = cfg.get(key, False)
    if not isinstance(value, bool):
        raise InputError(f"{where}: {key} must be true or false, got {value!r}")
    return value


def rope_from_config(cfg: dict[str, Any], where: str) -> tuple[float, dict[str, Any] | None]:
    """(theta, scaling) from transformers-5 ``rope_parameters`` or the older ``rope_theta``/``rope_scaling``."""
    params = cfg.get("rope_parameters")
    legacy = cfg.get("rope_scaling")
    if isinstance(params, dict) and "rope_theta" in params:
        theta = _float(params, "rope_theta", f"{where} rope_parameters", 10000.0)
        scaling: dict[str, Any] | None = {k: v for k, v in params.items() if k != "rope_theta"}
    else:
        theta = _float(cfg, "rope_theta", where, 10000.0)
        if legacy is not None and not isinstance(legacy, dict):
            raise InputError(f"{where}: rope_scaling must be an object or null, got {legacy!r}")
        scaling = dict(legacy) if isinstance(legacy, dict) else None
    if scaling is not None:
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise InputError(
                f"{where}: rope type {rope_type!r} is not supported by the converter "
                f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
            )
        if rope_type == "default":
            return theta, None
        scaling.pop("type", None)
        scaling["rope_type"] = rope_type
        needed = (
            ("factor",)
            if rope_type == "linear"
            else ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        )
        missing = [k for k in needed if k not in scaling]
        if missing:
            raise InputError(f"{where}: {rope_type} rope scaling lacks {', '.join(missing)}")
        for key in needed:
            _float(scaling, key, f"{where} rope scaling", 1.0)
    if not (theta > 0 and math.isfinite(theta)):
        raise InputError(f"{where}: rope_theta must be a positive number, got {theta}")
    return theta, scaling


def _from_hf(cfg: dict[str, Any], where: str, name: str, require_architecture: bool) -> ModelGeometry:
    if require_architecture:
        archs = cfg.get("architectures") or []
        archs = [str(a) for a in archs] if isinstance(archs, list) else [repr(archs)]
        model_type = cfg.get("model_type")
        if (
            len(archs) != 1
            or archs[0] not in (SUPPORTED_ARCHITECTURE, *_ARCHITECTURE_ALIASES)
            or model_type not in (None, "llama")
        ):
            got = ", ".join(archs) if archs else f"model_type {model_type!r}"
            raise InputError(
                f"{where}: unsupported architecture {got}; this converter supports "
                f"{SUPPORTED_ARCHITECTURE} (model_type llama) only"
            )
    theta, scaling = rope_from_config(cfg, where)
    hidden = _int(cfg, "hidden_size", where)
    heads = _int(cfg, "num_attention_heads", where)
    hidden_act = str(cfg.get("hidden_act", "silu"))
    if hidden_act != "silu":
        raise InputError(f"{where}: hidden_act {hidden_act!r} is not supported (Llama uses silu)")
    spec = ModelGeometry(
        name=name,
        vocab_size=_int(cfg, "vocab_size", where),
        hidden_size=hidden,
        intermediate_size=_int(cfg, "intermediate_size", where),
        num_layers=_int(cfg, "num_hidden_layers", where),
        num_heads=heads,
        num_kv_heads=_int(cfg, "num_key_value_heads", where, heads),
        head_dim=_int(cfg, "head_dim", where, hidden // heads if heads > 0 else 0),
        norm_epsilon=_float(cfg, "rms_norm_eps", where, 1e-6),
        max_position_embeddings=_int(cfg, "max_position_embeddings", where, 2048),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_word_embeddings=_bool(cfg, "tie_word_embeddings", where),
    )
    for flag in ("attention_bias", "mlp_bias"):
        if cfg.get(flag):
            raise InputError(f"{where}: {flag}=true is not supported by this converter (Llama has no biases)")
    for name in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_layers",
        "num_heads",
        "num_kv_heads",
        "head_dim",
    ):
        if getattr(spec, name) <= 0:
            raise InputError(f"{where}: {name} must be positive, got {getattr(spec, name)}")
    if spec.num_heads % spec.num_kv_heads:
        raise InputError(
            f"{where}: num_attention_heads {spec.num_heads} is not a multiple of "
            f"num_key_value_heads {spec.num_kv_heads}"
        )
    return spec


def config_value(section: dict[str, Any], key: str, where: str, kind: type, default: Any = _MISSING) -> Any:
    """``section[key]`` of a TensorRT-LLM config converted to ``kind``; a missing or null key takes
    ``default`` (required when there is none)."""
    value = section.get(key)
    if value is None:
        if default is _MISSING:
            raise InputError(f"{where}: missing {key}; rebuild the engine")
        return default
    try:
        converted = kind(value)
    except (TypeError, ValueError):
        raise InputError(f"{where}: {key} must be {kind.__name__}, got {value!r}") from None
    if kind is float and not math.isfinite(converted):
        raise InputError(f"{where}: {key} must be a finite number, got {value!r}")
    return converted


def _from_trtllm(pc: dict[str, Any], where: str) -> ModelGeometry:
    def get(key: str, kind: type, default: Any) -> Any:
        return config_value(pc, key, where, kind, default)

    hidden = get("hidden_size", int, _MISSING)
    heads = get("num_attention_heads", int, _MISSING)
    scaling = pc.get("rotary_scaling")
    geometry = ModelGeometry(
        name="",
        architecture=str(pc.get("architecture")),
        vocab_size=get("vocab_size", int, _MISSING),
        hidden_size=hidden,
        num_layers=get("num_hidden_layers", int, _MISSING),
        num_heads=heads,
        num_kv_heads=get("num_key_value_heads", int, heads),
        head_dim=get("head_size", int, hidden // max(heads, 1)),
        intermediate_size=get("intermediate_size", int, 4 * hidden),
        max_position_embeddings=get("max_position_embeddings", int, 2048),
        norm_epsilon=get("norm_epsilon", float, 1e-5),
        rope_theta=get("rotary_base", float, 10000.0),
        rope_scaling=scaling if isinstance(scaling, dict) else None,
    )
    for name, key in (
        ("vocab_size", "vocab_size"),
        ("hidden_size", "hidden_size"),
        ("num_layers", "num_layers"),
        ("num_heads", "num_heads"),
        ("num_kv_heads", "num_kv_heads"),
        ("head_dim", "head_size"),
        ("intermediate_size", "intermediate_size"),
    ):
        if getattr(geometry, name) <= 0:
            raise InputError(f"{where}: {key} must be positive, got {getattr(geometry, name)}")
    if geometry.num_heads % geometry.num_kv_heads:
        raise InputError(
            f"{where}: num_attention_heads {geometry.num_heads} is not a multiple of "
            f"num_key_value_heads {geometry.num_kv_heads}"
        )
    if pc.get("position_embedding_type", "rope_gpt_neox") != "rope_gpt_neox":
        raise InputError(
            f"{where}: position_embedding_type {pc['position_embedding_type']!r} is not supported "
            "(Llama uses rope_gpt_neox)"
        )
    if pc.get("hidden_act", "silu") != "silu":
        raise InputError(f"{where}: hidden_act {pc['hidden_act']!r} is not supported (Llama uses silu)")
    return geometry
