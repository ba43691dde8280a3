"""The CPU cost model on a literal probe profile (the probe itself is timed by bench/costmodel_cpu.py)."""

from __future__ import annotations

import json

import pytest

from pipeline import trees
from pipeline.costmodel import gemm_probe
from pipeline.costmodel.cpu import interpolate, method_gemms_s, predicted_cpu_speedup
from pipeline.costmodel.gemm_probe import CpuProfile, gemm_shapes, probe
from pipeline.geometry import ModelGeometry
from pipeline.methods.drafting import Drafting
from pipeline.methods.lookahead import LookaheadConfig

TINY = ModelGeometry(
    "tiny",
    vocab_size=100,
    hidden_size=8,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=4,
    intermediate_size=16,
    max_position_embeddings=64,
    rope_theta=1e4,
)
NAMES = tuple(gemm_shapes(TINY))
# Every GEMM: 1 ms at 1 row, 2 ms at 4 rows, 6 ms at 12 rows (linear in between and beyond).
PROFILE = CpuProfile((1, 4, 12), {name: (1e-3, 2e-3, 6e-3) for name in NAMES})


def test_interpolation_between_and_beyond_the_probe():
    assert PROFILE.gemm_s("qkv", 1) == pytest.approx(1e-3)
    assert PROFILE.gemm_s("qkv", 8) == pytest.approx(4e-3)
    assert PROFILE.gemm_s("qkv", 16) == pytest.approx(8e-3)
    assert PROFILE.gemm_s("qkv", 0) == 0.0


def test_step_gemms_by_method():
    # plain: 2 layers x 5 GEMMs x 1 ms + lm_head 1 ms
    assert method_gemms_s(PROFILE, TINY, Drafting.plain(), 1) == pytest.approx(11e-3)
    # lookahead at 8 rows: 10 x 4 ms + lm_head over 8 rows 4 ms
    look = Drafting.lookahead(LookaheadConfig(2, 3, 2))
    assert method_gemms_s(PROFILE, TINY, look, 8) == pytest.approx(44e-3)
    # medusa chain_3 (4 rows): 10 x 2 + 2 lm_head, 3 ResBlocks x 1, lm_head over 3 rows 1.667
    medusa = Drafting.medusa(trees.CHAIN_3)
    assert method_gemms_s(PROFILE, TINY, medusa, 4) == pytest.approx((22 + 3 + 1 + 2 / 3) * 1e-3)
    # eagle chain_3: levels (4, 1, 1) rows: each fc + 5 layer GEMMs + lm_head; level 0's lm_head
    # over its last row only: 6 x 2 + 1
    eagle = Drafting.eagle(trees.CHAIN_3)
    assert method_gemms_s(PROFILE, TINY, eagle, 4) == pytest.approx((22 + 13 + 7 + 7) * 1e-3)


def test_plain_overhead_is_the_one_fitted_parameter():
    # plain measured 15 ms = 11 ms of GEMMs + 4 ms other; lookahead: 44 + 4 = 48 ms for AL 1.6.
    speedup, cost = predicted_cpu_speedup(PROFILE, TINY, Drafting.lookahead(LookaheadConfig(2, 3, 2)), 8, 1.6, 15e-3)
    assert cost == pytest.approx(48 / 15) and speedup == pytest.approx(1.6 * 15 / 48)


def test_measured_engine_passes_are_the_target_pass_when_given():
    # Engine passes measured at 1 / 8 / 16 rows: 20 / 40 / 56 ms; plain step 25 ms, so other = 5 ms.
    forward = {1: 20e-3, 8: 40e-3, 16: 56e-3}
    look = Drafting.lookahead(LookaheadConfig(2, 3, 2))
    speedup, cost = predicted_cpu_speedup(PROFILE, TINY, look, 12, 1.6, 25e-3, forward)
    assert cost == pytest.approx((48 + 5) / 25) and speedup == pytest.approx(1.6 * 25 / 53)
    # EAGLE adds its drafter's GEMMs from the probe (13 + 7 + 7 ms) and, per level, one target layer's
    # work outside its GEMMs: (20 ms pass - 11 ms probed GEMMs) / 2 layers = 4.5 ms; the pass at 4
    # rows is 20 + 20 x 3 / 7 ms. Plain decoding costs one plain step.
    eagle = Drafting.eagle(trees.CHAIN_3)
    _, cost = predicted_cpu_speedup(PROFILE, TINY, eagle, 4, 1.0, 25e-3, forward)
    assert cost == pytest.approx((20 + 60 / 7 + 27 + 3 * 4.5 + 5) / 25)
    assert predicted_cpu_speedup(PROFILE, TINY, Drafting.plain(), 1, 1.0, 25e-3, forward) == pytest.approx((1, 1))
    assert interpolate(forward, 24) == pytest.approx(72e-3)  # beyond the last point: the last slope


def test_probe_times_every_shape():
    profile = probe(TINY, bf16=False, repeats=1, rows=(1, 2))
    assert set(profile.seconds) == set(NAMES) and all(len(v) == 2 and min(v) > 0 for v in profile.seconds.values())


def test_probe_names_the_weights_larger_than_the_last_level_cache(monkeypatch):
    # TINY's lm_head is 100 x 8 float32 = 3200 bytes, its fc 16 x 8 x 4 = 512; a 1 KiB "cache"
    monkeypatch.setattr(gemm_probe, "last_level_cache_bytes", lambda: 1024)
    assert probe(TINY, bf16=False, repeats=1, rows=(1,)).out_of_cache == {"lm_head"}
    monkeypatch.setattr(gemm_probe, "last_level_cache_bytes", lambda: None)  # unknown: none assumed
    assert probe(TINY, bf16=False, repeats=1, rows=(1,)).out_of_cache == frozenset()


def test_last_level_cache_from_sysfs(tmp_path):
    for index, level, size in (("index0", "1", "48K"), ("index2", "2", "2048K"), ("index3", "3", "32768K")):
        (tmp_path / index).mkdir()
        (tmp_path / index / "level").write_text(level + "\n")
        (tmp_path / index / "size").write_text(size + "\n")
    assert gemm_probe.last_level_cache_bytes(tmp_path) == 32 << 20
    assert gemm_probe.last_level_cache_bytes(tmp_path / "missing") is None


def test_profiles_keep_what_was_out_of_cache_through_json_and_the_fastest_of():
    a = CpuProfile((1, 4), {"qkv": (1.0, 2.0), "lm_head": (5.0, 9.0)}, frozenset({"lm_head"}))
    b = CpuProfile((1, 4), {"qkv": (0.5, 3.0), "lm_head": (6.0, 8.0)}, frozenset({"lm_head", "qkv"}))
    assert CpuProfile.from_dict(json.loads(json.dumps(b.to_dict()))) == b
    assert CpuProfile.from_dict({"rows": [1], "seconds": {"qkv": [1.0]}}).out_of_cache == frozenset()  # older probes
    fastest = CpuProfile.fastest([a, b])
    # entry by entry the faster; out of cache only what every probe found out of cache
    assert fastest.seconds == {"qkv": (0.5, 2.0), "lm_head": (5.0, 8.0)} and fastest.out_of_cache == {"lm_head"}
