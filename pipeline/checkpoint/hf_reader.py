"""Open a Hugging Face Llama checkpoint folder (plain or ModelOpt FP8) without loading weights.

Only headers are read here; tensors stay on disk until the writer streams them. Everything a
conversion can fail on that is visible from metadata (architecture, missing/truncated files,
dtypes, FP8 layout) fails here, before the first output byte is written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pipeline.checkpoint.safetensors_io import SafetensorsFile, TensorMeta, TensorRef
from pipeline.errors import InputError
from pipeline.geometry import ModelGeometry
from pipeline.io.files import read_json

__all__ = ["FP8", "FP8Info", "HFCheckpoint", "open_hf_checkpoint"]

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FP8 = torch.float8_e4m3fn


@dataclass(frozen=True)
class FP8Info:
    """ModelOpt per-tensor FP8 (W8A8) export; ``kv_scales`` when it was calibrated with FP8_KV_CFG."""

    producer: str
    kv_scales: bool
    exclude_modules: tuple[str, ...]


def _load_json(path: Path, what: str) -> Any:
    if not path.exists() and not path.is_symlink():
        raise InputError(f"{path}: missing ({what})")
    return read_json(path, what)


def _detect_fp8(folder: Path, cfg: dict[str, Any]) -> FP8Info | None:
    qfile = folder / "hf_quant_config.json"
    quant: dict[str, Any] | None = None
    producer = ""
    where = str(qfile)
    if qfile.exists():
        data = _load_json(qfile, "ModelOpt quantization config")
        producer = str((data.get("producer") or {}).get("name", ""))
        quant = data.get("quantization") if isinstance(data.get("quantization"), dict) else None
        if producer != "modelopt" or quant is None:
            raise InputError(
                f"{where}: not a ModelOpt quantization config (producer {producer!r}); "
                "only ModelOpt FP8 exports are supported"
            )
    elif isinstance(cfg.get("quantization_config"), dict):
        qc = cfg["quantization_config"]
        where = f"{folder / 'config.json'} quantization_config"
        if qc.get("quant_method") != "modelopt":
            raise InputError(
                f"{where}: quant_method {qc.get('quant_method')!r} is not supported; "
                "only ModelOpt FP8 exports (quant_method modelopt) are"
            )
        producer = "modelopt"
        kv = qc.get("kv_cache_quant_algo") or ("FP8" if qc.get("kv_cache_scheme") else None)
        quant = {"quant_algo": qc.get("quant_algo"), "kv_cache_quant_algo": kv, "exclude_modules": qc.get("ignore", [])}
    if quant is None:
        return None
    if quant.get("quant_algo") != "FP8":
        raise InputError(
            f"{where}: quant_algo {quant.get('quant_algo')!r} is not supported; only per-tensor FP8 (quant_algo FP8) is"
        )
    kv = quant.get("kv_cache_quant_algo")
    if kv not in (None, "FP8"):
        raise InputError(f"{where}: kv_cache_quant_algo {kv!r} is not supported (FP8 or none)")
    return FP8Info(producer=producer, kv_scales=kv == "FP8", exclude_modules=tuple(quant.get("exclude_modules") or ()))


def _weight_files(folder: Path) -> tuple[list[Path], dict[str, str] | None]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        data = _load_json(index, "sharded checkpoint index")
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise InputError(f"{index}: no weight_map; re-export the checkpoint")
        files = sorted({str(v) for v in weight_map.values()})
        return [folder / f for f in files], {str(k): str(v) for k, v in weight_map.items()}
    single = folder / "model.safetensors"
    if single.exists():
        return [single], None
    shards = sorted(folder.glob("*.safetensors"))
    if shards:
        return shards, None
    if any(folder.glob("*.bin")) or any(folder.glob("*.pt")):
        raise InputError(
            f"{folder}: only pickle weights (*.bin/*.pt) found; the base model must be "
            "safetensors (re-save it with save_pretrained(safe_serialization=True))"
        )
    raise InputError(f"{folder}: no model.safetensors or model.safetensors.index.json")


@dataclass
class HFCheckpoint:
    path: Path
    config: dict[str, Any]
    spec: ModelGeometry
    fp8: FP8Info | None
    files: list[SafetensorsFile]
    tensors: dict[str, TensorRef] = field(default_factory=dict)
    _scalars: dict[str, float] = field(default_factory=dict, repr=False)

    def has(self, name: str) -> bool:
        return name in self.tensors

    def ref(self, name: str, why: str = "") -> TensorRef:
        try:
            return self.tensors[name]
        except KeyError:
            hint = f" ({why})" if why else ""
            raise InputError(
                f"{self.path}: tensor {name} is missing{hint}; the checkpoint is incomplete or not a Llama checkpoint"
            ) from None

    def meta(self, name: str) -> TensorMeta:
        return self.ref(name).meta

    def scalar(self, name: str) -> float:
        """A per-tensor scale (0-d or shape (1,)) as a Python float (exactly the stored fp32)."""
        if name in self._scalars:
            return self._scalars[name]
        ref = self.ref(name, "FP8 scale")
        meta = ref.meta
        if meta.dtype != torch.float32 or math.prod(meta.shape) != 1:
            raise InputError(
                f"{ref.where}: expected one float32 per-tensor scale, got {meta.dtype} "
                f"{list(meta.shape)}; only per-tensor FP8 is supported"
            )
        value = float(ref.read().reshape(()))
        if not (value > 0 and math.isfinite(value)):
            raise InputError(f"{ref.where}: scale must be positive and finite, got {value}; re-export it")
        self._scalars[name] = value
        return value

    def close(self) -> None:
        for f in self.files:
            f.close()


def open_hf_checkpoint(folder: Path) -> HFCheckpoint:
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"{folder}: not a directory (expected a Hugging Face model folder)")
    cfg = _load_json(folder / "config.json", "Hugging Face model config")
    if not isinstance(cfg, dict):
        raise InputError(f"{folder / 'config.json'}: not a JSON object")
    spec = ModelGeometry.from_hf(cfg, str(folder / "config.json"), name=folder.name)
    fp8 = _detect_fp8(folder, cfg)
    paths, weight_map = _weight_files(folder)
    files: list[SafetensorsFile] = []
    tensors: dict[str, TensorRef] = {}
    for path in paths:
        if weight_map is not None and not path.exists() and not path.is_symlink():
            raise InputError(f"{path}: listed in model.safetensors.index.json but missing")
        sf = SafetensorsFile(path)
        files.append(sf)
        for name in sf.names():
            if name in tensors:
                raise InputError(
                    f"{path}: tensor {name} also appears in {tensors[name].source.label}; "
                    "the shards overlap, re-export the checkpoint"
                )
            tensors[name] = TensorRef(sf, name)
    if weight_map is not None:
        for name, fname in weight_map.items():
            ref = tensors.get(name)
            if ref is None or Path(ref.source.label).name != fname:
                raise InputError(
                    f"{folder / fname}: tensor {name} listed in model.safetensors.index.json "
                    "is not in that file; the checkpoint is incomplete"
                )
    for ref in tensors.values():
        dtype = ref.meta.dtype
        if dtype == FP8 and fp8 is None:
            raise InputError(
                f"{ref.where} is float8 but the folder has no ModelOpt quantization config "
                "(hf_quant_config.json); only ModelOpt FP8 exports are supported"
            )
        if dtype not in _FLOAT_DTYPES and dtype != FP8:
            raise InputError(
                f"{ref.where} has dtype {dtype}; expected float32/float16/bfloat16{' or float8_e4m3fn' if fp8 else ''}"
            )
    return HFCheckpoint(folder, cfg, spec, fp8, files, tensors)
