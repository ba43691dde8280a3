"""The reference backend inside a real tritonserver (nvidia-pytriton 2.51, CPU), talked to over gRPC.

Only the ``tensorrt_llm`` model (the project's real config) is served, so this checks the
backend's side of the contract: decoupled streaming, the final flag, tensor shapes, per-request
errors, and the custom metrics. The ensemble/tokenizer path is tested in tests/triton/.
"""

from __future__ import annotations

import urllib.request

import numpy as np
import pytest

from pipeline.triton import pbtxt
from pipeline.triton.configs import RepositorySettings, tensorrt_llm_config
from pipeline.triton.launch_cpu import CpuServerConfig, CpuTritonServer
from tests.conftest import REPO as REPO_ROOT
from tests.runtime.fixtures import PROMPTS, engine_greedy
from tests.runtime.triton.grpc_stream import stream
from tests.servers import free_ports

pytestmark = [pytest.mark.tritonserver, pytest.mark.slow]


@pytest.fixture(scope="module")
def server(module_tmp, engine_dir):
    repo = module_tmp("repo")
    params = {
        "gpt_model_path": str(engine_dir),
        "exclude_input_in_output": "true",
        "decoding_mode": "top_k_top_p",
        "reference_num_threads": "1",
    }
    settings = RepositorySettings("ensemble", 8, True, False, 1, 1, 0, {}, {}, params)
    (repo / "tensorrt_llm" / "1").mkdir(parents=True)
    pbtxt.write(tensorrt_llm_config(settings), repo / "tensorrt_llm" / "config.pbtxt")
    http, grpc, metrics = free_ports(3)
    config = CpuServerConfig(
        repositories=(repo,),
        cache_dir=REPO_ROOT / ".cache",
        http_port=http,
        grpc_port=grpc,
        metrics_port=metrics,
        ready_timeout=180,
        models=("tensorrt_llm",),
        log_file=repo.parent / "tritonserver.log",
    )
    with CpuTritonServer(config) as running:
        yield running


def test_streamed_tokens_equal_the_engine(server, engine):
    want = engine_greedy(engine, PROMPTS[0], 5)
    got = stream(server, {"a": (PROMPTS[0], 5, {"streaming": np.array([[True]])}), "b": (PROMPTS[2], 4, {})})
    assert [piece.shape for piece in got["a"]] == [(1, 1, 1)] * 5
    assert [int(piece[0, 0, 0]) for piece in got["a"]] == want
    assert got["b"][0][0, 0].tolist() == engine_greedy(engine, PROMPTS[2], 4)


def test_too_long_prompt_is_an_error_and_the_server_keeps_serving(server):
    got = stream(server, {"long": (list(range(70)), 3, {})})
    assert "max_input_len 64" in str(got["long"][0])
    assert stream(server, {"ok": (PROMPTS[1], 2, {})})["ok"][0].shape == (1, 1, 2)


def test_custom_metrics_are_exported(server):
    stream(server, {"m": (PROMPTS[1], 3, {})})
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.config.metrics_port}/metrics", timeout=10).read().decode()
    line = next(row for row in text.splitlines() if row.startswith("specdeploy_reference_generated_tokens_total"))
    assert float(line.split()[-1]) >= 3
