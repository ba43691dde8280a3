"""Our bounded-memory safetensors reader/writer agree with the official library."""

from __future__ import annotations

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from pipeline.checkpoint.safetensors_io import HeaderEntry, SafetensorsFile, StreamWriter


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "a.bf16": torch.randn(7, 5, generator=g).to(torch.bfloat16),
        "b.f32": torch.randn(3, 4, 2, generator=g),
        "c.f16": torch.randn(9, generator=g).half(),
        "d.fp8": (torch.randn(6, 8, generator=g) * 10).to(torch.float8_e4m3fn),
        "e.scalar": torch.tensor(0.25),
        "f.empty": torch.zeros(0, 4),
    }


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def test_reader_matches_safe_open(tmp_path):
    path = tmp_path / "x.safetensors"
    tensors = _tensors()
    save_file(tensors, str(path), metadata={"format": "pt"})
    ours = SafetensorsFile(path)
    assert sorted(ours.names()) == sorted(tensors)
    with safe_open(str(path), "pt") as f:
        for name in tensors:
            want = f.get_tensor(name)
            meta = ours.meta(name)
            assert meta.dtype == want.dtype and meta.shape == tuple(want.shape)
            got = ours.read_rows(name, 0, meta.rows).reshape(meta.shape)
            assert torch.equal(_bytes(got), _bytes(want))
            if meta.rows > 2:
                assert torch.equal(ours.read_rows(name, 1, 3).float(), want[1:3].float())


def test_writer_output_loads_with_safe_open(tmp_path):
    tensors = _tensors()
    path = tmp_path / "y.safetensors"
    w = StreamWriter(path, [HeaderEntry(n, t.dtype, tuple(t.shape)) for n, t in tensors.items()])
    for t in tensors.values():
        w.write_tensor_bytes(t)
    w.close()
    raw = path.read_bytes()
    header_len = int.from_bytes(raw[:8], "little")
    assert header_len % 8 == 0  # data aligned like the reference writer
    with safe_open(str(path), "pt") as f:
        assert sorted(f.keys()) == sorted(tensors)
        for name, t in tensors.items():
            got = f.get_tensor(name)
            assert got.dtype == t.dtype and got.shape == t.shape
            assert torch.equal(got.float(), t.float())


def test_writer_copy_range(tmp_path):
    src = tmp_path / "src.safetensors"
    t = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    save_file({"t": t}, str(src))
    reader = SafetensorsFile(src)
    path = tmp_path / "z.safetensors"
    w = StreamWriter(path, [HeaderEntry("rows", torch.float32, (3, 8))])
    w.copy_range(*reader.byte_span("t", 2, 5), "src")
    w.close()
    with safe_open(str(path), "pt") as f:
        assert torch.equal(f.get_tensor("rows"), t[2:5])
