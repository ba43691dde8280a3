"""The reference backend inside a real tritonserver (nvidia-pytriton 2.51, CPU), talked to over gRPC.

Only the ``tensorrt_llm`` model (the project's real config) is served, so this checks the
backend's side of the contract: decoupled streaming, the final flag, tensor shapes, per-request
errors, and the custom metrics. The ensemble/tokenizer path is tested in tests/triton/.
"""

from __future__ import annotations

import queue
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from pipeline.triton import pbtxt
from pipeline.triton.configs import RepositorySettings, tensorrt_llm_config
from pipeline.triton.launch_cpu import CpuServerConfig, CpuTritonServer
from tests.runtime.test_engine import PROMPTS, engine_greedy

pytestmark = [pytest.mark.tritonserver, pytest.mark.slow]
REPO_ROOT = Path(__file__).resolve().parents[2]


def _free_ports(count: int) -> list[int]:
    import socket

    socks = [socket.socket() for _ in range(count)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.fixture(scope="module")
def server(tmp_path_factory, engine_dir):
    repo = tmp_path_factory.mktemp("repo")
    params = {"gpt_model_path": str(engine_dir), "exclude_input_in_output": "true",
              "decoding_mode": "top_k_top_p", "reference_num_threads": "1"}
    settings = RepositorySettings("ensemble", 8, True, False, 1, 1, 0, {}, {}, params)
    (repo / "tensorrt_llm" / "1").mkdir(parents=True)
    pbtxt.write(tensorrt_llm_config(settings), repo / "tensorrt_llm" / "config.pbtxt")
    http, grpc, metrics = _free_ports(3)
    config = CpuServerConfig(repositories=(repo,), cache_dir=REPO_ROOT / ".cache", http_port=http,
                             grpc_port=grpc, metrics_port=metrics, ready_timeout=180, models=("tensorrt_llm",),
                             log_file=repo.parent / "tritonserver.log")
    with CpuTritonServer(config) as running:
        yield running


def _stream(server, requests: dict[str, tuple[list[int], int, dict]]) -> dict[str, list]:
    """Send all requests on one stream; collect each one's responses (or error) until its final flag."""
    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    for rid, (prompt, n, extra) in requests.items():
        arrays = {"input_ids": np.array([prompt], np.int32), "input_lengths": np.array([[len(prompt)]], np.int32),
                  "request_output_len": np.array([[n]], np.int32), **extra}
        inputs = []
        for name, value in arrays.items():
            tensor = grpcclient.InferInput(name, list(value.shape), {np.dtype(np.int32): "INT32",
                                                                     np.dtype(bool): "BOOL"}[value.dtype])
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        client.async_stream_infer("tensorrt_llm", inputs, request_id=rid, enable_empty_final_response=True)
    got: dict[str, list] = {rid: [] for rid in requests}
    open_ids = set(requests)
    while open_ids:
        result, error = results.get(timeout=60)
        if error is not None:  # an error response is final and carries no id: one bad request per call
            rid = next(iter(open_ids))
            got[rid].append(error)
            open_ids.discard(rid)
            continue
        response = result.get_response()
        rid = response.id
        if response.outputs:
            got[rid].append(result.as_numpy("output_ids"))
        if response.parameters["triton_final_response"].bool_param:
            open_ids.discard(rid)
    client.stop_stream()
    client.close()
    return got


def test_streamed_tokens_equal_the_engine(server, engine):
    want = engine_greedy(engine, PROMPTS[0], 5)
    got = _stream(server, {"a": (PROMPTS[0], 5, {"streaming": np.array([[True]])}),
                           "b": (PROMPTS[2], 4, {})})
    assert [piece.shape for piece in got["a"]] == [(1, 1, 1)] * 5
    assert [int(piece[0, 0, 0]) for piece in got["a"]] == want
    assert got["b"][0][0, 0].tolist() == engine_greedy(engine, PROMPTS[2], 4)


def test_too_long_prompt_is_an_error_and_the_server_keeps_serving(server):
    got = _stream(server, {"long": (list(range(70)), 3, {})})
    assert "max_input_len 64" in str(got["long"][0])
    assert _stream(server, {"ok": (PROMPTS[1], 2, {})})["ok"][0].shape == (1, 1, 2)


def test_custom_metrics_are_exported(server):
    _stream(server, {"m": (PROMPTS[1], 3, {})})
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.config.metrics_port}/metrics", timeout=10).read().decode()
    line = next(l for l in text.splitlines() if l.startswith("specdeploy_reference_generated_tokens_total"))
    assert float(line.split()[-1]) >= 3
