"""The CPU cost model on a literal probe profile (the probe itself is timed by bench/costmodel_cpu.py)."""

from __future__ import annotations

import pytest

from pipeline import trees
from pipeline.costmodel.cpu import drafting_gemms_s, interpolate, method_gemms_s, predicted_cpu_speedup
from pipeline.costmodel.gemm_probe import CpuProfile, gemm_shapes, probe
from pipeline.costmodel.step import Drafting
from pipeline.geometry import ModelGeometry
from pipeline.speculative import LookaheadConfig

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
    # eagle chain_3: levels (4, 1, 1) rows: each fc + 5 layer GEMMs + lm_head
    eagle = Drafting.eagle(trees.CHAIN_3)
    assert method_gemms_s(PROFILE, TINY, eagle, 4) == pytest.approx((22 + 7 * 2 + 7 + 7) * 1e-3)


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
    # EAGLE adds its drafter's GEMMs from the probe; plain decoding costs one plain step.
    eagle = Drafting.eagle(trees.CHAIN_3)
    _, cost = predicted_cpu_speedup(PROFILE, TINY, eagle, 4, 1.0, 25e-3, forward)
    assert cost == pytest.approx((interpolate(forward, 4) + drafting_gemms_s(PROFILE, eagle) + 5e-3) / 25e-3)
    assert predicted_cpu_speedup(PROFILE, TINY, Drafting.plain(), 1, 1.0, 25e-3, forward) == pytest.approx((1, 1))
    assert interpolate(forward, 24) == pytest.approx(72e-3)  # beyond the last point: the last slope


def test_probe_times_every_shape():
    profile = probe(TINY, bf16=False, repeats=1, rows=(1, 2))
    assert set(profile.seconds) == set(NAMES) and all(len(v) == 2 and min(v) > 0 for v in profile.seconds.values())
