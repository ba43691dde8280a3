"""FP8 post-training quantization (ModelOpt) of HF checkpoints; see ``fp8.py``.

Importing this package is cheap: torch, transformers and ModelOpt load only when
``quantize_fp8`` runs, so the planner can use ``is_modelopt_fp8_checkpoint`` freely.
"""

from pipeline.quantize.calibration import DEFAULT_CALIBRATION, CalibrationSample, read_calibration
from pipeline.quantize.checks import is_modelopt_fp8_checkpoint, verify_fp8_export
from pipeline.quantize.fp8 import AmaxStats, QuantizeSummary, fp8_quant_config, quantize_fp8

__all__ = [
    "DEFAULT_CALIBRATION",
    "AmaxStats",
    "CalibrationSample",
    "QuantizeSummary",
    "fp8_quant_config",
    "is_modelopt_fp8_checkpoint",
    "quantize_fp8",
    "read_calibration",
    "verify_fp8_export",
]
