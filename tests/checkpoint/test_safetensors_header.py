"""The header reader is at least as strict as the safetensors library: what we accept, it accepts,
with the same tensors at the same bytes; what it refuses, we refuse with one line naming the file.

Ours refuses two things the library takes: dtypes the converter has no use for (``U16``,
``F8_E8M0``, ...) and a key written twice (the library silently keeps one of them).
"""

from __future__ import annotations

import json
import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import SafetensorError, deserialize

from pipeline.checkpoint.safetensors_io import DTYPES, SafetensorsFile
from pipeline.errors import InputError

SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "I64": 8, "I32": 4, "U8": 1, "BOOL": 1, "U16": 2}
LIBRARY_ONLY = ("U16", "F8_E8M0")  # dtypes the library reads and the converter refuses


def file_bytes(header: dict | bytes, data_len: int) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + bytes(i % 251 for i in range(data_len))


def library_reads(blob: bytes) -> dict[str, tuple[str, list[int], bytes]] | None:
    try:
        return {name: (t["dtype"], list(t["shape"]), bytes(t["data"])) for name, t in deserialize(blob)}
    except SafetensorError:
        return None


def ours_reads(blob: bytes, path) -> dict[str, tuple[str, list[int], bytes]] | InputError:
    path.write_bytes(blob)
    try:
        source = SafetensorsFile(path)
    except InputError as exc:
        return exc
    try:
        names = {v: k for k, v in DTYPES.items()}
        read = {}
        for name in source.names():
            meta = source.meta(name)
            fd, offset, nbytes = source.byte_span(name, 0, meta.rows)
            read[name] = (names[meta.dtype], list(meta.shape), os.pread(fd, nbytes, offset) if nbytes else b"")
        return read
    finally:
        source.close()


def entry(dtype="F32", shape=(2,), offsets=(0, 8)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


@pytest.mark.parametrize(
    "header, data_len, message",
    [
        ({"w": entry(offsets=(0.0, 8))}, 8, "data_offsets [0.0, 8] must be two non-negative integers"),
        ({"w": entry(offsets=(0, 137472.5))}, 8, "must be two non-negative integers"),
        (b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8e0]}}', 8, "must be two non-negative integers"),
        ({"w": entry(offsets=(0, 8, 8))}, 8, "must be two non-negative integers"),
        ({"w": entry(offsets=(0, "8"))}, 8, "must be two non-negative integers"),
        ({"w": entry(offsets=(-8, 0))}, 8, "must be two non-negative integers"),
        ({"w": entry(offsets=(0, 2**64 + 8))}, 8, "must be two non-negative integers"),
        ({"w": entry(shape=(2.0,))}, 8, "shape [2.0] must be a list of non-negative integers"),
        ({"w": entry(shape=(True, 2))}, 8, "must be a list of non-negative integers"),
        ({"w": entry(shape=("2",))}, 8, "must be a list of non-negative integers"),
        ({"w": {**entry(), "shape": 2}}, 8, "must be a list of non-negative integers"),
        ({"w": {"dtype": "F32", "data_offsets": [0, 8]}}, 8, "needs dtype, shape and data_offsets"),
        ({"w": entry(dtype=4)}, 8, "dtype 4 is not a string"),
        ({"w": entry(offsets=(0, 12))}, 12, "do not match dtype F32 shape [2] (8 bytes)"),
        ({"__metadata__": {"format": 1}, "w": entry()}, 8, "__metadata__ must map names to strings"),
        ({"__metadata__": ["pt"], "w": entry()}, 8, "__metadata__ must map names to strings"),
        (b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, NaN]}}', 8, "not valid JSON"),
    ],
)
def test_headers_the_library_refuses_are_refused_with_one_line(tmp_path, header, data_len, message):
    blob = file_bytes(header, data_len)
    assert library_reads(blob) is None  # the library's own verdict
    got = ours_reads(blob, tmp_path / "x.safetensors")
    assert isinstance(got, InputError), got
    assert "\n" not in str(got) and str(tmp_path / "x.safetensors") in str(got)
    assert message in str(got), got


