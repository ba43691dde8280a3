"""The GPU serving command (launch_triton_server.py leader mode and orchestrator mode)."""

from __future__ import annotations

from pathlib import Path

import pytest
from trtllm_helpers import EXAMPLE_SPECS, PRESET_8B

from pipeline.errors import InputError
from pipeline.triton.launch_gpu import gpu_launch_argv

REPO = Path("/repo/v")


def ranks(argv: list[str]) -> list[list[str]]:
    """The per-rank tritonserver commands of an MPMD mpirun argv."""
    body = argv[argv.index("mpirun") + 1 :]
    groups, current = [], []
    for arg in body:
        if arg == ":":
            groups.append(current)
            current = []
        else:
            current.append(arg)
    groups.append(current)
    return [group[group.index("-n") :] for group in groups]


@pytest.mark.parametrize("spec_file", EXAMPLE_SPECS, ids=lambda p: p.stem)
def test_one_tritonserver_per_rank_for_every_example(spec_file, plan_example):
    for variant in plan_example(spec_file):
        argv = gpu_launch_argv(variant, REPO, world_size=variant.world_size)
        assert argv[:2] == ["mpirun", "--allow-run-as-root"]
        per_rank = ranks(argv)
        assert len(per_rank) == variant.tp * variant.pp == variant.world_size
        for rank, command in enumerate(per_rank):
            assert command[:3] == ["-n", "1", "/opt/tritonserver/bin/tritonserver"]
            assert f"--model-repository={REPO}" in command and "--disable-auto-complete-config" in command
            assert f"--backend-config=python,shm-region-prefix-name=prefix{rank}_" in command
            explicit = "--model-control-mode=explicit" in command and "--load-model=tensorrt_llm" in command
            assert explicit == (rank != 0)


def test_rank0_serves_on_the_spec_ports_and_host(plan_text):
    variant = plan_text(
        PRESET_8B + "parallel: {tp: 2, pp: 2}\nserving: {host: 0.0.0.0, grpc_port: 9001, http: true, "
        "http_port: 9000, metrics_port: 9002, gpu_device_ids: [0, 1, 2, 3]}\n"
    )[0]
    rank0, *others = ranks(gpu_launch_argv(variant, REPO, world_size=4))
    for flag in (
        "--grpc-port=9001",
        "--http-port=9000",
        "--metrics-port=9002",
        "--http-address=0.0.0.0",
        "--grpc-address=0.0.0.0",
    ):
        assert flag in rank0
    assert len(others) == 3 and all("--http-address=0.0.0.0" not in command for command in others)
    assert len(variant.serving.gpu_device_ids) == variant.world_size


def test_http_is_off_unless_the_spec_turns_it_on(plan_text):  # triton-inference-server/server#5840
    variant = plan_text(PRESET_8B + "parallel: {tp: 2}\nserving: {http_port: 9000}\n")[0]
    for command in ranks(gpu_launch_argv(variant, REPO, world_size=2)):
        assert "--allow-http=false" in command
        assert not [arg for arg in command if arg.startswith(("--http-port", "--http-address"))]


def test_http_bodies_are_bounded_by_tritons_own_limit(plan_text):
    """The 26.04 container's Triton 2.68 has --http-max-input-size (server#8174, since 2.59)."""
    default, bounded = (
        plan_text(PRESET_8B + f"serving: {{http: true{extra}}}\n")[0]
        for extra in ("", ", http_max_request_bytes: 65536")
    )
    assert "--http-max-input-size=1048576" in ranks(gpu_launch_argv(default, REPO, world_size=1))[0]
    assert "--http-max-input-size=65536" in ranks(gpu_launch_argv(bounded, REPO, world_size=1))[0]


def test_world_size_must_be_tp_times_pp(plan_text):
    variant = plan_text(PRESET_8B + "parallel: {tp: 2, pp: 2}\n")[0]
    with pytest.raises(InputError, match=r"world_size 2 does not match the engine's tp\*pp = 2\*2 = 4"):
        gpu_launch_argv(variant, REPO, world_size=2)


def test_multi_node_uses_a_hostfile(plan_text, tmp_path):
    variant = plan_text(PRESET_8B + "parallel: {tp: 8, pp: 2}\n")[0]
    argv = gpu_launch_argv(variant, REPO, world_size=16, hostfile=tmp_path / "hosts")
    assert argv[:4] == ["mpirun", "--allow-run-as-root", "--hostfile", str(tmp_path / "hosts")]
    assert len(ranks(argv)) == 16


def test_orchestrator_mode_is_one_server_with_the_env_set(plan_text):
    variant = plan_text(PRESET_8B + "parallel: {tp: 2}\nserving: {gpu_device_ids: [2, 3]}\n")[0]
    argv = gpu_launch_argv(variant, REPO, world_size=1, multi_model=True)
    assert argv[:3] == ["env", "TRTLLM_ORCHESTRATOR=1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES=1"]
    (only,) = ranks(argv)
    assert "--model-control-mode=explicit" not in only
    assert {"--cuda-memory-pool-byte-size=2:0", "--cuda-memory-pool-byte-size=3:0"} <= set(only)
    with pytest.raises(InputError, match="world_size must be 1"):
        gpu_launch_argv(variant, REPO, world_size=2, multi_model=True)
