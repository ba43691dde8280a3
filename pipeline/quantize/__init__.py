"""FP8 post-training quantization (ModelOpt) of HF checkpoints; see ``fp8.py``.

Importing this package is cheap: torch, transformers and ModelOpt load only when
``quantize_fp8`` runs, so the planner can use ``is_modelopt_fp8_checkpoint`` freely.
"""

from __future__ import annotations

import importlib
from typing import Any

# Imported on first use: the planner reads pipeline.quantize.calibration and .checks directly.
_EXPORTS = {
    "DEFAULT_CALIBRATION": "calibration",
    "CalibrationSample": "calibration",
    "read_calibration": "calibration",
    "is_modelopt_fp8_checkpoint": "checks",
    "verify_fp8_export": "checks",
    "AmaxStats": "fp8",
    "QuantizeSummary": "fp8",
    "fp8_quant_config": "fp8",
    "quantize_fp8": "fp8",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'pipeline.quantize' has no attribute {name!r}")
    return getattr(importlib.import_module(f"pipeline.quantize.{_EXPORTS[name]}"), name)
