"""Dispatched FP8 quantization (accelerate device_map): the same checkpoint as on one device.

On the CPU the dispatch spreads the tiny model over the CPU and disk offload (what accelerate
supports without a GPU); the tests named ``test_cuda_*`` dispatch over GPUs and are skipped
without CUDA.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipeline.errors import StageUnavailable
from pipeline.quantize import quantize_fp8
from pipeline.quantize.calibration import batch_equal_lengths
from pipeline.quantize.placement import Placement, check_device_map, gpu_placement, input_device

CALIB = {"kv_cache_fp8": True, "calib_path": None, "calib_size": 12, "calib_max_len": 64}
CPU_AND_DISK = {
    "model.embed_tokens": "cpu",
    "model.rotary_emb": "cpu",
    "model.layers.0": "cpu",
    "model.layers.1": "disk",
    "model.norm": "cpu",
    "lm_head": "disk",
}


def _export(folder: Path) -> dict:
    """Every exported tensor as raw bytes (FP8 codes compared bit for bit) plus the configs."""
    from safetensors.torch import load_file

    tensors = {}
    for file in sorted(folder.glob("*.safetensors")):
        for name, tensor in load_file(str(file)).items():
            tensors[name] = (
                str(tensor.dtype),
                tuple(tensor.shape),
                tensor.contiguous().view(-1).view(__import__("torch").uint8).numpy().tobytes(),
            )
    configs = {name: json.loads((folder / name).read_text()) for name in ("config.json", "hf_quant_config.json")}
    return {"tensors": tensors, "configs": configs}


@pytest.fixture(scope="module")
def undispatched(tiny_llama_dir, module_tmp):
    out = module_tmp("plain") / "out"
    return quantize_fp8(tiny_llama_dir, out, **CALIB), out


def test_dispatch_over_cpu_and_disk_offload_exports_the_same_fp8_codes_and_scales(
    undispatched, tiny_llama_dir, tmp_path
):
    plain, plain_dir = undispatched
    placement = Placement(device_map=CPU_AND_DISK, offload="disk", offload_dir=tmp_path / "offload")
    summary = quantize_fp8(tiny_llama_dir, tmp_path / "out", placement=placement, **CALIB)
    assert plain.device == "cpu" and plain.device_map is None
    assert summary.device == "cpu+disk" and summary.device_map == CPU_AND_DISK
    # Disk-offloaded weights are read from the checkpoint's own safetensors files (accelerate's
    # offload index points into them), so the offload folder may stay empty.
    assert summary.amax == plain.amax
    dispatched, reference = _export(tmp_path / "out"), _export(plain_dir)
    assert dispatched["tensors"].keys() == reference["tensors"].keys()
    fp8 = [name for name, (dtype, _, _) in reference["tensors"].items() if dtype == "torch.float8_e4m3fn"]
    scales = [name for name in reference["tensors"] if name.endswith("_scale")]
    assert len(fp8) == 14 and len(scales) == 14 * 2 + 2 * 2
    for name in reference["tensors"]:
        assert dispatched["tensors"][name] == reference["tensors"][name], name
    assert dispatched["configs"] == reference["configs"]


def test_batched_calibration_sees_the_same_samples(undispatched, tiny_llama_dir, tmp_path):
    plain, _ = undispatched
    summary = quantize_fp8(tiny_llama_dir, tmp_path / "out", placement=Placement(calib_batch=8), **CALIB)
    assert summary.calib_batch == 8 and summary.calib_samples == plain.calib_samples
    assert summary.amax.keys() == plain.amax.keys()
    for name, value in plain.amax.items():  # a max over the same tokens; batched GEMMs round differently
        assert summary.amax[name] == pytest.approx(value, rel=1e-4), name


def test_equal_length_batches_never_pad():
    import torch

    samples = [torch.full((1, n), i) for i, n in enumerate([3, 5, 3, 3, 5, 2])]
    batches = batch_equal_lengths(samples, 2)
    assert [tuple(b.shape) for b in batches] == [(2, 3), (1, 3), (2, 5), (1, 2)]
    assert [row[0].item() for b in batches for row in b] == [0, 2, 3, 1, 4, 5]
    assert batch_equal_lengths(samples, 1) == samples


def test_gpu_budgets_keep_the_working_memory_free():
    placement = gpu_placement([79.6] * 4, working_gib=8.2, offload="none", offload_dir=Path("/x"))
    assert placement.max_memory_gib == {
        0: pytest.approx(71.4),
        1: pytest.approx(71.4),
        2: pytest.approx(71.4),
        3: pytest.approx(71.4),
    }
    kwargs = placement.load_kwargs(cuda=True)
    assert kwargs == {"device_map": "auto", "max_memory": {i: "71.40GiB" for i in range(4)}}
    disk = gpu_placement([79.6], working_gib=8.2, offload="disk", offload_dir=Path("/x")).load_kwargs(cuda=True)
    assert disk["max_memory"]["cpu"] == "0.00GiB" and disk["offload_folder"] == "/x"
    cpu = gpu_placement([79.6], working_gib=8.2, offload="cpu", offload_dir=Path("/x"), host_memory_gib=512)
    assert cpu.max_memory_gib["cpu"] == pytest.approx(512 * 0.8 - 16) and cpu.offload_dir is None
    assert Placement().load_kwargs(cuda=False) == {}  # the CPU path: one module, as before


def test_weights_spilling_off_the_gpus_without_offload_is_exit_3():
    model = SimpleNamespace(hf_device_map={"model.embed_tokens": 0, "model.layers.0": 1, "lm_head": "cpu"})
    with pytest.raises(StageUnavailable, match="does not fit the 2 GPU\\(s\\) of this host .*quantization.offload"):
        check_device_map(
            model, gpu_placement([80, 80], working_gib=8, offload="none", offload_dir=Path("/x")), cuda=True
        )
    allowed = gpu_placement([80, 80], working_gib=8, offload="cpu", offload_dir=Path("/x"), host_memory_gib=64)
    assert check_device_map(model, allowed, cuda=True) == model.hf_device_map
    assert input_device(model.hf_device_map, "cuda") == "cuda:0"


def _cuda_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(_cuda_gpus() < 1, reason="needs CUDA")
def test_cuda_dispatch_with_cpu_offload_exports_what_one_gpu_does(tiny_llama_dir, tmp_path):
    one = quantize_fp8(tiny_llama_dir, tmp_path / "one", placement=Placement(device_map={"": 0}), **CALIB)
    offloaded = dict(
        CPU_AND_DISK,
        **{
            "model.embed_tokens": 0,
            "model.rotary_emb": 0,
            "model.layers.0": 0,
            "model.layers.1": "cpu",
            "model.norm": 0,
            "lm_head": 0,
        },
    )
    split = quantize_fp8(
        tiny_llama_dir, tmp_path / "split", placement=Placement(device_map=offloaded, offload="cpu"), **CALIB
    )
    assert split.device == "cuda:0+cpu"
    assert split.amax == one.amax
    assert _export(tmp_path / "split") == _export(tmp_path / "one")


@pytest.mark.skipif(_cuda_gpus() < 2, reason="needs CUDA with two or more GPUs")
def test_cuda_multi_gpu_dispatch_exports_what_one_gpu_does(tiny_llama_dir, tmp_path):
    gpus = _cuda_gpus()
    one = quantize_fp8(tiny_llama_dir, tmp_path / "one", placement=Placement(device_map={"": 0}), **CALIB)
    spread = {
        "model.embed_tokens": 0,
        "model.rotary_emb": 0,
        "model.layers.0": 0,
        "model.layers.1": gpus - 1,
        "model.norm": gpus - 1,
        "lm_head": gpus - 1,
    }
    multi = quantize_fp8(tiny_llama_dir, tmp_path / "multi", placement=Placement(device_map=spread), **CALIB)
    assert multi.device == f"cuda:0+cuda:{gpus - 1}"
    assert multi.amax == one.amax
    assert _export(tmp_path / "multi") == _export(tmp_path / "one")
