"""The LoRA step price on literal shapes (hand-computed numbers), the CPU step's composition, the CLI."""

from __future__ import annotations

import json

import pytest

from pipeline.costmodel import hardware, lora
from pipeline.costmodel.hardware import GpuPerf
from pipeline.costmodel.lora import LoraLoad, add_lora, lora_bytes, lora_flops, module_features
from pipeline.costmodel.lora_cpu import LoraCpuProfile, group_sizes
from pipeline.costmodel.step import Deployment, StepCost
from pipeline.geometry import ModelGeometry
from pipeline.spec import presets

# hidden 100, 2 query heads and 1 KV head of 50, intermediate 200, 2 layers.
TINY = ModelGeometry("tiny", 1000, 100, 2, 2, 1, 50, 200)
# 1 GB/s, 1 TFLOP/s at 100% efficiency below: times are bytes / 1e9 and FLOPs / 1e12.
SLOW = GpuPerf(name="slow", memory_gbps=1.0, bf16_tflops=1.0, fp8_tflops=2.0, link_gbps=1.0, nvlink=True)


@pytest.fixture(autouse=True)
def full_efficiency(monkeypatch):
    monkeypatch.setattr(hardware, "BANDWIDTH_EFFICIENCY", 1.0)
    monkeypatch.setattr(hardware, "COMPUTE_EFFICIENCY", 1.0)


def test_module_features_of_a_gqa_layer():
    assert module_features(TINY, "q_proj") == (100, 100)
    assert module_features(TINY, "k_proj") == (100, 50)
    assert module_features(TINY, "o_proj") == (100, 100)
    assert module_features(TINY, "up_proj") == (100, 200)
    assert module_features(TINY, "down_proj") == (200, 100)


def test_flops_and_bytes_on_literal_shapes():
    # rank 4 on q_proj (100 + 100) and v_proj (100 + 50): 350 features per layer, 2 layers.
    load = LoraLoad(4, ("q_proj", "v_proj"))
    assert lora_flops(TINY, load, rows=3) == 2 * 2 * 3 * 4 * 350  # 16800
    assert lora_bytes(TINY, load) == 2 * 4 * 350 * 2  # 5600: bf16 A and B of one adapter
    assert lora_bytes(TINY, load, adapters=3) == 3 * 5600


def test_smollm2_every_module():
    # SmolLM2-135M: q 576+576, k 576+192, v 576+192, o 576+576, gate/up 576+1536, down 1536+576 = 10176.
    arch = presets.preset("smollm2-135m-instruct")
    load = LoraLoad(8, lora.LORA_MODULES)
    assert lora_flops(arch, load, rows=1) == 30 * 2 * 8 * 10176
    assert lora_bytes(arch, load) == 30 * 8 * 10176 * 2


def test_step_parts_one_adapter_and_a_mix(monkeypatch):
    monkeypatch.setattr(lora, "LORA_KERNEL_S", 1e-6)
    monkeypatch.setattr(lora, "LORA_GROUP_S", 0.5e-6)
    d = Deployment(TINY, SLOW, context_len=0, step_overhead_s=0.0)
    one = add_lora(StepCost(), d, LoraLoad(4, ("q_proj", "v_proj")), rows=8)
    # bytes 5600 at 1 GB/s = 5.6 us > FLOPs 44800 at 1 TFLOP/s; 2 layers x 2 modules x 2 kernels x 1 us.
    assert one.parts == pytest.approx({"LoRA GEMMs": 5.6e-6 + 8e-6})
    mixed = add_lora(StepCost(), d, LoraLoad(4, ("q_proj", "v_proj"), adapters=3), rows=8)
    # two more adapters: 2 x 5600 bytes = 11.2 us, and 2 groups x 8 kernels x 0.5 us = 8 us.
    assert mixed.parts["LoRA GEMMs"] == pytest.approx(13.6e-6)
    assert mixed.parts["LoRA adapter mixing"] == pytest.approx(11.2e-6 + 8e-6)
    capped = add_lora(StepCost(), d, LoraLoad(4, ("q_proj", "v_proj"), adapters=8), rows=2)
    # two rows can mix at most two adapters
    assert capped.parts["LoRA adapter mixing"] == pytest.approx(5.6e-6 + 4e-6)


