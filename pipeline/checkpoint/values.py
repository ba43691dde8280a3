"""Checks on the numbers inside tensors, streamed a chunk of rows at a time.

Headers tell shapes and dtypes; only the values tell a corrupt export (NaN, Inf). The convert
stage checks what it writes as it streams (:mod:`pipeline.checkpoint.trtllm_writer`); the inputs
other stages hand to a library that would fail without naming a tensor (ModelOpt's calibration:
``AssertionError: detected nan values in amax``) or would carry the values along silently (a LoRA
merge) are checked here first, naming file, tensor and row.

>>> import torch
>>> from pipeline.checkpoint.safetensors_io import StateDictSource
>>> source = StateDictSource("adapter.bin", {"w": torch.tensor([[1.0, 2.0], [3.0, float("nan")]])})
>>> non_finite_row(source, "w")
1
>>> require_finite(source, "w")
Traceback (most recent call last):
...
pipeline.errors.InputError: adapter.bin: tensor w holds NaN or Inf at row 1; the weights are corrupt, re-export them
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from pipeline.checkpoint.safetensors_io import TensorSource, itemsize
from pipeline.errors import InputError

CHUNK_BYTES = 16 * 1024 * 1024
_FLOATS = (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)


def non_finite_row(source: TensorSource, name: str) -> int | None:
    """The first row (index along dim 0) of tensor ``name`` holding NaN or Inf; None when all are finite."""
    meta = source.meta(name)
    if meta.dtype not in _FLOATS or meta.nbytes == 0:
        return None
    step = max(1, CHUNK_BYTES // (meta.row_width * itemsize(meta.dtype)))
    for start in range(0, meta.rows, step):
        stop = min(start + step, meta.rows)
        rows = source.read_rows(name, start, stop).reshape(stop - start, meta.row_width)  # (rows, row_width)
        if rows.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            rows = rows.float()
        # Any NaN or Inf makes the sum non-finite; a sum in the tensor's own dtype is 16x faster than
        # one in float64 and needs no temporary, and the rare finite sum that overflows is looked at row by row.
        if math.isfinite(float(rows.sum())):
            continue
        bad = (~torch.isfinite(rows)).any(dim=1).nonzero()
        if len(bad):
            return start + int(bad[0, 0])
    return None


def require_finite(source: TensorSource, name: str) -> None:
    """InputError naming file, tensor and row when tensor ``name`` of ``source`` holds NaN or Inf."""
    row = non_finite_row(source, name)
    if row is not None:
        raise InputError(
            f"{source.label}: tensor {name} holds NaN or Inf at row {row}; the weights are corrupt, re-export them"
        )


def require_all_finite(sources: Iterable[TensorSource]) -> int:
    """:func:`require_finite` for every tensor of every source; returns the number of tensors checked."""
    checked = 0
    for source in sources:
        for name in source.names():
            require_finite(source, name)
            checked += 1
    return checked
