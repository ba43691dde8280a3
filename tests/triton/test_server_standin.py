"""A real tritonserver (nvidia-pytriton 2.51, CPU) serving an emitted repository, with a STAND-IN backend.

The ``tensorrtllm`` backend here is tests/triton/standin_backend.py (echoes the prompt), so these
tests cover the repository wiring, tokenizer pre/postprocessing, streaming, cancellation and
error paths independently of the reference model; test_server_reference.py runs the real one.
One server for the whole module.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from triton_fixtures import STANDIN_BACKEND, WORDS, fake_engine, free_ports, start_standin_server, tiny_plan

from pipeline.cli import main
from pipeline.client import ClientError, GenerationRequest, TritonClient, build_inputs
from pipeline.methods.lookahead import LookaheadConfig
from pipeline.triton.launch_cpu import check_port_free
from pipeline.triton.repository import emit_repository
from tests.conftest import REPO

pytestmark = [pytest.mark.tritonserver, pytest.mark.slow]
PROMPT = "hello world the quick brown"


@pytest.fixture(scope="module")
def packaged(module_tmp) -> tuple[Path, Path]:
    """(folder with spec.yaml, the emitted repository)."""
    folder = module_tmp("standin")
    variant = tiny_plan(folder)
    repo = folder / "repo"
    emit_repository(variant, repo, engine_dir=fake_engine(variant), tokenizer_dir=variant.model_dir)
    return folder, repo


@pytest.fixture(scope="module")
def server(packaged):
    folder, repo = packaged

    running = start_standin_server(repo, folder / "tritonserver.log")
    try:
        yield running
    finally:
        running.stop()
    # Every abandoned request was ended, not left "in flight" (a shutdown would wait for it).
    assert not re.search(r"has [1-9][0-9]* in-flight inferences", running.log_file.read_text()), running.log_tail()


def expected(prompt: str, count: int) -> str:
    words = prompt.split()
    return "".join(" " + words[i % len(words)] for i in range(count))


def test_streaming_generation_through_the_ensemble(server):
    pieces = []
    with TritonClient(server.grpc_url) as client:
        result = client.generate(
            GenerationRequest(PROMPT, max_tokens=9, return_perf_metrics=True), on_piece=pieces.append
        )
    assert result.text == expected(PROMPT, 9)
    assert [piece.tokens for piece in pieces] == [1, 2, 2, 2, 2]  # context step, then 2 per step
    assert result.tokens == 9 and result.first_token_seconds is not None
    assert result.perf["total_accepted_draft_tokens"] == 4 and result.perf["total_draft_tokens"] == 12
    assert result.perf["acceptance_rate"] == pytest.approx(1 / 3)
    assert result.mean_acceptance_length == pytest.approx(2.0)


def test_end_id_ends_the_stream_even_with_an_empty_last_step(server):
    pieces = []
    quick = WORDS.index("quick") + 3  # the tiny vocabulary: 3 specials, then WORDS
    with TritonClient(server.grpc_url) as client:
        result = client.generate(
            GenerationRequest("hello world the quick", max_tokens=9, end_id=quick), on_piece=pieces.append
        )
    assert result.text == " hello world the" and result.tokens == 3
    assert [piece.tokens for piece in pieces] == [1, 2, 0]


def test_non_streaming_returns_one_piece_equal_to_the_stream(server):
    with TritonClient(server.grpc_url) as client:
        streamed = client.generate(GenerationRequest(PROMPT, max_tokens=7))
        whole = client.generate(GenerationRequest(PROMPT, max_tokens=7, stream=False, return_perf_metrics=True))
        with_prompt = client.generate(
            GenerationRequest(PROMPT, max_tokens=2, stream=False, exclude_input_in_output=False)
        )
    assert len(whole.pieces) == 1 and whole.text == streamed.text and whole.tokens == 7
    assert "acceptance_rate" in whole.perf
    assert with_prompt.text == " " + PROMPT + expected(PROMPT, 2)


def test_eight_concurrent_clients_all_get_complete_answers(server):
    prompts = [" ".join(WORDS[12 + i : 12 + i + 3 + i]) for i in range(8)]

    def ask(prompt: str) -> str:
        with TritonClient(server.grpc_url) as client:
            return client.generate(GenerationRequest(prompt, max_tokens=20), timeout=60).text

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, prompts))
    assert answers == [expected(prompt, 20) for prompt in prompts]


def _abandon(server, how: str) -> None:
    request = GenerationRequest(PROMPT, max_tokens=150)  # 75 steps of 10 ms: still running when abandoned
    if how == "disconnect":  # the channel goes away with the request running; nobody says stop
        client = grpcclient.InferenceServerClient(server.grpc_url)
        first = threading.Event()
        client.start_stream(callback=lambda result, error: first.set())
        client.async_stream_infer("ensemble", build_inputs(request), enable_empty_final_response=True)
        assert first.wait(30)
        client.close()
        return
    with TritonClient(server.grpc_url) as client:
        if how == "ctrl-c":

            def interrupt(piece):
                raise KeyboardInterrupt

            with pytest.raises(KeyboardInterrupt):
                client.generate(request, on_piece=interrupt)
        else:
            with pytest.raises(ClientError, match="no answer"):
                client.generate(request, timeout=0.2)


@pytest.mark.parametrize("how", ["ctrl-c", "timeout", "disconnect"])
def test_abandoned_request_leaves_the_server_healthy(server, how):
    stopped_before = server.log_file.read_text().count("stand-in: request stopped")
    _abandon(server, how)
    with TritonClient(server.grpc_url) as client:
        assert client.server_ready()
        assert client.generate(GenerationRequest(PROMPT, max_tokens=5), timeout=30).text == expected(PROMPT, 5)
    if how != "disconnect":  # the client's stop reached the backend by request id, through the ensemble
        deadline = time.monotonic() + 10
        while server.log_file.read_text().count("stand-in: request stopped") <= stopped_before:
            assert time.monotonic() < deadline, server.log_tail()
            time.sleep(0.2)


def _raw(name: str, value: np.ndarray, dtype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(value.shape), dtype)
    tensor.set_data_from_numpy(value)
    return tensor


def test_bad_requests_get_errors_and_the_next_request_succeeds(server):
    text = _raw("text_input", np.array([[PROMPT.encode()]], dtype=object), "BYTES")
    bad = {
        "missing input": ([_raw("max_tokens", np.array([[4]], dtype=np.int32), "INT32")], "text_input"),
        "wrong dtype": ([text, _raw("max_tokens", np.array([[4.0]], dtype=np.float32), "FP32")], "data-type"),
        "prompt too long": (
            build_inputs(GenerationRequest(" ".join(["w1"] * 40), max_tokens=4)),
            "prompt too long: 40 tokens",
        ),
        "zero max_tokens": (build_inputs(GenerationRequest(PROMPT, max_tokens=0)), "max_tokens must be >= 1"),
        "lookahead too big": (
            build_inputs(GenerationRequest(PROMPT, max_tokens=4, lookahead=LookaheadConfig(9, 2, 2))),
            "lookahead_window_size must be between 1 and the server's 3",
        ),
    }
    with TritonClient(server.grpc_url) as client:
        for case, (inputs, message) in bad.items():
            with pytest.raises(ClientError, match=message):
                client.generate_raw(inputs, timeout=30)
            assert client.generate(GenerationRequest(PROMPT, max_tokens=3), timeout=30).text == expected(PROMPT, 3), (
                case
            )
        ok = client.generate(GenerationRequest(PROMPT, max_tokens=3, lookahead=LookaheadConfig(2, 2, 1)), timeout=30)
        assert ok.text == expected(PROMPT, 3)


def _nvidia_inputs(prompt: str, max_tokens: int, stream: bool) -> list[grpcclient.InferInput]:
    """What NVIDIA's end_to_end_grpc_client.py always sends, with its shapes and types."""
    return [
        _raw("text_input", np.array([[prompt]], dtype=object), "BYTES"),
        _raw("max_tokens", np.array([[max_tokens]], dtype=np.int32), "INT32"),
        _raw("stream", np.array([[stream]], dtype=bool), "BOOL"),
        _raw("beam_width", np.array([[1]], dtype=np.int32), "INT32"),
        _raw("temperature", np.array([[1.0]], dtype=np.float32), "FP32"),
        _raw("num_return_sequences", np.array([[1]], dtype=np.int32), "INT32"),
        _raw("exclude_input_in_output", np.array([[True]], dtype=bool), "BOOL"),
        _raw("return_num_input_tokens", np.array([[False]], dtype=bool), "BOOL"),
        _raw("return_context_logits", np.array([[False]], dtype=bool), "BOOL"),
        _raw("return_generation_logits", np.array([[False]], dtype=bool), "BOOL"),
    ]


