"""Recognising ModelOpt FP8 checkpoints, and verifying the ones we export.

Only JSON files and safetensors headers (plus 0-d scale tensors) are read, so these are
cheap enough for the planner.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pipeline.errors import InputError, StageError
from pipeline.quantize.hf import read_json

FP8_DTYPE = "F8_E4M3"  # safetensors' name for torch.float8_e4m3fn
# Scale tensors are fp32 by contract (TRT-LLM and vLLM read them as float32).
SCALE_DTYPE = "F32"


def is_modelopt_fp8_checkpoint(hf_dir: Path) -> bool:
    """True for a ModelOpt unified HF FP8 export: the quantize stage must be skipped.

    Recognised by ``hf_quant_config.json`` (producer modelopt, quant_algo FP8) or, for exports
    whose side file was dropped, by config.json's ``quantization_config`` (quant_method modelopt).
    """
    hf_dir = Path(hf_dir)
    side_file = hf_dir / "hf_quant_config.json"
    if side_file.is_file():
        data = read_json(side_file)
        producer = (data.get("producer") or {}).get("name", "")
        algo = (data.get("quantization") or {}).get("quant_algo")
        if str(producer).lower() == "modelopt" and _is_fp8(algo):
            return True
    config_file = hf_dir / "config.json"
    if config_file.is_file():
        quant = read_json(config_file).get("quantization_config") or {}
        if isinstance(quant, dict) and str(quant.get("quant_method", "")).lower() == "modelopt":
            return _is_fp8(quant.get("quant_algo"))
    return False


def existing_quantization(hf_dir: Path) -> str | None:
    """The quant_method an HF folder already carries (``None`` for a plain checkpoint)."""
    config_file = Path(hf_dir) / "config.json"
    if not config_file.is_file():
        return None
    quant = read_json(config_file).get("quantization_config")
    if not quant:
        return None
    return str(quant.get("quant_method", "unknown")) if isinstance(quant, dict) else "unknown"


def _is_fp8(algo: Any) -> bool:
    # Only per-tensor FP8: the converter handles weight_scale/input_scale as 0-d scalars.
    return isinstance(algo, str) and algo.upper() == "FP8"


def verify_fp8_export(
    out_dir: Path,
    quantized_linears: Iterable[str],
    kv_attention: Iterable[str],
    *,
    kv_cache_fp8: bool,
    has_input_scale: bool = True,
) -> int:
    """Check an ``export_hf_checkpoint`` folder; StageError naming the first missing/bad tensor.

    ``quantized_linears``: module names whose weight quantizer was enabled; each needs an F8_E4M3
    ``weight``, an F32 ``weight_scale`` and ``input_scale``. ``kv_attention``: attention modules
    with calibrated k/v quantizers; each needs ``k_proj.k_scale`` and ``v_proj.v_scale``. No other
    tensor may be FP8 (lm_head, embeddings and excluded modules stay in the export dtype).
    Returns the number of tensors checked.
    """
    from safetensors import safe_open

    out_dir = Path(out_dir)
    quant_file = out_dir / "hf_quant_config.json"
    if not quant_file.is_file():
        raise StageError(f"{out_dir}: the ModelOpt export wrote no hf_quant_config.json")
    quant = read_json(quant_file).get("quantization") or {}
    if not _is_fp8(quant.get("quant_algo")):
        raise StageError(f"{quant_file}: quant_algo is {quant.get('quant_algo')!r}, expected 'FP8'")
    want_kv = "FP8" if kv_cache_fp8 else None
    if quant.get("kv_cache_quant_algo") != want_kv:
        raise StageError(
            f"{quant_file}: kv_cache_quant_algo is {quant.get('kv_cache_quant_algo')!r}, expected {want_kv!r}"
        )

    files = sorted(out_dir.glob("*.safetensors"))
    if not files:
        raise StageError(f"{out_dir}: the ModelOpt export wrote no .safetensors files")
    dtypes: dict[str, str] = {}
    where: dict[str, Path] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():
                dtypes[key] = handle.get_slice(key).get_dtype()
                where[key] = file

    def need(name: str, dtype: str) -> None:
        if name not in dtypes:
            raise StageError(f"{out_dir}: FP8 export is missing tensor '{name}'")
        if dtypes[name] != dtype:
            raise StageError(f"{out_dir}: tensor '{name}' is {dtypes[name]}, expected {dtype}")

    scales: list[str] = []
    expected_fp8 = set()
    for module in quantized_linears:
        need(f"{module}.weight", FP8_DTYPE)
        expected_fp8.add(f"{module}.weight")
        scales.append(f"{module}.weight_scale")
        if has_input_scale:
            scales.append(f"{module}.input_scale")
    if kv_cache_fp8:
        attention = list(kv_attention)
        if not attention:
            raise StageError(f"{out_dir}: kv_cache_fp8 was requested but no attention module was calibrated")
        for module in attention:
            scales += [f"{module}.k_proj.k_scale", f"{module}.v_proj.v_scale"]
    for name in scales:
        need(name, SCALE_DTYPE)

    unexpected = sorted(k for k, d in dtypes.items() if d == FP8_DTYPE and k not in expected_fp8)
    if unexpected:
        raise StageError(f"{out_dir}: tensor '{unexpected[0]}' is FP8 but its module was excluded from quantization")

    _check_scale_values(scales, where, out_dir)
    return len(dtypes)


def _check_scale_values(names: list[str], where: dict[str, Path], out_dir: Path) -> None:
    """A zero/NaN scale means a quantizer saw no data; TRT-LLM would build a silent garbage engine."""
    from safetensors import safe_open

    by_file: dict[Path, list[str]] = {}
    for name in names:
        by_file.setdefault(where[name], []).append(name)
    for file, keys in by_file.items():
        with safe_open(str(file), framework="pt") as handle:
            for key in keys:
                values = handle.get_tensor(key).float().flatten().tolist()
                if not values or not all(math.isfinite(v) and v > 0 for v in values):
                    raise StageError(
                        f"{out_dir}: tensor '{key}' has a non-positive or non-finite value "
                        f"({values[:4]}); its quantizer saw no calibration data"
                    )


def require_plain_checkpoint(hf_dir: Path) -> None:
    """InputError unless ``hf_dir`` is an unquantized HF model folder."""
    hf_dir = Path(hf_dir)
    if not hf_dir.is_dir():
        raise InputError(f"{hf_dir}: model folder not found")
    if not (hf_dir / "config.json").is_file():
        raise InputError(f"{hf_dir}: no config.json; give a Hugging Face model folder (config.json + *.safetensors)")
    if is_modelopt_fp8_checkpoint(hf_dir):
        raise InputError(f"{hf_dir}: already a ModelOpt FP8 checkpoint; skip the quantize stage (convert it directly)")
    method = existing_quantization(hf_dir)
    if method is not None:
        raise InputError(
            f"{hf_dir}: already quantized (quant_method '{method}'); FP8 PTQ needs the unquantized checkpoint"
        )
