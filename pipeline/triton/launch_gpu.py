"""The GPU serving command: one tritonserver per engine rank under mpirun (MPMD), or one in
orchestrator mode for several models (the whole-spec repository).

Mirrors TensorRT-LLM's ``triton_backend/scripts/launch_triton_server.py`` (leader mode):
``mpirun --allow-run-as-root -n 1 tritonserver ... : -n 1 tritonserver ...``. Every rank
gets ``--disable-auto-complete-config`` and its own Python-backend shared-memory prefix;
ranks other than 0 load only the ``tensorrt_llm`` model and never return from its
initialisation, so they never bind the (shared) ports and only rank 0 serves clients.
The world size must equal the engine's tp*pp, or the backend asserts at load time.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from pipeline.errors import InputError
from pipeline.fleet.placement import place_fleet
from pipeline.plan.types import Plan, VariantPlan

TRITONSERVER = "/opt/tritonserver/bin/tritonserver"
TENSORRT_LLM_MODEL = "tensorrt_llm"


def gpu_launch_argv(
    variant: VariantPlan,
    repo_dir: Path,
    *,
    world_size: int,
    hostfile: Path | None = None,
    multi_model: bool = False,
    devices: Sequence[int] = (),
    tritonserver: str = TRITONSERVER,
) -> list[str]:
    """mpirun argv serving ``repo_dir`` (the variant's Triton repository) on GPUs.

    ``multi_model`` is the orchestrator mode: one tritonserver (world size 1) whose backend
    spawns the per-GPU executor workers itself (single node only); ``devices``: every GPU its
    models use (default: the variant's).
    """
    if multi_model:
        if world_size != 1:
            raise InputError(
                f"orchestrator (multi-model) mode runs one tritonserver: world_size must be 1, "
                f"got {world_size} [variant {variant.name}]"
            )
        if hostfile is not None:
            raise InputError(
                f"orchestrator (multi-model) mode is single-node: drop the hostfile [variant {variant.name}]"
            )
    elif world_size != variant.world_size:
        raise InputError(
            f"world_size {world_size} does not match the engine's tp*pp = {variant.tp}*{variant.pp} = "
            f"{variant.world_size} [variant {variant.name}]"
        )
    serving = variant.serving
    argv: list[str] = []
    if multi_model:
        # launch_triton_server.py --multi-model sets these in the environment of mpirun.
        argv += ["env", "TRTLLM_ORCHESTRATOR=1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES=1"]
    argv += ["mpirun", "--allow-run-as-root"]
    if hostfile is not None:
        argv += ["--hostfile", str(hostfile)]
    for rank in range(world_size):
        if rank:
            argv.append(":")
        # HTTP only with serving.http, and then with its body limit: Triton 2.68 (the 26.04 container) has
        # --http-max-input-size (since 2.59, triton-inference-server/server#8174); 2.51 has none (server#5840).
        http = (
            [f"--http-port={serving.http_port}", f"--http-max-input-size={serving.http_max_request_bytes}"]
            if serving.http
            else ["--allow-http=false"]
        )
        argv += [
            "-n",
            "1",
            tritonserver,
            f"--model-repository={repo_dir}",
            f"--grpc-port={serving.grpc_port}",
            *http,
            f"--metrics-port={serving.metrics_port}",
        ]
        if rank == 0:
            argv += [
                *([f"--http-address={serving.host}"] if serving.http else []),
                f"--grpc-address={serving.host}",
                f"--metrics-address={serving.host}",
            ]
        else:
            argv += ["--model-control-mode=explicit", f"--load-model={TENSORRT_LLM_MODEL}"]
        if multi_model:
            argv += _orchestrator_memory_flags(devices or variant.serving.gpu_device_ids or range(variant.world_size))
        argv += ["--disable-auto-complete-config", f"--backend-config=python,shm-region-prefix-name=prefix{rank}_"]
    return argv


def gpu_spec_launch_argv(plan: Plan, serving: VariantPlan, repo_dir: Path) -> list[str]:
    """One tritonserver in orchestrator mode for the whole-spec repository: each variant's
    tensorrt_llm model spawns its ranks on the GPUs the placement gave it (its gpu_device_ids);
    ``serving``: the variant whose host and ports the server takes."""
    placement = place_fleet(plan)
    assert placement is not None, "a spec served on GPUs has tensorrt variants"
    devices = sorted({gpu for instance in placement.instances for gpu in instance.gpus})
    return gpu_launch_argv(serving, repo_dir, world_size=1, multi_model=True, devices=devices)


def _orchestrator_memory_flags(devices: Iterable[int]) -> list[str]:
    """The spawned workers own the GPUs: tritonserver itself keeps no pinned or CUDA pools
    (what the launch script adds on NGC >= 24.06), for every GPU the engines use."""
    return ["--pinned-memory-pool-byte-size=0", "--enable-peer-access=false"] + [
        f"--cuda-memory-pool-byte-size={device}:0" for device in devices
    ]