def test_tensor_parallel_splits_the_adapter():
    d = Deployment(TINY, SLOW, context_len=0, step_overhead_s=0.0, tp=2)
    cost = add_lora(StepCost(), d, LoraLoad(4, ("q_proj", "v_proj")), rows=1)
    assert cost.parts["LoRA GEMMs"] == pytest.approx(2.8e-6 + 8 * lora.LORA_KERNEL_S)


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({"rank": 0, "modules": ("q_proj",)}, "rank 0"),
        ({"rank": 8, "modules": ("q_proj", "lm_head")}, "unknown LoRA target module"),
        ({"rank": 8, "modules": ()}, "no LoRA target"),
        ({"rank": 8, "modules": ("q_proj", "q_proj")}, "repeat"),
        ({"rank": 8, "modules": ("q_proj",), "adapters": 0}, "must be >= 1"),
    ],
)
def test_bad_loads_are_refused(kwargs, expected):
    with pytest.raises(ValueError, match=expected):
        LoraLoad(**kwargs)


def test_the_cpu_step_composes_the_probe():
    # 1 module; whole 10 us at 1 row, 20 at 8; first group 30 / 50 us, next group 15 / 25 us at 1 / 8 rows.
    p = LoraCpuProfile(
        8,
        whole={"q_proj": {1: 10e-6, 8: 20e-6}},
        first={"q_proj": {1: 30e-6, 8: 50e-6}},
        next={"q_proj": {1: 15e-6, 8: 25e-6}},
    )
    arch = presets.preset("smollm2-135m-instruct")  # 30 layers
    assert p.step_s(arch, LoraLoad(8, ("q_proj",)), 8) == pytest.approx(30 * 20e-6)
    # 8 rows over 2 adapters: groups of 4 rows: first 30 + 20 x 3/7 us, next 15 + 10 x 3/7 us.
    two = 30 * ((30 + 20 * 3 / 7) + (15 + 10 * 3 / 7)) * 1e-6
    assert p.step_s(arch, LoraLoad(8, ("q_proj",), adapters=2), 8) == pytest.approx(two)
    with pytest.raises(ValueError, match="probed at rank 8"):
        p.step_s(arch, LoraLoad(16, ("q_proj",)), 8)


def test_adapter_groups_split_the_rows_as_evenly_as_they_can():
    assert group_sizes(6, 4) == [2, 2, 1, 1]
    assert group_sizes(24, 8) == [3] * 8
    assert group_sizes(2, 8) == [1, 1]  # no more groups than rows
    assert group_sizes(5, 1) == [5]


def test_predict_cli_prices_a_shared_lora_engine(cli):
    base = ["predict", "--preset", "llama-3.1-8b", "--gpu", "l40s", "--method", "none", "--batch", "8", "--json"]
    rc, out, err = cli(*base)
    assert rc == 0, err
    plain = json.loads(out)
    rc, out, err = cli(*base, "--lora-rank", "16", "--lora-modules", "q_proj,v_proj", "--lora-adapters", "4")
    assert rc == 0, err
    body = json.loads(out)
    parts = body["step_cost"]["8"]["parts_ms"]
    assert {"LoRA GEMMs", "LoRA adapter mixing"} <= set(parts)
    assert body["lora"] == {"rank": 16, "modules": ["q_proj", "v_proj"], "adapters": 4}
    assert body["speedup"]["8"] < plain["speedup"]["8"] == pytest.approx(1.0)
    lora_ms = parts["LoRA GEMMs"] + parts["LoRA adapter mixing"]
    assert body["step_cost"]["8"]["method_ms"] == pytest.approx(plain["step_cost"]["8"]["method_ms"] + lora_ms)


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--method", "eagle", "--lora-rank", "8"], "without speculative heads"),
        (["--method", "none", "--lora-rank", "8", "--lora-modules", "q_proj,attn"], "unknown LoRA target module"),
        (["--method", "none", "--lora-rank", "0"], "rank 0"),
        (["--method", "none", "--lora-adapters", "3"], "needs --lora-rank"),
    ],
)
def test_predict_cli_bad_lora_input(cli, args, expected):
    rc, _, err = cli("predict", "--preset", "llama-3.1-8b", "--gpu", "l40s", *args)
    assert rc == 2 and err.count("\n") == 1 and expected in err, err


def test_shared_speedup_is_the_plain_step_over_the_lora_step(monkeypatch):
    monkeypatch.setattr(lora, "LORA_KERNEL_S", 1e-6)
    d = Deployment(TINY, SLOW, context_len=0, step_overhead_s=0.0)
    # plain: the weight read, (2 layers x 90200 params + the 100000 of the lm_head) x 2 bytes at 1 GB/s;
    # LoRA: 5.6 us of adapter bytes + 8 kernels x 1 us (as above)
    assert TINY.decoder_layer_params() == 90200
    plain = (2 * 90200 + 100000) * 2 * 1e-9
    speedup = lora.shared_speedup(d, LoraLoad(4, ("q_proj", "v_proj")), batch=1)
    assert speedup == pytest.approx(plain / (plain + 5.6e-6 + 8e-6))
    assert speedup < 1.0
