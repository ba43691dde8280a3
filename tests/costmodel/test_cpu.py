"""The CPU cost model on a literal probe profile (the probe itself is timed by bench/costmodel_cpu.py)."""

from __future__ import annotations

import pytest

from pipeline import trees
from pipeline.costmodel.cpu import (
    CpuProfile,
    gemm_shapes,
    method_gemms_s,
    per_row_s,
    predicted_cpu_speedup,
    probe,
    target_gemms_s,
)
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


def test_per_row_work_outside_the_gemms_is_the_fitted_slope_and_charged_per_extra_row():
    # Engine passes measured as their GEMMs + 3 ms + 0.5 ms per row: the slope is 0.5 ms.
    forward = {r: target_gemms_s(PROFILE, TINY, r, r) + 3e-3 + 0.5e-3 * r for r in (1, 4, 8, 12)}
    per_row = per_row_s(PROFILE, TINY, forward)
    assert per_row == pytest.approx(0.5e-3)
    look = Drafting.lookahead(LookaheadConfig(2, 3, 2))
    speedup, cost = predicted_cpu_speedup(PROFILE, TINY, look, 8, 1.6, 15e-3, per_row)
    assert cost == pytest.approx((48 + 0.5 * 7) / 15) and speedup == pytest.approx(1.6 * 15 / 51.5)
    # Plain decoding feeds one row: nothing extra, its cost stays 1.
    assert predicted_cpu_speedup(PROFILE, TINY, Drafting.plain(), 1, 1.0, 15e-3, per_row) == pytest.approx((1, 1))
    assert per_row_s(PROFILE, TINY, {1: 1e-3}) == 0.0


def test_probe_times_every_shape():
    profile = probe(TINY, bf16=False, repeats=1, rows=(1, 2))
    assert set(profile.seconds) == set(NAMES) and all(len(v) == 2 and min(v) > 0 for v in profile.seconds.values())
