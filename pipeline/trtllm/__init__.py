"""TensorRT-LLM 1.2 engine flow: the trtllm-build flag table, the argv, the engine config.

Everything here is pure (no TensorRT-LLM import), so the GPU build is contract-tested on
CPUs: the build stage runs exactly the argv and writes exactly the config predicted here.

TensorRT-LLM removed the TensorRT engine flow (``trtllm-build``, the convert scripts, the
Triton C++ ``tensorrtllm`` engine backend) after 1.2, so 1.2.x is a hard pin, not a floor.
"""

from __future__ import annotations

TRTLLM_VERSION = "1.2.1"
TRTLLM_SERIES = "1.2."

# The NGC Triton container that ships TensorRT-LLM 1.2.1 and the C++ `tensorrtllm` backend.
# UNVERIFIED: tensorrtllm_backend PR #853 moved its container build to TensorRT-LLM 1.2.1 on
# 2026-04-21, so the first NGC release cut after it is expected to carry 1.2.1. Confirm with the
# "TensorRT-LLM version" line of the Triton release notes for that YY.MM (docs.nvidia.com/
# deeplearning/triton-inference-server/release-notes/), or inside the container with
# `python3 -c 'import importlib.metadata as m; print(m.version("tensorrt_llm"))'`.
TRITON_TRTLLM_CONTAINER = "nvcr.io/nvidia/tritonserver:26.05-trtllm-python-py3"
TRITON_TRTLLM_CONTAINER_VERIFIED = False
TRTLLM_BACKEND_DIR = "/opt/tritonserver/backends/tensorrtllm"


def container_hint() -> str:
    """One line telling the user where the engine flow runs."""
    note = "" if TRITON_TRTLLM_CONTAINER_VERIFIED else " (tag unverified: check it ships tensorrt_llm 1.2.1)"
    return f"use the Triton TensorRT-LLM {TRTLLM_VERSION} container {TRITON_TRTLLM_CONTAINER}{note}"
