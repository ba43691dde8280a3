"""The runtime on a CUDA device (weights, KV cache and step tensors on the GPU, plain torch matmuls).

Needs a GPU: skipped where torch has no CUDA (the CPU path is what every other test checks)."""

from __future__ import annotations

import pytest
import torch

from pipeline.runtime.model.engine import Engine
from pipeline.runtime.spec_decode.base import PlainDecoding
from pipeline.runtime.spec_decode.factory import make_method
from tests.runtime import drive

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@needs_cuda
def test_cuda_engine_matches_the_cpu_engine_needs_cuda(engine):
    gpu = Engine.load(engine.config.folder, device="cuda")
    assert gpu.device.type == "cuda" and gpu.lm_heads[0].weight.device.type == "cuda"
    requests = drive.requests(drive.SPEC_PROMPTS[:4], 12)
    cpu_out = drive.decode(engine, PlainDecoding(), requests, in_flight=4)
    gpu_out = drive.decode(gpu, PlainDecoding(), requests, in_flight=4)
    assert {k: v.tokens for k, v in gpu_out.items()} == {k: v.tokens for k, v in cpu_out.items()}


@needs_cuda
@pytest.mark.parametrize("name", sorted(drive.METHODS))
def test_cuda_speculative_decoding_is_lossless_needs_cuda(spec_engines, name):
    kind, settings = drive.METHODS[name]
    gpu = Engine.load(spec_engines(kind).config.folder, device="cuda")
    method, _ = make_method(gpu, settings)
    requests = drive.requests()
    with torch.device(gpu.device):
        plain = drive.decode(gpu, PlainDecoding(), requests, in_flight=1)
        spec = drive.decode(gpu, method, requests, in_flight=4)
    assert {k: v.tokens for k, v in spec.items()} == {k: v.tokens for k, v in plain.items()}
    assert drive.totals(spec).mean_acceptance_length > 1.0
