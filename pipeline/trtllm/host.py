"""What this host offers TensorRT-LLM: GPUs, TensorRT-LLM, trtllm-build (the engine flow) and
trtllm-serve (the PyTorch backend).

Probes never import tensorrt_llm (that initialises CUDA and takes many seconds); package
versions come from installed metadata and importability from ``find_spec``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from importlib import metadata

from pipeline.spec.gpus import GpuType
from pipeline.trtllm import TRTLLM_SERIES

BUILD_PROGRAM = "trtllm-build"
SERVE_PROGRAM = "trtllm-serve"  # the PyTorch backend's OpenAI-compatible server


# A GPU found on this host is described exactly like a GPU type named in a spec.
LocalGpu = GpuType


def package_version(*names: str) -> str | None:
    """The installed version of the first distribution found among ``names``."""
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def trtllm_version() -> str | None:
    return package_version("tensorrt_llm", "tensorrt-llm")


def _program_missing(program: str) -> list[str]:
    """What stops TensorRT-LLM's ``program`` from running here: the program, the Python package."""
    missing = []
    if shutil.which(program) is None:
        missing.append(f"{program} is not on PATH")
    if importlib.util.find_spec("tensorrt_llm") is None:
        missing.append("the tensorrt_llm Python package is not importable")
    return missing


def engine_flow_missing() -> list[str]:
    """What stops trtllm-build from running here (empty when it can run)."""
    missing = _program_missing(BUILD_PROGRAM)
    if importlib.util.find_spec("tensorrt_llm") is not None:
        version = trtllm_version()
        if version is not None and not version.startswith(TRTLLM_SERIES):
            missing.append(
                f"TensorRT-LLM {version} is installed but engines need {TRTLLM_SERIES}x "
                "(the TensorRT engine flow was removed after 1.2)"
            )
    return missing


def parse_nvidia_smi(text: str) -> list[LocalGpu]:
    """Lines of ``nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv,noheader``."""
    gpus = []
    for line in text.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) < 3:
            continue
        try:
            major, minor = (int(x) for x in parts[1].split(".")[:2])
            memory = int(parts[2].split()[0])
        except ValueError:
            continue  # "[N/A]" on MIG/virtual devices: not a GPU we can size
        gpus.append(LocalGpu(parts[0], (major, minor), memory))
    return gpus


def local_gpus(run=subprocess.run) -> list[LocalGpu]:
    """GPUs via nvidia-smi, else via torch.cuda; empty on a CPU host."""
    if shutil.which("nvidia-smi"):
        try:
            result = run(
                ["nvidia-smi", "--query-gpu=name,compute_cap,memory.total", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            result = None
        if result is not None and result.returncode == 0:
            return parse_nvidia_smi(result.stdout)
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        gpus.append(LocalGpu(props.name, (props.major, props.minor), props.total_memory // (1024 * 1024)))
    return gpus


def visible_gpu_count() -> int | None:
    """GPUs a child process may use: CUDA_VISIBLE_DEVICES wins over what nvidia-smi lists."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    if shutil.which("nvidia-smi") is None:
        return None
    return len(local_gpus())


def llm_api_missing() -> list[str]:
    """What stops trtllm-serve (the PyTorch backend, ``target: pytorch``) from running here (empty when it can)."""
    return _program_missing(SERVE_PROGRAM)
