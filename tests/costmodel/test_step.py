"""The cost model's formulas on literal cases (hand-computed numbers, not the code's own output)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from pipeline import trees
from pipeline.costmodel import hardware
from pipeline.costmodel.gemm_probe import CpuProfile, gemm_shapes
from pipeline.costmodel.hardware import CPU_DEVICE, GpuPerf, gpu_perf
from pipeline.costmodel.predict import break_even_batch, predict
from pipeline.costmodel.pricing import method_step, target_step
from pipeline.costmodel.profile import RuntimeProfile, load_calibrations
from pipeline.costmodel.step import Deployment
from pipeline.geometry import ModelGeometry
from pipeline.methods.drafting import Drafting
from pipeline.methods.lookahead import LookaheadConfig
from pipeline.spec import gpus, presets

# decoder layer: 100 x 50 x (2 x 2 + 2 x 2) + 3 x 100 x 200 + 2 x 100 = 100200 params; 2 layers;
# lm_head 1000 x 100 = 100000 params.
TINY = ModelGeometry(
    "tiny",
    vocab_size=1000,
    hidden_size=100,
    num_layers=2,
    num_heads=2,
    num_kv_heads=2,
    head_dim=50,
    intermediate_size=200,
    max_position_embeddings=512,
    rope_theta=1e4,
)
# 1 GB/s and 1 TFLOP/s (2 FP8) at 100% efficiency below: times are bytes / 1e9 and FLOPs / 1e12.
SLOW = GpuPerf(name="slow", memory_gbps=1.0, bf16_tflops=1.0, fp8_tflops=2.0, link_gbps=1.0, nvlink=True)


@pytest.fixture(autouse=True)
def full_efficiency(monkeypatch):
    monkeypatch.setattr(hardware, "BANDWIDTH_EFFICIENCY", 1.0)
    monkeypatch.setattr(hardware, "COMPUTE_EFFICIENCY", 1.0)
    monkeypatch.setattr(hardware, "PASS_OVERHEAD_S", 0.0)


def tiny(**kw) -> Deployment:
    return Deployment(TINY, SLOW, **{"context_len": 0, "step_overhead_s": 0.0, **kw})


def test_tiny_layer_params():
    assert TINY.decoder_layer_params() == 100200


def test_plain_step_is_the_weight_read():
    # (2 x 100200 x 2 + 100000 x 2) bytes = 600800 bytes at 1 GB/s; FLOPs 600800 at 1 TFLOP/s are negligible.
    cost = target_step(tiny(), batch=1, rows=1)
    assert cost.parts["weights and GEMMs"] == pytest.approx(600800e-9)
    assert cost.total_s == pytest.approx(600800e-9)


def test_kv_cache_read_and_overhead():
    # KV: 1 request x 100 tokens x 2 layers x (K, V) x 2 heads x 50 x 2 bytes = 80000 bytes.
    cost = target_step(tiny(context_len=100, step_overhead_s=1e-3), batch=1, rows=1)
    assert cost.parts["attention (KV read)"] == pytest.approx(80000e-9)
    assert cost.parts["step overhead"] == 1e-3
    assert cost.total_s == pytest.approx(600800e-9 + 80000e-9 + 1e-3)


def test_many_rows_turn_the_step_compute_bound():
    # 2 x (200400 + 100000) x 1 x 4000 = 2.4032e9 FLOPs = 2.4032 ms > 0.6008 ms of weight reads.
    cost = target_step(tiny(), batch=1, rows=4000)
    assert cost.parts["weights and GEMMs"] == pytest.approx(2 * 300400 * 4000 / 1e12)


def test_fp8_halves_decoder_bytes_not_the_lm_head():
    cost = target_step(tiny(dtype="fp8"), batch=1, rows=1)
    assert cost.parts["weights and GEMMs"] == pytest.approx((200400 * 1 + 100000 * 2) * 1e-9)


def test_tensor_parallel_halves_weights_and_adds_all_reduces():
    # tp 2: 300400 bytes; 2 layers x 2 all-reduces x (8 us + 2 x 1/2 x 100 x 2 bytes / 1 GB/s).
    cost = target_step(tiny(tp=2), batch=1, rows=1)
    assert cost.parts["weights and GEMMs"] == pytest.approx(300400e-9)
    assert cost.parts["tp/pp communication"] == pytest.approx(4 * (8e-6 + 200e-9))


def test_pipeline_parallel_does_not_shorten_a_step():
    cost = target_step(tiny(pp=2), batch=1, rows=1)
    assert cost.parts["weights and GEMMs"] == pytest.approx(600800e-9)
    assert cost.parts["tp/pp communication"] == pytest.approx(8e-6 + 200e-9)


def test_medusa_heads_cost():
    # 3 heads x (100 x 100 + 1000 x 100) params x 2 bytes = 660000 bytes.
    d = Drafting.medusa(trees.CHAIN_3)
    assert (d.rows, d.medusa_heads) == (4, 3)
    assert method_step(tiny(), d, 1).parts["medusa heads"] == pytest.approx(660000e-9)


def test_eagle_levels():
    # CPU_SMALL_10_DEPTH_3: non-leaves per level 1 / 3 / 2; level 0 runs over depth + 1 = 4 accepted rows.
    d = Drafting.eagle(trees.CPU_SMALL_10_DEPTH_3)
    assert d.rows == 11 and d.eagle_level_rows == (4, 3, 2)
    # each level reads fc (2 x 100 x 100) + one layer (100200) + the lm_head (100000), x 2 bytes.
    cost = method_step(tiny(), d, 1)
    assert cost.parts["eagle drafter"] == pytest.approx(3 * (120200 + 100000) * 2e-9)
    # level 0 takes the logits of its last row only (the root's children), the others of every row
    assert d.eagle_levels() == [(4, 1), (3, 3), (2, 2)]
    dynamic = Drafting.eagle_dynamic(top_k=4, num_layers=3, max_draft_len=12)
    assert dynamic.rows == 13 and dynamic.eagle_level_rows == (4, 4, 4)


def test_eagle3_levels_fuse_the_captured_layers_once():
    # A chain of K=3: level 0 over the 4 accepted rows, then one drafted row a level.
    d = Drafting.eagle3(3, fused_layers=3)
    assert d.rows == 4 and d.eagle_level_rows == (4, 1, 1)
    # every level: one layer (100200) with q/k/v over 2 x hidden (+ 100 x 50 x (2 + 2 x 2) = 30000);
    # level 0 also its fc over the 3 captured layers (3 x 100 x 100); EAGLE's 2 x 100 x 100 fc nowhere
    assert [d.eagle_level_params(TINY, level) for level in range(3)] == [160200, 130200, 130200]
    cost = method_step(tiny(), d, 1)
    assert cost.parts["eagle drafter"] == pytest.approx((160200 + 2 * 130200 + 3 * 100000) * 2e-9)
    assert Drafting.eagle(trees.CPU_SMALL_10_DEPTH_3).eagle_level_params(TINY, 1) == 120200  # EAGLE-1/2
    # a draft vocabulary of 100 (d2t): each level's lm_head reads 100 x 100, not the target's 1000 x 100
    small = dataclasses.replace(d, draft_vocab=100)
    cost = method_step(tiny(), small, 1)
    assert cost.parts["eagle drafter"] == pytest.approx((160200 + 2 * 130200 + 3 * 10000) * 2e-9)


def test_cpu_passes_stream_only_the_weights_their_probe_timed_in_cache():
    # 1 ms a decoder layer's worth of weights (100200 params); the GEMMs themselves free. A pass
    # streams its layers' 2 x 100000 GEMM weights, and the 100000 of the lm_head unless the probe
    # timed the lm_head out of cache (its seconds then hold its streaming already).
    profile = RuntimeProfile(runtime="reference", row_compute=0.0, host_step_s=0.0, host_layer_s=1e-3, level_s=0.0)
    for out_of_cache, params in ((frozenset(), 300000), (frozenset({"lm_head"}), 200000)):
        probed = CpuProfile((1, 2), {name: (0.0, 0.0) for name in gemm_shapes(TINY)}, out_of_cache)
        d = Deployment(TINY, dataclasses.replace(CPU_DEVICE, gemms=probed), context_len=0, profile=profile)
        assert target_step(d, 1, 1).parts["weight streaming"] == pytest.approx(params / 100200 * 1e-3)
        # EAGLE's levels: fc 2 x 100 x 100 + the layer's 100000, and the lm_head's 100000 or not
        level = 120000 + params - 200000
        drafter = method_step(d, Drafting.eagle(trees.CPU_SMALL_10_DEPTH_3), 1).parts["eagle drafter"]
        assert drafter == pytest.approx(3 * level / 100200 * 1e-3)


def test_lookahead_rows_are_w_plus_g_times_n_minus_1():
    assert Drafting.lookahead(LookaheadConfig(4, 3, 4)).rows == (4 + 4) * (3 - 1)
    assert Drafting.lookahead(LookaheadConfig(7, 5, 7)).rows == (7 + 7) * (5 - 1)


def test_speedup_is_acceptance_length_times_the_step_ratio():
    d = Drafting.medusa(trees.CHAIN_3)
    (p,) = predict(tiny(), d, 2.5, [1])
    assert p.plain_s == pytest.approx(600800e-9)
    # verification: 2 x 100200 x 2 + 100000 x 2 bytes; heads 660000 bytes.
    assert p.method_s == pytest.approx((600800 + 660000) * 1e-9)
    assert p.speedup == pytest.approx(2.5 * 600800 / 1260800)


def test_bad_acceptance_length_and_batch():
    with pytest.raises(ValueError, match="between 1 and the rows"):
        predict(tiny(), Drafting.medusa(trees.CHAIN_3), 5.0, [1])
    with pytest.raises(ValueError, match="batch size 0"):
        predict(tiny(), Drafting.plain(), 1.0, [0])


def test_every_gpu_type_has_figures():
    assert set(hardware.GPU_PERF) == set(gpus.GPU_TYPES)
    for name, gpu in gpus.GPU_TYPES.items():
        assert (gpu_perf(name).fp8_tflops is not None) == gpu.supports_fp8, name
    with pytest.raises(ValueError, match="unknown GPU type"):
        gpu_perf("tpu-v5")


def test_llama8b_on_h100_is_bandwidth_bound_at_batch_1():
    # 32 x 218112000 decoder params + 128256 x 4096 lm_head, x 2 bytes = 15.01e9 bytes at 3.35 TB/s.
    d = Deployment(presets.preset("llama-3.1-8b"), gpu_perf("h100-sxm-80gb"), context_len=0, step_overhead_s=0)
    assert target_step(d, 1, 1).total_s == pytest.approx(15.0076e9 / 3.35e12, rel=1e-3)


def test_speculation_stops_paying_at_large_batch():
    d = Deployment(presets.preset("llama-3.1-8b"), gpu_perf("h100-sxm-80gb"))
    medusa = Drafting.medusa(trees.MC_SIM_7B_63, 4)
    (one,) = predict(d, medusa, 2.5, [1])
    assert one.speedup > 1.5
    batch = break_even_batch(d, medusa, 2.5)
    assert batch is not None and 2 <= batch <= 64


def test_predict_cli_json(cli):
    rc, out, err = cli(
        "predict",
        "--preset",
        "llama-3.1-8b",
        "--gpu",
        "l40s",
        "--method",
        "lookahead",
        "--lookahead",
        "4,3,4",
        "--acceptance-length",
        "1.5",
        "--batch",
        "1",
        "64",
        "--json",
    )
    assert rc == 0, err
    body = json.loads(out)
    assert set(body["speedup"]) == {"1", "64"} and body["rows_per_step"] == 16
    # the 15 draft rows are not free at batch 1 (their GEMMs, and the n-gram pool where the shipped
    # profile charges one); compute-bound at 64
    assert 1.2 < body["speedup"]["1"] < 1.5 and body["speedup"]["64"] < 1.0
    assert set(body["step_cost"]["1"]) == {"plain_ms", "method_ms", "parts_ms"}
    parts = body["step_cost"]["1"]["parts_ms"]
    assert parts["draft rows' GEMMs"] > 0
    pool = load_calibrations()["trtllm"].profile.lookahead_row_s
    assert ("lookahead mask and n-gram pool" in parts) == (pool > 0)
    interval = body["interval"]["1"]
    assert interval["low"] < interval["point"] == body["speedup"]["1"] < interval["high"]
    assert body["runtime"] == "trtllm" and body["error_band"]["borrowed_from"] == "pytorch-eager"


def test_predict_cli_prices_an_eagle3_tree_by_its_nodes(cli):
    base = ["predict", "--preset", "llama-3.1-8b", "--gpu", "h100-sxm-80gb", "--method", "eagle3", "--json"]
    rc, out, err = cli(*base, "--acceptance-length", "2", "--batch", "1")
    assert rc == 0 and json.loads(out)["rows_per_step"] == 4, err  # a chain of 3
    rc, out, err = cli(*base, "--acceptance-length", "2", "--batch", "1", "--eagle-dynamic-top-k", "4")
    assert rc == 0 and json.loads(out)["rows_per_step"] == 13, err  # 4 x 3 nodes, the default


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--method", "lookahead", "--lookahead", "4,3"], "give W,N,G"),
        (["--method", "lookahead", "--lookahead", "2,1,1"], "ngram 1"),
        (["--method", "medusa", "--tree", "nope"], "unknown tree preset"),
        (["--method", "medusa", "--acceptance-length", "99"], "between 1 and the rows"),
        (["--method", "eagle", "--tree", "chain_3", "--eagle-dynamic-top-k", "4"], "mutually exclusive"),
        (["--method", "none", "--dtype", "fp8", "--gpu", "a100-80gb"], "FP8 tensor cores"),
        (["--method", "eagle3", "--max-total-draft-tokens", "6"], "needs dynamic_tree_max_top_k"),
        (["--method", "eagle3", "--eagle-dynamic-top-k", "2", "--max-total-draft-tokens", "7"], "more than"),
    ],
)
def test_predict_cli_bad_input(cli, args, expected):
    base = ["predict", "--preset", "llama-3.1-8b"] + (["--gpu", "h100-sxm-80gb"] if "--gpu" not in args else [])
    rc, _, err = cli(*base, *args)
    assert rc == 2 and err.count("\n") == 1 and expected in err, err


@pytest.mark.parametrize("preset", sorted(presets.PRESETS))
def test_predict_every_preset_and_gpu(preset):
    for name in gpus.GPU_TYPES:
        d = Deployment(presets.preset(preset), gpu_perf(name))
        for drafting in (
            Drafting.plain(),
            Drafting.medusa(trees.MC_SIM_7B_63),
            Drafting.eagle(trees.MC_SIM_7B_63),
            Drafting.lookahead(LookaheadConfig(4, 3, 4)),
        ):
            for p in predict(d, drafting, 1.0, [1, 8, 64]):
                assert 0 < p.speedup <= 1.0 + 1e-9 and p.method_s >= p.plain_s
