"""The converter streams: its memory is bounded by a chunk, not by a tensor or the model.

No timing assertions: memory is measured (peak RSS of a child process, live bytes read).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch

import pipeline.checkpoint.trtllm_writer as writer_mod
from pipeline.checkpoint import forward_logits
from pipeline.checkpoint.safetensors_io import SafetensorsFile
from pipeline.checkpoint.synthetic import DEFAULT_SYNTHETIC, write_synthetic_llama
from pipeline.geometry import ModelGeometry

REPO = Path(__file__).resolve().parents[2]
MiB = 1024 * 1024

CHILD = r"""
import ctypes, json, re, sys
from pathlib import Path
from pipeline.checkpoint import convert_checkpoint

# glibc raises its mmap threshold as large blocks are freed and then keeps freed chunks in the
# heap, so RSS would show allocator caching (tens of MiB, run-dependent) rather than live memory.
# Pin the threshold: every chunk-sized buffer is then mapped and unmapped, and RSS is what we hold.
ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD

def status(key):
    return int(re.search(key + r":\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024

src, out, dtype, tp = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM: measure the conversion, not the imports
base = status("VmRSS")
convert_checkpoint(Path(src), Path(out), tp=tp, pp=1, dtype=dtype)
print(json.dumps({"base": base, "peak": status("VmHWM")}))
"""


@pytest.fixture(scope="module")
def synthetic_bf16(module_tmp) -> tuple[Path, ModelGeometry, int]:
    # 3 layers, vocab 32000 x 1024: the embedding and lm_head are 62.5 MiB each in bf16 (125 MiB as fp32).
    model = dataclasses.replace(DEFAULT_SYNTHETIC, num_layers=3)
    folder = module_tmp("synthetic") / "hf"
    size = write_synthetic_llama(folder, model, torch.bfloat16)
    return folder, model, size


@pytest.mark.slow  # writes ~600 MB with fsync: disk-bound, 5-15 s on a shared VM
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("dtype,tp", [("bfloat16", 1), ("float32", 2)])
def test_peak_rss_is_bounded_by_a_chunk(synthetic_bf16, tmp_path, dtype, tp):
    folder, model, size = synthetic_bf16
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(folder), str(out), dtype, str(tp)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    mem = json.loads(proc.stdout.strip().splitlines()[-1])
    grew = mem["peak"] - mem["base"]
    largest_out = model.vocab_size * model.hidden_size * (4 if dtype == "float32" else 2)
    # bf16 -> bf16 holds one bf16 read chunk (half a work chunk; read to check it is finite); bf16 -> fp32
    # holds a read chunk, its column slice and its fp32 copy; 24 MiB covers write buffers and interpreter noise.
    budget = 24 * MiB + (writer_mod.CHUNK_BYTES // 2 if dtype == "bfloat16" else 3 * writer_mod.CHUNK_BYTES)
    print(f"{dtype} tp={tp}: RSS grew {grew / MiB:.1f} MiB, budget {budget / MiB:.0f} MiB")
    assert grew < budget, f"conversion grew RSS by {grew / MiB:.1f} MiB (model {size / MiB:.0f} MiB)"
    assert largest_out > 2 * budget and size > 3.5 * budget  # the bound is far below one tensor
    total = sum((out / f"rank{r}.safetensors").stat().st_size for r in range(tp))
    assert total > size * (2 if dtype == "float32" else 1) * 0.99


def test_live_bytes_read_stay_below_a_chunk(tiny_llama, convert, monkeypatch):
    """Every source read is counted while its tensor is alive: never more than ~one chunk at once."""
    chunk = 64 * 1024
    monkeypatch.setattr(writer_mod, "CHUNK_BYTES", chunk)
    tiny = tiny_llama(vocab_size=4096, hidden_size=64)  # embedding and lm_head are 1 MiB in fp32
    live = [0]
    peak = [0]
    original = SafetensorsFile.read_rows

    def counted(self, name, start, stop):
        t = original(self, name, start, stop)
        n = t.numel() * t.element_size()
        live[0] += n
        peak[0] = max(peak[0], live[0])
        weakref.finalize(t, lambda: live.__setitem__(0, live[0] - n))
        return t

    monkeypatch.setattr(SafetensorsFile, "read_rows", counted)
    out, _ = convert(tiny.path, tp=2, dtype="bfloat16")  # fp32 -> bf16: every byte goes through a read
    assert 0 < peak[0] <= chunk, peak[0]
    assert 4096 * 64 * 4 >= 16 * chunk
    ids = torch.randint(0, 4096, (1, 16), generator=torch.Generator().manual_seed(0))
    assert (forward_logits(out, ids) - tiny.logits(ids)).abs().max().item() < 0.05  # bf16 weights
