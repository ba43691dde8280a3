"""The reference engine folder's ``config.json``, parsed once into typed, validated dataclasses.

Layout (TensorRT-LLM ``Engine.save``): ``{"version", "pretrained_config": <checkpoint config>,
"build_config": {...}}`` next to ``rank{r}.safetensors`` (the reference build keeps checkpoint
tensors where a GPU build has ``rank{r}.engine``). Only keys the C++ runtime also reads
(gptJsonConfig.cpp) are interpreted; the rest is kept in ``raw`` for later modules.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import InputError
from pipeline.geometry import ModelGeometry, config_value

ARCHITECTURES = ("LlamaForCausalLM", "MedusaForCausalLM", "EagleForCausalLM")
FLOAT_DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class Parallel:
    tp: int
    pp: int

    @property
    def world_size(self) -> int:
        return self.tp * self.pp


@dataclass(frozen=True)
class Quant:
    quant_algo: str | None  # "FP8" or None
    kv_cache_quant_algo: str | None  # "FP8" or None

    @property
    def fp8(self) -> bool:
        return self.quant_algo == "FP8"

    @property
    def fp8_kv(self) -> bool:
        return self.kv_cache_quant_algo == "FP8"


@dataclass(frozen=True)
class Limits:
    """Build-time limits the scheduler enforces (TensorRT-LLM enforces the same ones)."""

    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_num_tokens: int
    max_draft_len: int
    speculative_decoding_mode: str | int | None
    tokens_per_block: int
    max_beam_width: int = 1  # build_config.max_beam_width: the most beams a request may ask for
    gather_context_logits: bool = False  # build_config.gather_context_logits: return_context_logits allowed


@dataclass(frozen=True)
class EngineConfig:
    folder: Path
    version: str
    dtype: str  # the engine's float dtype (pretrained_config.dtype)
    model: ModelGeometry
    parallel: Parallel
    quant: Quant
    limits: Limits
    raw: dict[str, Any]  # the whole config.json, for method modules (Medusa heads, EAGLE, ...)

    def rank_file(self, rank: int) -> Path:
        return self.folder / f"rank{rank}.safetensors"


def load_engine_config(folder: Path) -> EngineConfig:
    folder = Path(folder)
    path = folder / "config.json"
    where = str(path)
    if not folder.is_dir():
        raise InputError(f"{folder}: engine folder not found")
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: missing; is {folder} an engine folder?") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("pretrained_config"), dict):
        raise InputError(
            f"{where}: no pretrained_config object; this is not an engine config.json "
            "(a checkpoint config.json has no build_config)"
        )
    pc = data["pretrained_config"]
    bc = data.get("build_config")
    if not isinstance(bc, dict):
        raise InputError(f"{where}: no build_config object; build the engine first")
    arch = str(pc.get("architecture"))
    if arch not in ARCHITECTURES:
        raise InputError(f"{where}: architecture {arch!r} is not supported (supported: {', '.join(ARCHITECTURES)})")
    dtype = str(pc.get("dtype"))
    if dtype not in FLOAT_DTYPES:
        raise InputError(f"{where}: dtype {dtype!r} is not supported (supported: {', '.join(FLOAT_DTYPES)})")
    pcw = f"{where} pretrained_config"
    model = ModelGeometry.from_trtllm(pc, pcw)
    mapping = pc.get("mapping") or {}
    tp = config_value(mapping, "tp_size", f"{pcw}.mapping", int, 1)
    pp = config_value(mapping, "pp_size", f"{pcw}.mapping", int, 1)
    world = config_value(mapping, "world_size", f"{pcw}.mapping", int, tp * pp)
    if tp < 1 or pp < 1 or world != tp * pp:
        raise InputError(f"{pcw}.mapping: world_size {world} must equal tp_size {tp} * pp_size {pp}")
    if int(mapping.get("cp_size", 1) or 1) != 1:
        raise InputError(f"{pcw}.mapping: context parallelism (cp_size > 1) is not supported")
    quant_section = pc.get("quantization") or {}
    quant = Quant(quant_section.get("quant_algo"), quant_section.get("kv_cache_quant_algo"))
    if quant.quant_algo not in (None, "FP8"):
        raise InputError(f"{pcw}.quantization: quant_algo {quant.quant_algo!r} is not supported (FP8 or null)")
    if quant.kv_cache_quant_algo not in (None, "FP8"):
        raise InputError(
            f"{pcw}.quantization: kv_cache_quant_algo {quant.kv_cache_quant_algo!r} is not supported (FP8 or null)"
        )
    bcw = f"{where} build_config"
    max_seq_len = config_value(bc, "max_seq_len", bcw, int)
    max_batch = config_value(bc, "max_batch_size", bcw, int)
    limits = Limits(
        max_batch_size=max_batch,
        max_input_len=config_value(bc, "max_input_len", bcw, int, max_seq_len),
        max_seq_len=max_seq_len,
        max_num_tokens=config_value(bc, "max_num_tokens", bcw, int, max_batch * max_seq_len),
        max_draft_len=config_value(bc, "max_draft_len", bcw, int, 0),
        speculative_decoding_mode=bc.get("speculative_decoding_mode"),
        tokens_per_block=config_value(bc.get("plugin_config") or {}, "tokens_per_block", bcw, int, 32),
        max_beam_width=config_value(bc, "max_beam_width", bcw, int, 1),
        gather_context_logits=bool(bc.get("gather_context_logits", False)),
    )
    for name in ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "max_beam_width"):
        if getattr(limits, name) <= 0:
            raise InputError(f"{bcw}: {name} must be positive, got {getattr(limits, name)}")
    config = EngineConfig(folder, str(data.get("version", "")), dtype, model, Parallel(tp, pp), quant, limits, data)
    missing = [config.rank_file(r).name for r in range(world) if not config.rank_file(r).is_file()]
    if missing:
        raise InputError(f"{folder}: missing {', '.join(missing)} (mapping world_size {world}); rebuild the engine")
    return config
