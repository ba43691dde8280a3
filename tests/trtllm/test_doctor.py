"""`specdeploy doctor`: host report and per-variant verdicts (hosts are simulated)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from trtllm_helpers import PRESET_8B

from pipeline import doctor
from pipeline.doctor import HostReport, assess_variant, host_checks
from pipeline.trtllm.host import LocalGpu, parse_nvidia_smi

H100 = LocalGpu("NVIDIA H100 80GB HBM3", (9, 0), 81559)
A100 = LocalGpu("NVIDIA A100-SXM4-80GB", (8, 0), 81920)
L4 = LocalGpu("NVIDIA L4", (8, 9), 23034)


def gpu_host(*gpus: LocalGpu, **changes) -> HostReport:
    report = HostReport(
        python="3.12.3",
        torch="2.9.0",
        tensorrt="10.13.0",
        trtllm="1.2.1",
        engine_flow_missing=(),
        gpus=gpus,
        mpi="mpirun (Open MPI) 4.1.7",
        trtllm_backend=True,
        cpu_tritonserver=None,
        cpu_bf16_gemm=False,
        engines_dir="engines",
        free_disk_gib=500.0,
    )
    return dataclasses.replace(report, **changes)


def test_parse_nvidia_smi():
    text = "NVIDIA H100 80GB HBM3, 9.0, 81559 MiB\nNVIDIA L4, 8.9, 23034 MiB\nweird, [N/A], [N/A]\n"
    assert parse_nvidia_smi(text) == [H100, L4]


def test_a_gpu_host_with_trtllm_builds_the_plan(plan_text):
    variant = plan_text(
        PRESET_8B + "quantization: {weights: fp8}\nparallel: {tp: 2}\ngpu: {type: h100-sxm-80gb, count: 2}\n"
    )[0]
    verdict = assess_variant(variant, gpu_host(H100, H100))
    assert verdict.can_build and verdict.reasons == [] and verdict.notes == []


@pytest.mark.parametrize(
    "gpus,changes,reason",
    [
        ((), {}, "no NVIDIA GPU found"),
        ((H100,), {}, "needs tp*pp = 2 GPUs, this host has 1"),
        ((A100, A100), {}, "FP8 needs compute capability >= 8.9; NVIDIA A100-SXM4-80GB is 8.0"),
        ((H100, H100), {"engine_flow_missing": ("trtllm-build is not on PATH",)}, "trtllm-build is not on PATH"),
        ((H100, H100), {"free_disk_gib": 1.0}, "of disk, engines has 1.0 GiB free"),
    ],
)
def test_what_stops_a_tensorrt_build(plan_text, gpus, changes, reason):
    variant = plan_text(PRESET_8B + "quantization: {weights: fp8}\nparallel: {tp: 2}\n")[0]
    verdict = assess_variant(variant, gpu_host(*gpus, **changes))
    assert not verdict.can_build and any(reason in r for r in verdict.reasons)


def test_memory_estimate_against_the_local_gpu(plan_text):
    variant = plan_text(PRESET_8B + "build: {max_batch_size: 64, max_seq_len: 8192, max_input_len: 4096}\n")[0]
    verdict = assess_variant(variant, gpu_host(L4))
    assert not verdict.can_build and "the smallest GPU here has 22.5 GiB" in verdict.reasons[0]


def test_other_architecture_than_planned_is_a_note(plan_text):
    variant = plan_text(PRESET_8B + "gpu: {type: l40s}\n")[0]
    verdict = assess_variant(variant, gpu_host(H100))
    assert verdict.can_build and "not portable across GPU architectures" in verdict.notes[0]


def test_reference_variants_build_anywhere(plan_text):
    variant = plan_text(PRESET_8B + "target: reference\n")[0]
    assert assess_variant(variant, gpu_host(engine_flow_missing=("x",))).can_build


def test_pytorch_backend_variants_build_anywhere_and_say_what_serving_needs(plan_text):
    # no engine to build: the checkpoint, the adapters and trtllm-serve's options are written on any host
    variant = plan_text(PRESET_8B + "target: pytorch\nparallel: {tp: 2}\n")[0]
    cpu = gpu_host(
        engine_flow_missing=("trtllm-build is not on PATH",), llm_api_missing=("trtllm-serve is not on PATH",)
    )
    verdict = assess_variant(variant, cpu)
    assert verdict.can_build and verdict.reasons == []
    assert verdict.notes == [
        "serving here: trtllm-serve is not on PATH",
        "serving here: needs 2 GPU(s), this host has 0",
    ]
    # FP8 on A100s: said, not refused
    fp8 = plan_text(PRESET_8B + "target: pytorch\nparallel: {tp: 2}\nquantization: {weights: fp8}\n")[0]
    notes = assess_variant(fp8, gpu_host(A100, A100)).notes
    assert notes == ["serving here: FP8 needs compute capability >= 8.9; NVIDIA A100-SXM4-80GB is 8.0"]
    assert assess_variant(variant, gpu_host(H100, H100)).notes == []


def test_checks_say_whether_trtllm_serve_can_run():
    checks = {c.name: c for c in host_checks(gpu_host(llm_api_missing=("trtllm-serve is not on PATH",)))}
    assert (
        checks["trtllm-serve"].status == "missing"
        and "specdeploy serve runs its stand-in" in checks["trtllm-serve"].detail
    )
    assert {c.name: c for c in host_checks(gpu_host())}["trtllm-serve"].status == "ok"


def test_bfloat16_reference_engines_need_cpu_bf16_gemms_to_be_fast(plan_text):
    variant = plan_text(PRESET_8B + "target: reference\n")[0]
    assert variant.build.dtype == "bfloat16"  # the spec default
    slow = assess_variant(variant, gpu_host(cpu_bf16_gemm=False))
    assert slow.can_build and any("bfloat16 without CPU bf16 GEMMs" in note for note in slow.notes)
    assert not any("bf16" in note for note in assess_variant(variant, gpu_host(cpu_bf16_gemm=True)).notes)


def test_checks_explain_the_trtllm_pin():
    checks = {c.name: c for c in host_checks(gpu_host(trtllm="1.3.0", python="3.11.7"))}
    assert checks["TensorRT-LLM"].status == "warn" and "removed the engine flow" in checks["TensorRT-LLM"].detail
    assert "3.10 and 3.12" in checks["Python"].detail
    missing = {c.name: c for c in host_checks(gpu_host(trtllm=None))}["TensorRT-LLM"]
    assert missing.status == "missing" and "nvcr.io/nvidia/tritonserver:" in missing.detail


def test_cli_doctor_exit_codes(cli, write_spec, monkeypatch):
    # The disk rule is tested above with a fake host; here the exit codes are, on any host's disk (a
    # CI host once had almost none left, and SmolLM2's engines then rightly did not fit).
    monkeypatch.setattr(doctor, "_free_disk_gib", lambda _folder: 1000.0)
    rc, out, _ = cli("doctor", "--json")
    report = json.loads(out)
    assert rc == 0 and report["ok"] and {c["name"] for c in report["checks"]} >= {"Python", "TensorRT-LLM", "GPUs"}
    # SmolLM2 on the reference target fits any CI host's memory (an 8B model's RAM needs would make
    # the result depend on this host; that rule is tested above with a fake host).
    reference = write_spec("name: r\nmodel: {builtin: smollm2-135m-instruct}\ntarget: reference\n", name="ref.yaml")
    rc, out, _ = cli("doctor", "--json", str(reference))
    assert rc == 0, json.loads(out)["variants"]
    if report["host"]["engine_flow_missing"]:  # a CPU host cannot build a tensorrt target
        rc, out, _ = cli("doctor", "--json", str(write_spec(PRESET_8B, name="gpu.yaml")))
        assert rc == 3 and json.loads(out)["variants"][0]["can_build"] is False
