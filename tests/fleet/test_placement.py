"""Variants served together from one GPU server: placement on the spec's GPUs and KV-cache
limits that add up (pure planning, planned from presets: no weights needed)."""

from __future__ import annotations

import pytest

from pipeline.errors import InputError
from pipeline.fleet.placement import RESERVE_FRACTION, place_fleet
from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots
from pipeline.spec.document import load_spec

BASE = """\
name: served
model: {{preset: llama-3.1-8b, dtype: bfloat16}}
speculative: {{method: lookahead}}
build: {{max_batch_size: {batch}, max_input_len: 2048, max_seq_len: 4096}}
target: tensorrt
gpu: {{type: {gpu}, count: {count}}}
variants:
"""


def plan(write_spec, tmp_path, variants: str, *, batch: int = 16, gpu: str = "h100-sxm-80gb", count: int = 2):
    spec = write_spec(BASE.format(batch=batch, gpu=gpu, count=count) + variants)
    return make_plan(load_spec(spec), OutputRoots(tmp_path / "e", tmp_path / "t", tmp_path / "c"))


def test_variants_are_spread_over_the_gpus_and_their_kv_limits_add_up(write_spec, tmp_path):
    fleet = plan(
        write_spec,
        tmp_path,
        """\
  - name: base
  - name: support-ft
  - name: code-ft
    parallel: {tp: 2}
  - name: on-the-cpu
    target: reference
""",
    )
    placement = place_fleet(fleet)
    by_name = {instance.variant: instance for instance in placement.instances}
    assert set(by_name) == {"base", "support-ft", "code-ft"}  # the reference variant runs on the CPU
    assert by_name["code-ft"].gpus == (0, 1)
    assert {by_name["base"].gpus, by_name["support-ft"].gpus} == {(0,), (1,)}  # one each: least loaded first
    usable = placement.gpu.memory_gib * (1 - RESERVE_FRACTION)
    for index in range(2):
        assert placement.used_gib(index) <= usable + 1e-9
        assert len(placement.on_gpu(index)) == 2
    for name, instance in by_name.items():
        variant = next(v for v in fleet.variants if v.name == name)
        wanted = variant.build.max_batch_size * variant.build.engine_max_seq_len
        # At least every sequence full; whole KV blocks; the spare memory shared, not left idle.
        assert instance.max_tokens_in_paged_kv_cache >= wanted
        assert instance.max_tokens_in_paged_kv_cache % variant.build.tokens_per_block == 0
        assert instance.kv_gib >= instance.kv_wanted_gib
    assert min(usable - placement.used_gib(i) for i in range(2)) < 0.1


def test_the_spec_device_ids_are_kept_and_checked(write_spec, tmp_path):
    fleet = plan(
        write_spec,
        tmp_path,
        """\
  - name: a
    serving: {gpu_device_ids: [1]}
  - name: b
    serving: {gpu_device_ids: [1]}
  - name: c
""",
    )
    by_name = {i.variant: i for i in place_fleet(fleet).instances}
    assert by_name["a"].gpus == by_name["b"].gpus == (1,) and by_name["c"].gpus == (0,)
    bad = plan(write_spec, tmp_path, "  - name: a\n    serving: {gpu_device_ids: [2]}\n")
    with pytest.raises(InputError, match=r"gpu_device_ids \[2\] must name 1 distinct GPUs"):
        place_fleet(bad)


def test_variants_that_cannot_share_the_gpus_are_listed_per_gpu_with_the_overflow(write_spec, tmp_path):
    fleet = plan(write_spec, tmp_path, "  - name: a\n  - name: b\n  - name: c\n", batch=32, gpu="l40s", count=1)
    with pytest.raises(InputError) as info:
        place_fleet(fleet)
    first, advice = str(info.value).splitlines()
    assert first.startswith("GPU 0 (l40s, ") and "a rank 0 " in first and "b rank 0 " in first
    assert "c rank 0 " in first and ", over by " in first
    assert "serving.gpu_device_ids" in advice


def test_mixed_gpu_types_and_missing_gpus_are_refused(write_spec, tmp_path):
    mixed = plan(write_spec, tmp_path, "  - name: a\n  - name: b\n    gpu: {type: l40s, count: 2}\n")
    with pytest.raises(InputError, match="one GPU type, not h100-sxm-80gb, l40s"):
        place_fleet(mixed)
    cpu_only = plan(write_spec, tmp_path, "  - name: a\n    target: reference\n")
    assert place_fleet(cpu_only) is None
