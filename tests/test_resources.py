"""Per-stage machine needs in the plan (pipeline.plan.resources), checked against reported figures."""

from __future__ import annotations

import json

import pytest

from pipeline.errors import InputError
from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots
from pipeline.spec.document import load_spec
from tests.conftest import REPO

KEYS = {"gpus", "gpu_memory_gib_per_gpu", "host_memory_gib", "disk_gib"}
GB = 1e9
GIB = 1024**3
SPEC_70B = "name: big\nmodel: {preset: llama-3.1-70b}\nquantization: {weights: fp8, kv_cache: fp8}\n"


@pytest.fixture
def plan_of(write_spec, tmp_path):
    roots = OutputRoots(tmp_path / "engines", tmp_path / "repo", tmp_path / "cache")

    def plan(text: str):
        return make_plan(load_spec(write_spec(text)), roots).variants[0]

    return plan


@pytest.mark.parametrize("spec", sorted(p.name for p in (REPO / "specs").glob("*.yaml")))
def test_plan_json_reports_every_stages_resources(cli, spec):
    rc, out, err = cli("plan", str(REPO / "specs" / spec), "--json")
    assert rc == 0, err
    for variant in json.loads(out)["variants"]:
        for stage in variant["stages"]:
            resources = stage["resources"]
            assert KEYS <= set(resources), stage["name"]
            assert isinstance(resources["gpus"], int) and resources["host_memory_gib"] > 0
            assert resources["disk_gib"] > 0
            assert (resources["gpus"] == 0) == (resources["gpu_memory_gib_per_gpu"] == 0)
        assert KEYS <= set(variant["serve_resources"])


def test_70b_eagle_quantizes_on_its_four_h100s_by_the_plans_own_numbers(cli):
    rc, out, err = cli("plan", str(REPO / "specs/llama70b-eagle.yaml"), "--json")
    assert rc == 0, err
    stages = {s["name"]: s["resources"] for s in json.loads(out)["variants"][0]["stages"]}
    quantize = stages["quantize"]
    assert quantize["gpus"] == 4
    assert quantize["gpu_memory_gib_per_gpu"] <= 81559 / 1024  # h100-sxm-80gb
    # The reported ~140 GB of GPU memory for a 70B fp16 -> FP8 quantization is the 16-bit weights,
    # now spread over the GPUs (plus at most one module of slack each).
    weights = (quantize["gpu_memory_gib_per_gpu"] - quantize["working_gib_per_gpu"]) * 4 * GIB
    assert 140 * GB <= weights <= 140 * GB * 1.1
    # ... and the ~140 GB of host RAM of a whole-model load is not needed: weights stream to the GPUs.
    assert quantize["host_memory_gib"] < 20
    assert stages["build"]["one_worker"]["gpus"] == 1
    assert stages["build"]["one_worker"]["host_memory_gib"] * 4 == pytest.approx(
        stages["build"]["host_memory_gib"], abs=0.5
    )


def test_without_gpus_quantize_holds_the_float32_model_in_host_ram(plan_of):
    quantize = plan_of(SPEC_70B + "target: reference\n").stage("quantize").resources
    assert quantize.gpus == 0
    # Twice the reported 140 GB of a 16-bit whole-model load: calibration is float32 on the CPU.
    assert 2 * 140 * GB <= quantize.host_memory_gib * GIB <= 2 * 140 * GB * 1.1


def test_a_quantize_stage_that_cannot_fit_the_spec_gpus_is_a_plan_error(plan_of):
    with pytest.raises(InputError) as info:
        plan_of(SPEC_70B + "gpu: {type: h100-sxm-80gb, count: 1}\n")
    line = next(line for line in str(info.value).splitlines() if "quantize stage" in line)
    assert "quantization.weights: the quantize stage does not fit 1 x h100-sxm-80gb: needs" in line
    assert "GiB per GPU (weights 131.4 GiB over 1 GPU(s)" in line and "h100-sxm-80gb has 79.6 GiB" in line
    assert "quantization.offload" in line


@pytest.mark.parametrize("offload", ["cpu", "disk"])
def test_offload_moves_what_does_not_fit_the_gpus_to_host_ram(plan_of, offload):
    small = (
        "gpu: {type: gh200-96gb, count: 1}\n"
        "build: {max_batch_size: 1, max_seq_len: 256, max_input_len: 128, max_num_tokens: 256}\n"
    )
    with pytest.raises(InputError, match="the quantize stage does not fit 1 x gh200-96gb"):
        plan_of(SPEC_70B + small)  # serving fits one GH200 in FP8; quantizing the 16-bit model does not
    spec = SPEC_70B.replace("kv_cache: fp8}", f"kv_cache: fp8, offload: {offload}}}") + small
    quantize = plan_of(spec).stage("quantize").resources
    assert quantize.gpu_memory_gib_per_gpu == pytest.approx(97871 / 1024, abs=0.1)
    assert f"offloaded to {offload}" in quantize.detail
    spilled = float(quantize.detail.split("; ")[-1].split()[0])
    assert spilled > 40
    on_gpus = plan_of(SPEC_70B + small.replace("count: 1", "count: 2")).stage("quantize").resources
    # Disk offload costs host RAM too: ModelOpt 0.47 keeps what it writes back in memory.
    assert quantize.host_memory_gib == pytest.approx(on_gpus.host_memory_gib + spilled, abs=0.2)
    assert quantize.disk_gib == on_gpus.disk_gib


def test_doctor_compares_each_stage_with_the_host(cli):
    rc, out, err = cli("doctor", str(REPO / "specs/llama70b-eagle.yaml"), "--json")
    report = json.loads(out)
    stages = {fit["stage"]: fit for fit in report["variants"][0]["stages"]}
    assert set(stages) == {"quantize", "convert", "build", "package", "serve"}
    assert stages["quantize"]["gpus"] == 4
    if not report["host"]["gpus"]:  # this host (CI) has none: the GPU stages cannot run here
        assert not stages["quantize"]["fits"] and "needs 4 GPU(s), this host has 0" in stages["quantize"]["why"]
        assert rc == 3
