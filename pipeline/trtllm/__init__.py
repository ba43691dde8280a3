"""TensorRT-LLM 1.2 engine flow: the trtllm-build flag table, the argv, the engine config.

Everything here is pure (no TensorRT-LLM import), so the GPU build is contract-tested on
CPUs: the build stage runs exactly the argv and writes exactly the config predicted here.

TensorRT-LLM removed the TensorRT engine flow (``trtllm-build``, the convert scripts, the
Triton C++ ``tensorrtllm`` engine backend) after 1.2, so 1.2.x is a hard pin, not a floor.
"""

from __future__ import annotations

TRTLLM_VERSION = "1.2.1"
TRTLLM_SERIES = "1.2."

# The NGC Triton container that ships TensorRT-LLM 1.2.1 and the C++ `tensorrtllm` backend: the
# first release with 1.2.1 (TensorRT 10.14.1.48, CUDA 13.1). Source: Triton's compatibility matrix,
# docs/introduction/compatibility.md in triton-inference-server/server (26.01/26.02: 1.1.0, 26.03:
# 1.2.0, 26.04 to 26.07: 1.2.1); tensorrtllm_backend moved to release/1.2.1 in PR #853. The 1.3
# line removes the engine flow, so a later tag is not a drop-in replacement.
TRITON_TRTLLM_CONTAINER = "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"
TRTLLM_BACKEND_DIR = "/opt/tritonserver/backends/tensorrtllm"


def container_hint() -> str:
    """One line telling the user where the engine flow runs."""
    return f"use the Triton TensorRT-LLM {TRTLLM_VERSION} container {TRITON_TRTLLM_CONTAINER}"