def _nvidia_stream(server, model: str, stream: bool) -> tuple[list, list[str]]:
    """(text_output shapes, texts) of one request in NVIDIA's format; errors fail the test."""
    shapes, texts, errors = [], [], []
    client = grpcclient.InferenceServerClient(server.grpc_url)
    done = threading.Event()

    def callback(result, error):
        if error is not None:
            errors.append(error)
            done.set()
            return
        if result.as_numpy("text_output") is not None:
            shapes.append(result.as_numpy("text_output").shape)
            texts.append(result.as_numpy("text_output")[0].decode())
        if result.get_response().parameters["triton_final_response"].bool_param:
            done.set()

    client.start_stream(callback=callback)
    client.async_stream_infer(model, _nvidia_inputs(PROMPT, 5, stream), enable_empty_final_response=True)
    assert done.wait(60)
    client.stop_stream()
    client.close()
    assert not errors, errors
    return shapes, texts


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_nvidia_request_format_gets_one_string_per_response(server, model):
    """The inputs NVIDIA's clients always send are accepted, and text_output is [num_beams] = [1]."""
    for stream in (True, False):
        shapes, texts = _nvidia_stream(server, model, stream)
        assert set(shapes) == {(1,)} and "".join(texts) == expected(PROMPT, 5), (model, stream)
        assert len(texts) == (3 if stream else 1)


