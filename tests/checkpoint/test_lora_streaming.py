"""The merge streams: peak memory is about one touched tensor and its float32 update, not the model."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from pipeline.checkpoint.synthetic import DEFAULT_SYNTHETIC, write_synthetic_llama
from pipeline.geometry import ModelGeometry

REPO = Path(__file__).resolve().parents[2]
MiB = 1024 * 1024

CHILD = r"""
import ctypes, json, re, sys
from pathlib import Path
from pipeline.checkpoint.merge import merge_adapters

ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD: RSS shows live memory, not allocator caching

def status(key):
    return int(re.search(key + r":\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024

src, adapter, out = sys.argv[1:4]
Path("/proc/self/clear_refs").write_text("5")
base = status("VmRSS")
merge_adapters(Path(src), [Path(adapter)], Path(out))
print(json.dumps({"base": base, "peak": status("VmHWM")}))
"""


def _hand_written_adapter(folder: Path, model: ModelGeometry, rank: int = 8) -> None:
    """A PEFT-format LoRA folder for every down_proj and q_proj (written directly, as PEFT names them)."""
    folder.mkdir()
    gen = torch.Generator().manual_seed(0)
    tensors = {}
    shapes = {
        "mlp.down_proj": (model.hidden_size, model.intermediate_size),
        "self_attn.q_proj": (model.hidden_size, model.hidden_size),
    }
    for layer in range(model.num_layers):
        for module, (out, inp) in shapes.items():
            prefix = f"base_model.model.model.layers.{layer}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, inp, generator=gen) * 0.01
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out, rank, generator=gen) * 0.01
    save_file(tensors, folder / "adapter_model.safetensors")
    (folder / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "r": rank,
                "lora_alpha": 2 * rank,
                "target_modules": ["down_proj", "q_proj"],
                "bias": "none",
                "base_model_name_or_path": None,
            }
        )
    )


@pytest.mark.slow  # writes ~400 MB
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_merge_peak_rss_is_bounded_by_a_tensor(tmp_path):
    model = dataclasses.replace(DEFAULT_SYNTHETIC, num_layers=3)  # embedding and lm_head: 62.5 MiB each in bf16
    size = write_synthetic_llama(tmp_path / "hf", model, torch.bfloat16)
    _hand_written_adapter(tmp_path / "adapter", model)
    (tmp_path / "out").mkdir()
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "hf"), str(tmp_path / "adapter"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    memory = json.loads(result.stdout.strip().splitlines()[-1])
    grown = memory["peak"] - memory["base"]
    largest_update = model.intermediate_size * model.hidden_size * 4  # a down_proj update in float32: 11 MiB
    assert size > 150 * MiB
    assert grown < 5 * largest_update + 16 * MiB < size / 2, f"merge grew RSS by {grown / MiB:.0f} MiB"
    merged = load_file(tmp_path / "out" / "model.safetensors")
    original = load_file(tmp_path / "hf" / "model.safetensors")
    assert torch.equal(merged["lm_head.weight"], original["lm_head.weight"])
    down = "model.layers.2.mlp.down_proj.weight"
    assert not torch.equal(merged[down], original[down])
