"""The files ``calibrate`` reads, checked like checkpoints: a ``bench.json`` run and a calibration file.

Each field is checked for what it is (an integer is not a bool or 2.7, a rate is finite and
positive, an acceptance length lies between 1 and what a draft can add), and a bad one is refused in
one line naming the file and the field: a NaN tokens/s would otherwise fail deep in a least-squares
fit, and an infinite one be written into a calibration that then drives ``best`` and the release
gates. Files are read as regular files only (a FIFO would hang the reader) and through
:func:`pipeline.io.files.read_json` (size and nesting bounded).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from pipeline.errors import InputError
from pipeline.geometry import ModelGeometry
from pipeline.io.files import read_json

MAX_TOKENS_PER_SECOND = 1e7  # far above any server; a larger figure is a broken file
MAX_ACCEPTANCE_LENGTH = 1 + 1024  # a step accepts at most its draft (TensorRT-LLM: max_draft_len <= 1024)
MAX_CONCURRENCY = 1 << 16


class FieldError(ValueError):
    """A field that is not what it must be: its dotted name and what it must be."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")


def read_object(path: Path, what: str) -> dict[str, Any]:
    """A JSON object from a regular file; InputError naming the file otherwise."""
    body = read_json(path, what, max_bytes=16 * 2**20)
    if not isinstance(body, dict):
        raise InputError(f"{path}: {what} must be a JSON object")
    return body


def integer(body: dict, key: str, low: int, high: int, where: str = "") -> int:
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise FieldError(where + key, f"{value!r} is not a whole number from {low} to {high}")
    return value


def number(body: dict, key: str, low: float, high: float, where: str = "", *, open_low: bool = False) -> float:
    value = body.get(key)
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        if (value > low if open_low else value >= low) and value <= high:
            return float(value)
    bound = f"above {low}" if open_low else f"from {low}"
    raise FieldError(where + key, f"{value!r} is not a finite number {bound} to {high:g}")


def choice(body: dict, key: str, choices: tuple[str, ...], where: str = "") -> str:
    value = body.get(key)
    if value not in choices:
        raise FieldError(where + key, f"{value!r} is not one of {', '.join(choices)}")
    return value


def section(body: dict, key: str, where: str = "") -> dict:
    value = body.get(key)
    if not isinstance(value, dict):
        raise FieldError(where + key, "missing, or not an object")
    return value


def batch_mix(value: Any, where: str = "batch_mix") -> tuple[tuple[int, float], ...]:
    """``{"requests decoding": share of the decode steps}``, the shares adding up to 1."""
    if value in (None, {}):
        return ()
    if not isinstance(value, dict):
        raise FieldError(where, "not an object of {requests decoding: share}")
    mix = []
    for key in value:
        if not (isinstance(key, str) and key.isdigit() and 1 <= int(key) <= MAX_CONCURRENCY):
            raise FieldError(f"{where}.{key}", "a batch must be a whole number of requests >= 1")
        mix.append((int(key), number(value, key, 0.0, 1.0, where + ".")))
    if abs(sum(share for _, share in mix) - 1) > 1e-6:
        raise FieldError(where, f"the shares add up to {sum(s for _, s in mix):.6g}, not 1")
    return tuple(sorted(mix))


def architecture(body: dict, where: str) -> dict[str, Any]:
    """The served model's geometry fields (pipeline.geometry.ModelGeometry), each a positive whole number."""
    arch = section(body, "arch", where)
    unknown = sorted(set(arch) - {f.name for f in dataclasses.fields(ModelGeometry)})
    if unknown:
        raise FieldError(f"{where}arch.{unknown[0]}", "not a field of the served model's geometry")
    names = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size")
    for name in names:
        integer(arch, name, 1, 1 << 24, where + "arch.")
    return arch
