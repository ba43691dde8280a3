"""The safetensors file format, read and written in bounded memory.

Why not ``safetensors.safe_open`` / ``save_file`` here:
* ``save_file`` needs every tensor of a rank in memory at once; a 70B rank file does not fit.
* ``safe_open`` memory-maps the whole file; every page we touch then counts in our RSS
  until the mapping is dropped, so a full pass over a 140 GB checkpoint looks like a
  140 GB process to the OOM killer and to RUSAGE. ``os.preadv`` into a reused buffer keeps
  the resident set at one chunk, and the kernel's page cache still does the caching.
* We want one-line errors that name the file for truncated or corrupt headers.

The reference forward and the tests read our output with the official library, which
keeps this module honest.

Format: 8-byte little-endian header length N, N bytes of JSON
``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``, then the
data; offsets are relative to the end of the header and must tile the data with no gaps.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from pipeline.errors import InputError
from pipeline.io.files import require_regular_file

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}

# A header larger than this is not a model checkpoint but a corrupt length field (the safetensors
# library's own limit, MAX_HEADER_SIZE).
_MAX_HEADER = 100_000_000
# Offsets and dimensions are usize in the reference implementation (huggingface/safetensors).
_USIZE_LIMIT = 2**64


_ITEMSIZE: dict[torch.dtype, int] = {}


def itemsize(dtype: torch.dtype) -> int:
    if dtype not in _ITEMSIZE:
        _ITEMSIZE[dtype] = torch.empty((), dtype=dtype).element_size()
    return _ITEMSIZE[dtype]


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


class Shaped:
    """``nbytes`` and ``row_width`` of a tensor record (a dataclass with ``dtype`` and ``shape`` fields):
    the source tensors here, the output tensors of :mod:`pipeline.checkpoint.sharding`."""

    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return numel(self.shape) * itemsize(self.dtype)

    @property
    def row_width(self) -> int:
        """Elements per index of dim 0 (1 for 1-D and 0-D tensors)."""
        return numel(self.shape[1:]) if len(self.shape) > 1 else 1


@dataclass(frozen=True)
class TensorMeta(Shaped):
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int  # absolute byte offset in the file (safetensors only; 0 elsewhere)

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 1


class TensorSource(Protocol):
    """Something tensors can be read from one slice at a time (a file, a loaded state dict)."""

    label: str

    def meta(self, name: str) -> TensorMeta: ...

    def names(self) -> list[str]: ...

    def read_rows(self, name: str, start: int, stop: int) -> torch.Tensor: ...

    def byte_span(self, name: str, start: int, stop: int) -> tuple[int, int, int] | None: ...


@dataclass(frozen=True)
class TensorRef:
    """One tensor of one source; what the conversion plan points at."""

    source: TensorSource
    name: str

    @property
    def meta(self) -> TensorMeta:
        return self.source.meta(self.name)

    @property
    def where(self) -> str:
        return f"{self.source.label}: tensor {self.name}"

    def read(self) -> torch.Tensor:
        meta = self.meta
        t = self.source.read_rows(self.name, 0, meta.rows)
        return t.reshape(meta.shape)


# -- the header, as strictly as the reference implementation reads it --------------------------------
# huggingface/safetensors deserializes each entry into {dtype: Dtype, shape: Vec<usize>,
# data_offsets: (usize, usize)} with serde: a float (``137472.5`` or ``8e0``), a string or a bool is
# refused where an integer belongs, and ``__metadata__`` must map strings to strings. Duplicate keys,
# which the library takes silently, are refused here: two readers could pick different tensors.


def _parse_header(raw: bytes, where: str) -> dict[str, object]:
    def no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
        keys = [key for key, _ in pairs]
        if len(set(keys)) != len(keys):
            twice = next(key for key in keys if keys.count(key) > 1)
            raise InputError(f"{where}: corrupt safetensors header: key {twice!r} appears twice; re-export it")
        return dict(pairs)

    def no_constant(token: str) -> object:  # NaN, Infinity: not JSON, and never an offset
        raise ValueError(token)

    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=no_duplicates, parse_constant=no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):  # JSONDecodeError is a ValueError
        raise InputError(f"{where}: corrupt safetensors header (not valid JSON); re-download or re-export it") from None
    if not isinstance(header, dict):
        raise InputError(f"{where}: corrupt safetensors header (not a JSON object); re-export it")
    return header


def _metadata(entry: object, where: str) -> dict[str, str]:
    if entry is None:
        return {}
    if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
        raise InputError(
            f"{where}: corrupt safetensors header: __metadata__ must map names to strings, got {entry!r:.80}; "
            "re-export it"
        )
    return dict(entry)


def _usize(value: object) -> bool:
    return type(value) is int and 0 <= value < _USIZE_LIMIT  # bool is an int subclass: refused


def _entry(name: str, entry: object, where: str) -> tuple[str, tuple[int, ...], tuple[int, int]]:
    """(dtype name, shape, (begin, end)) of one tensor entry, or InputError saying which field is wrong."""
    bad = f"{where}: corrupt safetensors header entry for tensor {name}"
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
        raise InputError(f"{bad}: needs dtype, shape and data_offsets; re-export it")
    dtype_name, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype_name, str):
        raise InputError(f"{bad}: dtype {dtype_name!r} is not a string; re-export it")
    if dtype_name not in DTYPES:
        raise InputError(f"{where}: tensor {name} has unsupported dtype {dtype_name}; supported: {', '.join(DTYPES)}")
    if not isinstance(shape, list) or not all(_usize(d) for d in shape):
        raise InputError(f"{bad}: shape {shape!r:.80} must be a list of non-negative integers; re-export it")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_usize(x) for x in offsets):
        raise InputError(
            f"{bad}: data_offsets {offsets!r:.80} must be two non-negative integers [begin, end]; "
            "the file is corrupt, re-export it"
        )
    return dtype_name, tuple(shape), (offsets[0], offsets[1])


class SafetensorsFile:
    """Header parsed and validated eagerly; data read with pread on demand."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.label = str(self.path)
        self._fd: int | None = None
        self._metadata: dict[str, str] = {}
        self._tensors = self._parse()

    def _parse(self) -> dict[str, TensorMeta]:
        where = self.label
        size = require_regular_file(self.path, "safetensors file").st_size
        try:
            with open(self.path, "rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise InputError(
                        f"{where}: truncated safetensors file ({size} bytes, no header); re-download or re-export it"
                    )
                (n,) = struct.unpack("<Q", head)
                if n > _MAX_HEADER or n > size - 8:
                    raise InputError(
                        f"{where}: corrupt or truncated safetensors file: header length {n} "
                        f"does not fit in {size} bytes; re-download or re-export it"
                    )
                raw = f.read(n)
        except OSError as exc:
            raise InputError(f"{where}: cannot read safetensors file: {exc.strerror or exc}") from None
        header = _parse_header(raw, where)
        data_start = 8 + n
        tensors: dict[str, TensorMeta] = {}
        spans: list[tuple[int, int, str]] = []
        for name, entry in header.items():
            if name == "__metadata__":
                self._metadata = _metadata(entry, where)
                continue
            dtype_name, shape, (begin, end) = _entry(name, entry, where)
            meta = TensorMeta(name, DTYPES[dtype_name], shape, data_start + begin)
            if end < begin or end - begin != meta.nbytes:
                raise InputError(
                    f"{where}: tensor {name}: data_offsets [{begin}, {end}] do not match "
                    f"dtype {dtype_name} shape {list(shape)} ({meta.nbytes} bytes); the file is corrupt, re-export it"
                )
            tensors[name] = meta
            spans.append((begin, end, name))
        spans.sort()
        pos = 0
        for begin, end, name in spans:
            if begin != pos:
                raise InputError(
                    f"{where}: tensor {name}: data_offsets overlap or leave a gap at byte {pos}; "
                    "the file is corrupt, re-export it"
                )
            pos = end
        have = size - data_start
        if have < pos:
            raise InputError(
                f"{where}: truncated safetensors file: header needs {pos} data bytes, "
                f"file has {have}; re-download or re-export it"
            )
        if have > pos:
            raise InputError(
                f"{where}: corrupt safetensors file: {have - pos} bytes after the last tensor; "
                "re-download or re-export it"
            )
        return tensors

    @property
    def metadata(self) -> dict[str, str]:
        return dict(self._metadata)

    def names(self) -> list[str]:
        return list(self._tensors)

    def meta(self, name: str) -> TensorMeta:
        try:
            return self._tensors[name]
        except KeyError:
            raise InputError(f"{self.label}: tensor {name} is missing") from None

    def fileno(self) -> int:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY)
            except OSError as exc:
                raise InputError(f"{self.label}: cannot open: {exc.strerror or exc}") from None
        return self._fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.close()

    def byte_span(self, name: str, start: int, stop: int) -> tuple[int, int, int]:
        meta = self.meta(name)
        row_bytes = meta.row_width * itemsize(meta.dtype)
        return self.fileno(), meta.offset + start * row_bytes, (stop - start) * row_bytes

    def read_rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows [start, stop) along dim 0, as a fresh tensor of shape (stop-start, *shape[1:])."""
        meta = self.meta(name)
        fd, offset, nbytes = self.byte_span(name, start, stop)
        buf = bytearray(nbytes)
        view = memoryview(buf)
        got = 0
        while got < nbytes:
            n = os.preadv(fd, [view[got:]], offset + got)
            if n <= 0:
                raise InputError(
                    f"{self.label}: tensor {name}: file ended early (truncated while reading); "
                    "re-download or re-export it"
                )
            got += n
        rest = meta.shape[1:] if len(meta.shape) > 1 else ()
        if nbytes == 0:
            return torch.empty((stop - start, *rest), dtype=meta.dtype)
        return torch.frombuffer(buf, dtype=meta.dtype).reshape(stop - start, *rest)


class StateDictSource:
    """Tensors already loaded (from a weights-only torch.load); slicing is free."""

    def __init__(self, label: str, tensors: dict[str, torch.Tensor]):
        self.label = label
        self._tensors = tensors

    def names(self) -> list[str]:
        return list(self._tensors)

    def meta(self, name: str) -> TensorMeta:
        try:
            t = self._tensors[name]
        except KeyError:
            raise InputError(f"{self.label}: tensor {name} is missing") from None
        return TensorMeta(name, t.dtype, tuple(t.shape), 0)

    def read_rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        t = self._tensors[name]
        if t.dim() == 0:
            return t.reshape(1)[start:stop].clone()
        return t[start:stop].clone()

    def byte_span(self, name: str, start: int, stop: int) -> None:
        return None


@dataclass(frozen=True)
class HeaderEntry(Shaped):
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]


class StreamWriter:
    """Writes a safetensors file whose header is known up front and whose data arrives in order.

    Data goes through our own buffer (few syscalls for small tensors); byte ranges that need no
    conversion are copied file-to-file by the kernel (``copy_file_range``), which is what makes
    conversion run at close to ``cp`` speed.
    """

    BUFFER = 8 * 1024 * 1024
    DIRECT = 1024 * 1024  # larger pieces skip the buffer (one copy less)

    def __init__(self, path: Path, entries: list[HeaderEntry], metadata: dict[str, str] | None = None):
        self.path = Path(path)
        self._entries = entries
        header: dict[str, object] = {"__metadata__": dict(metadata or {"format": "pt"})}
        pos = 0
        for e in entries:
            header[e.name] = {
                "dtype": DTYPE_NAMES[e.dtype],
                "shape": list(e.shape),
                "data_offsets": [pos, pos + e.nbytes],
            }
            pos += e.nbytes
        self.data_bytes = pos
        raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
        raw += b" " * (-len(raw) % 8)  # the reference implementation aligns data to 8 bytes
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._buf = bytearray()
        self._written = 0
        self._copy_ok = True
        self._raw_write(struct.pack("<Q", len(raw)) + raw)

    def _raw_write(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        while view:
            n = os.write(self._fd, view)
            view = view[n:]

    def _flush(self) -> None:
        if self._buf:
            self._raw_write(self._buf)
            self._buf = bytearray()

    def write_tensor_bytes(self, t: torch.Tensor) -> None:
        if t.numel() == 0:
            return
        data = t.contiguous().reshape(-1).view(torch.uint8).numpy()
        self._written += data.nbytes
        if data.nbytes >= self.DIRECT:
            self._flush()
            self._raw_write(data.data)
            return
        self._buf += data.data
        if len(self._buf) >= self.BUFFER:
            self._flush()

    def copy_range(self, src_fd: int, offset: int, nbytes: int, label: str) -> None:
        """Append ``nbytes`` of ``src_fd`` from ``offset``; ``label`` names the source in errors."""
        self._flush()
        self._written += nbytes
        done = 0
        while done < nbytes and self._copy_ok:
            try:
                n = os.copy_file_range(src_fd, self._fd, nbytes - done, offset + done)
            except OSError:
                self._copy_ok = False  # e.g. across filesystems on old kernels: fall back to read/write
                break
            if n == 0:
                raise InputError(
                    f"{label}: file ended early while copying (truncated during conversion?); "
                    "check the input and convert again"
                )
            done += n
        step = 16 * 1024 * 1024
        while done < nbytes:
            chunk = os.pread(src_fd, min(step, nbytes - done), offset + done)
            if not chunk:
                raise InputError(
                    f"{label}: file ended early while copying (truncated during conversion?); "
                    "check the input and convert again"
                )
            self._raw_write(chunk)
            done += len(chunk)

    def close(self, *, sync: bool = True) -> None:
        """Finish the file; raises if the data written does not match the header."""
        try:
            self._flush()
            if self._written != self.data_bytes:
                raise RuntimeError(
                    f"{self.path}: wrote {self._written} data bytes, header promises {self.data_bytes} (converter bug)"
                )
            if sync:
                os.fsync(self._fd)
        finally:
            self.abort()

    def abort(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