def test_fractional_offsets_in_a_checkpoint_fail_validate(cli, write_spec, tmp_path):
    from tests.checkpoint.conftest import random_llama
    from tests.preflight_fixtures import spec_for, write_tokenizer

    folder = tmp_path / "model"
    random_llama(0).save_pretrained(folder)
    write_tokenizer(folder)
    weights = folder / "model.safetensors"
    blob = weights.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])
    name = next(k for k in header if k != "__metadata__")
    begin, end = header[name]["data_offsets"]
    text = blob[8 : 8 + n].decode()
    old = f'"data_offsets":[{begin},{end}]'
    assert old in text
    text = text.replace(old, f'"data_offsets":[{begin}.5,{end}]', 1)
    weights.write_bytes(struct.pack("<Q", len(text)) + text.encode() + blob[8 + n :])
    assert library_reads(weights.read_bytes()) is None
    rc, _, err = cli("validate", str(write_spec(spec_for(folder))))
    assert rc == 2 and f"tensor {name}: data_offsets [{begin}.5, {end}]" in err, err
    assert ".yaml:3:3 model.path:" in err


def test_duplicate_keys_the_library_takes_silently_are_refused(tmp_path):
    blob = file_bytes(
        b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "w": '
        b'{"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}',
        8,
    )
    got = ours_reads(blob, tmp_path / "x.safetensors")
    assert isinstance(got, InputError) and "key 'w' appears twice" in str(got)


# -- property: on generated headers, ours accepts only what the library accepts ---------------------

_odd_numbers = st.sampled_from([1.0, 2.5, -1, True, "4", None, 2**64, 1e300])


@st.composite
def headers(draw):
    """A header built right, then possibly broken in one of the ways real files break."""
    tensors = {}
    pos = 0
    for index in range(draw(st.integers(0, 4))):
        dtype = draw(st.sampled_from(sorted(SIZES)))
        shape = draw(st.lists(st.integers(0, 3), max_size=3))
        nbytes = SIZES[dtype] * _prod(shape)
        tensors[f"t{index}"] = {"dtype": dtype, "shape": shape, "data_offsets": [pos, pos + nbytes]}
        pos += nbytes
    data_len = pos
    names = sorted(tensors)
    if names and draw(st.booleans()):
        target = tensors[draw(st.sampled_from(names))]
        how = draw(st.sampled_from(["offset", "odd_offset", "shape", "odd_shape", "dtype", "drop", "swap"]))
        if how == "offset":
            target["data_offsets"][draw(st.integers(0, 1))] += draw(st.sampled_from([-1, 1, 4]))
        elif how == "odd_offset":
            target["data_offsets"][draw(st.integers(0, 1))] = draw(_odd_numbers)
        elif how == "shape" and target["shape"]:
            target["shape"][0] += 1
        elif how == "odd_shape":
            target["shape"] = [*target["shape"], draw(_odd_numbers)]
        elif how == "dtype":
            target["dtype"] = draw(st.sampled_from(["F32", "I8", "bf16", "F8_E8M0", 3]))
        elif how == "drop":
            del target[draw(st.sampled_from(["dtype", "shape", "data_offsets"]))]
        elif how == "swap":
            target["data_offsets"].reverse()
    if draw(st.booleans()):
        tensors["__metadata__"] = draw(st.sampled_from([None, {}, {"format": "pt"}, {"format": 1}, ["pt"]]))
    data_len += draw(st.sampled_from([0, 0, 0, -1, 1, 8]))
    return tensors, max(data_len, 0)


def _prod(shape):
    out = 1
    for d in shape:
        out *= d
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=headers())
def test_ours_accepts_exactly_what_the_library_accepts(tmp_path, case):
    header, data_len = case
    blob = file_bytes(header, data_len)
    theirs, ours = library_reads(blob), ours_reads(blob, tmp_path / "g.safetensors")
    if isinstance(ours, InputError):
        # Refused by us: the library refuses too, unless it is a dtype the converter does not read.
        unsupported = "unsupported dtype" in str(ours) and any(
            isinstance(v, dict) and v.get("dtype") in LIBRARY_ONLY for v in header.values()
        )
        assert theirs is None or unsupported, (str(ours), header, data_len)
    else:
        assert ours == theirs, (header, data_len)