def test_bls_model_answers_like_the_ensemble(server):
    with TritonClient(server.grpc_url) as ensemble, TritonClient(server.grpc_url, model="tensorrt_llm_bls") as bls:
        for request in (
            GenerationRequest(PROMPT, max_tokens=6, return_perf_metrics=True),
            GenerationRequest(PROMPT, max_tokens=3, stream=False, stop_words=["fox"]),
        ):
            want, got = ensemble.generate(request, timeout=60), bls.generate(request, timeout=60)
            assert got.text == want.text and got.tokens == want.tokens and got.perf == want.perf
        with pytest.raises(ClientError, match="draft-target speculative decoding needs a draft model"):
            bls.generate_raw(
                build_inputs(GenerationRequest(PROMPT, max_tokens=3))
                + [_raw("num_draft_tokens", np.array([[2]], dtype=np.int32), "INT32")],
                timeout=30,
            )


def test_preprocessing_returns_nvidias_outputs(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inputs = [
        _raw("QUERY", np.array([[PROMPT]], dtype=object), "BYTES"),
        _raw("REQUEST_OUTPUT_LEN", np.array([[4]], dtype=np.int32), "INT32"),
    ]
    plain = client.infer("preprocessing", inputs)
    assert plain.as_numpy("DECODER_INPUT_ID").tolist() == [[1]]  # the tiny tokenizer's pad id
    assert plain.as_numpy("REQUEST_DECODER_INPUT_LEN").tolist() == [[1]]
    assert plain.as_numpy("EMBEDDING_BIAS").shape == (1, 0)
    assert plain.as_numpy("OUT_PROMPT_TABLE_EXTRA_IDS") is None
    biased = client.infer(
        "preprocessing",
        inputs
        + [
            _raw("EMBEDDING_BIAS_WORDS", np.array([["fox", "dog"]], dtype=object), "BYTES"),
            _raw("EMBEDDING_BIAS_WEIGHTS", np.array([[2.5, -1.0]], dtype=np.float32), "FP32"),
            _raw("PROMPT_TABLE_EXTRA_ID", np.array([[7]], dtype=np.uint64), "UINT64"),
        ],
    )
    bias = biased.as_numpy("EMBEDDING_BIAS")
    assert bias.shape == (1, 3 + len(WORDS))
    assert bias[0, 3 + WORDS.index("fox")] == 2.5 and bias[0, 3 + WORDS.index("dog")] == -1.0
    assert np.count_nonzero(bias) == 2
    assert biased.as_numpy("OUT_PROMPT_TABLE_EXTRA_IDS").shape == plain.as_numpy("INPUT_ID").shape
    client.close()


def test_query_command_streams_text_and_acceptance(server, capsys):
    rc = main(["query", PROMPT, "--url", server.grpc_url, "--max-tokens", "5", "--perf"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.startswith(expected(PROMPT, 5))
    assert "acceptance rate 0.33" in out and "mean acceptance length 2.00" in out
    rc = main(["query", PROMPT, "--url", server.grpc_url, "--max-tokens", "3", "--no-stream"])
    assert rc == 0 and capsys.readouterr().out.startswith(expected(PROMPT, 3))
    rc = main(["query", PROMPT, "--url", server.grpc_url, "--max-tokens", "5", "--perf", "--json"])  # a smoke check
    answer = json.loads(capsys.readouterr().out)
    assert rc == 0 and answer["text"] == expected(PROMPT, 5) and answer["tokens"] == 5
    assert answer["mean_acceptance_length"] == pytest.approx(2.0) and answer["perf"]["total_draft_tokens"] > 0
    assert {"model", "prompt", "seconds", "first_token_seconds"} <= set(answer)


def test_query_takes_the_chat_template_from_the_server_in_any_directory(server, capsys, tmp_path, monkeypatch):
    """No spec, no repository in the working directory (and a decoy one that would change the
    answer): the template comes from the served preprocessing config."""
    decoy = tmp_path / "triton_repo" / "smollm2-lookahead"
    decoy.mkdir(parents=True)
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "smollm2-lookahead.yaml").write_text("name: decoy\nmodel: {path: nowhere}\n")
    monkeypatch.chdir(tmp_path)
    rc = main(["query", "fox jumps", "--url", server.grpc_url, "--max-tokens", "3", "--chat", "--system", "dog"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.startswith(" dog fox jumps")  # the tiny template: each message's content, then a space
    rc = main(
        [
            "query",
            "fox jumps",
            "--url",
            server.grpc_url,
            "--max-tokens",
            "2",
            "--model",
            "tensorrt_llm_bls",
            "--chat",
            "--system",
            "dog",
        ]
    )
    assert rc == 0 and capsys.readouterr().out.startswith(" dog fox")


def test_query_chat_template_uses_the_repository_tokenizer(server, capsys):
    repo = Path(server.config.repositories[0])
    rc = main(["query", "fox jumps", "--url", server.grpc_url, "--max-tokens", "2", "--chat", "--repo", str(repo)])
    assert rc == 0 and capsys.readouterr().out.startswith(" fox jumps")


def test_query_against_a_dead_port_is_one_line(capsys):
    (port,) = free_ports(1)
    rc = main(["query", "hi", "--url", f"127.0.0.1:{port}", "--timeout", "5"])
    err = capsys.readouterr().err
    assert rc == 1 and err.startswith("error: ") and len(err.strip().splitlines()) == 1


def test_bench_command_writes_json_and_plot(server, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello world\nthe quick brown fox\n\nlazy dog jumps\n")
    out = tmp_path / "bench"
    rc = main(
        [
            "bench",
            "--prompts",
            str(prompts),
            "--concurrency",
            "4",
            "--requests",
            "8",
            "--max-tokens",
            "9",
            "--url",
            server.grpc_url,
            "--out",
            str(out),
            "--json",
        ]
    )
    captured = capsys.readouterr()
    text = captured.err  # --json: the table goes to stderr, stdout is bench.json's document
    assert rc == 0, text
    report = json.loads((out / "bench.json").read_text())
    assert json.loads(captured.out) == report
    assert report["completed"] == 8 and report["failed"] == 0 and report["concurrency"] == 4
    assert report["output_tokens"] == 8 * 9 and report["tokens_per_second"] > 0
    assert set(report["ttft_ms"]) == {"p50", "p90", "p99", "mean"} and report["itl_ms"]["p50"] > 0
    assert report["acceptance"]["mean_acceptance_length"] == pytest.approx(2.0)
    assert (out / "bench.png").stat().st_size > 1000
    assert "tokens/s" in text


def test_serve_command_runs_in_the_foreground_and_stops_on_sigterm(packaged, tmp_path):
    folder, repo = packaged
    http, grpc, metrics = free_ports(3)
    argv = [
        sys.executable,
        "-m",
        "pipeline",
        "--cache-dir",
        str(REPO / ".cache"),
        "serve",
        str(folder / "spec.yaml"),
        "--repo",
        str(repo),
        "--backend-model",
        str(STANDIN_BACKEND),
        "--grpc-port",
        str(grpc),
        "--http-port",
        str(http),
        "--metrics-port",
        str(metrics),
        "--log-file",
        str(tmp_path / "serve.log"),
    ]
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ, COLUMNS="200")
    )
    try:
        lines = []
        for line in process.stdout:  # the command prints "ready" once every model is READY
            lines.append(line)
            if line.startswith("ready") or len(lines) > 20:
                break
        assert any(line.startswith("ready") for line in lines), "".join(lines)
        with TritonClient(f"127.0.0.1:{grpc}") as client:
            assert client.generate(GenerationRequest(PROMPT, max_tokens=3)).text == expected(PROMPT, 3)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        assert "stopping tritonserver" in process.stdout.read()
        for port in (grpc, http, metrics):  # the server is gone: a new one could bind its ports
            check_port_free("127.0.0.1", port)
    finally:
        if process.poll() is None:
            process.kill()
