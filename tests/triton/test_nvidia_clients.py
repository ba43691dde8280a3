"""NVIDIA's own client programs, unchanged, against a real tritonserver serving a SmolLM2 repository.

tests/data/nvidia_clients/ holds ``end_to_end_grpc_client.py`` (text in, text out, through the
ensemble or ``tensorrt_llm_bls``) and ``inflight_batcher_llm_client.py`` (token ids straight to
``tensorrt_llm``) as NVIDIA ships them (see the README there). The repository is built by the
pipeline's stages from the embedded SmolLM2 with Lookahead decoding on the reference backend,
served decoupled (streaming) and, from the same engine, non-decoupled (the inflight client's
plain, unary mode needs that: Triton refuses ModelInfer on a decoupled model).

Correct answers are the ones specdeploy's own client gets for the same request (greedy
decoding is deterministic): the NVIDIA clients must print exactly that text or those ids.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from triton_fixtures import NVIDIA_CLIENTS, run_client, serve_repository

from pipeline.client import GenerationRequest, TritonClient, build_inputs
from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots
from pipeline.spec.document import load_spec
from pipeline.stages.execute import execute_plan
from pipeline.triton.launch_cpu import reference_backend_available
from pipeline.triton.repository import emit_repository
from tests.conftest import embedded_cache_dir

pytestmark = [
    pytest.mark.tritonserver,
    pytest.mark.slow,
    pytest.mark.skipif(not reference_backend_available(), reason="the reference backend is not in this checkout"),
]
REPO_ROOT = Path(__file__).resolve().parents[2]
END_TO_END = NVIDIA_CLIENTS / "end_to_end_grpc_client.py"
INFLIGHT = NVIDIA_CLIENTS / "inflight_batcher_llm_client.py"
PROMPT = "The capital of France is"
OTHER_PROMPT = "Water boils at"
TOKENS = 8
SPEC = """
name: nvidia-clients
model: {builtin: smollm2-135m-instruct, dtype: float32}
speculative:
  method: lookahead
  lookahead: {window: 4, ngram: 3, verification_set: 4}
build: {max_batch_size: 4, max_input_len: 128, max_seq_len: 256, max_num_tokens: 512}
serving: {decoupled: DECOUPLED}
target: reference
"""


def _plan(folder: Path, decoupled: bool):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spec.yaml").write_text(textwrap.dedent(SPEC).replace("DECOUPLED", str(decoupled).lower()))
    return make_plan(
        load_spec(folder / "spec.yaml"), OutputRoots(folder / "engines", folder / "triton_repo", embedded_cache_dir())
    )


@pytest.fixture(scope="module")
def repositories(module_tmp) -> dict[bool, Path]:
    """decoupled -> repository; both from one engine, built by the pipeline's stages."""
    root = module_tmp("nvidia-clients")
    plan = _plan(root / "decoupled", True)
    (outcome,) = execute_plan(plan, say=lambda _: None)
    assert outcome.exit_code == 0 and outcome.stopped_at is None, outcome
    variant = plan.variants[0]
    offline = _plan(root / "offline", False).variants[0]
    package = variant.stage("package")
    emit_repository(
        offline, root / "offline-repo", engine_dir=package.inputs["engine"], tokenizer_dir=package.inputs["tokenizer"]
    )
    return {True: package.output, False: root / "offline-repo"}


def _server(repo: Path, log: Path):
    return serve_repository(repo, log, models=("ensemble", "tensorrt_llm_bls", "tensorrt_llm"), ready_timeout=300)


@pytest.fixture(scope="module")
def server(repositories, module_tmp):
    running = _server(repositories[True], module_tmp("logs") / "decoupled.log")
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def offline_server(repositories, module_tmp, server):
    server.stop()  # one server at a time on a small host; the decoupled tests have run by now
    running = _server(repositories[False], module_tmp("logs") / "offline.log")
    try:
        yield running
    finally:
        running.stop()


def _raw(name: str, value: np.ndarray, dtype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(value.shape), dtype)
    tensor.set_data_from_numpy(value)
    return tensor


def answer(server, prompt: str = PROMPT, **options) -> str:
    with TritonClient(server.grpc_url) as client:
        return client.generate(GenerationRequest(prompt, max_tokens=TOKENS, **options), timeout=300).text


def _end_to_end(server, tmp_path, *flags: str, prompt: str = PROMPT) -> str:
    done = run_client(END_TO_END, server.grpc_url, "-p", prompt, "-o", str(TOKENS), *flags, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Received an error from server" not in done.stdout, done.stdout
    return done.stdout


# -- end_to_end_grpc_client.py: ensemble and tensorrt_llm_bls ----------------------------------------------


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_end_to_end_plain_and_streaming(server, tmp_path, model):
    # Without --exclude-input-in-output the client sends exclude_input_in_output=false: prompt + answer.
    whole = answer(server, stream=False, exclude_input_in_output=False)
    assert whole.startswith(PROMPT) and len(whole) > len(PROMPT)
    out = _end_to_end(server, tmp_path, "--model-name", model)
    assert f"0: {whole}\n" in out
    streamed = answer(server)  # streaming never repeats the prompt
    out = _end_to_end(server, tmp_path, "--model-name", model, "--streaming")
    assert f"\n{streamed}\n" in out


def test_end_to_end_exclude_input_and_stop_words(server, tmp_path):
    completion = answer(server, stream=False)
    assert f"0: {completion}\n" in _end_to_end(server, tmp_path, "--exclude-input-in-output")
    # A word the model does generate, with its leading space: stop words are matched as tokens, and
    # the tokenizer encodes " answer" and "answer" differently (NVIDIA's preprocessing does the same).
    word = " " + completion.split()[2]
    stopped = answer(server, stream=False, stop_words=(word,))
    assert len(stopped) < len(completion) and stopped.rstrip().endswith(word)
    assert f"0: {stopped}\n" in _end_to_end(server, tmp_path, "--exclude-input-in-output", "--stop-words", word)


def test_end_to_end_beam_width_2_is_refused_on_a_speculative_engine(server, tmp_path):
    done = run_client(END_TO_END, server.grpc_url, "-p", PROMPT, "-o", str(TOKENS), "--beam-width", "2", cwd=tmp_path)
    assert done.returncode == 0  # the client prints server errors and carries on
    assert re.search(r"Received an error from server:\n.*beam", done.stdout), done.stdout


def test_end_to_end_return_perf_metrics(server, tmp_path):
    out = _end_to_end(server, tmp_path, "--return-perf-metrics", "--streaming")
    assert re.search(r"kv_cache_alloc_total_blocks: [1-9]", out) and "acceptance_rate: " in out


def test_end_to_end_num_return_sequences_2(server, tmp_path):
    whole = answer(server, stream=False, exclude_input_in_output=False)
    out = _end_to_end(server, tmp_path, "--num-return-sequences", "2")
    assert f"0 [0]: {whole}\n" in out and f"0 [1]: {whole}\n" in out  # greedy: both the same


def test_end_to_end_batch_inputs(server, tmp_path):
    first, second = (answer(server, p, stream=False, exclude_input_in_output=False) for p in (PROMPT, OTHER_PROMPT))
    out = _end_to_end(server, tmp_path, "--batch-inputs", prompt=json.dumps([PROMPT, OTHER_PROMPT]))
    assert f"0: {first}\n" in out and f"1: {second}\n" in out


def test_end_to_end_return_log_probs_and_generation_logits(server, tmp_path):
    out = _end_to_end(server, tmp_path, "--return-log-probs", "--return-generation-logits")
    assert f"output_log_probs.shape: (1, 1, {TOKENS})" in out
    assert re.search(rf"generation_logits.shape: \(1, 1, {TOKENS}, 49[0-9]{{3}}\)", out), out  # SmolLM2's vocabulary
    # Context logits need an engine built with gather_context_logits, which speculative engines cannot be.
    done = run_client(
        END_TO_END, server.grpc_url, "-p", PROMPT, "-o", str(TOKENS), "--return-context-logits", cwd=tmp_path
    )
    assert "Received an error from server" in done.stdout and "gather_context_logits" in done.stdout


def test_end_to_end_penalties_and_bad_words_change_the_answer_like_our_client(server, tmp_path):
    completion = answer(server, stream=False)
    banned = " " + completion.split()[0]  # the first word the model would say
    flags = (
        "--exclude-input-in-output",
        "--repetition-penalty",
        "1.5",
        "--presence-penalty",
        "0.5",
        "--frequency-penalty",
        "0.3",
        "--bad-words",
        banned,
    )
    out = _end_to_end(server, tmp_path, *flags)
    with TritonClient(server.grpc_url) as client:
        extra = [
            _raw("repetition_penalty", np.array([[1.5]], np.float32), "FP32"),
            _raw("presence_penalty", np.array([[0.5]], np.float32), "FP32"),
            _raw("frequency_penalty", np.array([[0.3]], np.float32), "FP32"),
        ]
        request = GenerationRequest(PROMPT, max_tokens=TOKENS, stream=False, bad_words=(banned,))
        want = client.generate_raw(build_inputs(request) + extra, timeout=300).text
    assert want != completion and not want.startswith(banned)
    assert f"0: {want}\n" in out


# -- inflight_batcher_llm_client.py: token ids straight to tensorrt_llm ----------------------------------


def _ids(out: str) -> list[int]:
    match = re.search(r"Output sequence:  \[([0-9, ]*)\]", out)
    assert match, out
    return [int(i) for i in match.group(1).split(",") if i.strip()]


def _inflight(server, repo: Path, tmp_path, *flags: str) -> subprocess.CompletedProcess:
    return run_client(
        INFLIGHT,
        server.grpc_url,
        "--tokenizer-dir",
        str(repo / "preprocessing" / "tokenizer"),
        "--text",
        PROMPT,
        "--request-output-len",
        str(TOKENS),
        *flags,
        cwd=tmp_path,
    )


def _decode(repo: Path, ids: list[int]) -> str:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(repo / "preprocessing" / "tokenizer"))
    return tokenizer.decode(ids, skip_special_tokens=True)


def _prompt_ids(repo: Path) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(repo / "preprocessing" / "tokenizer")).encode(PROMPT)


def test_inflight_streaming_and_lookahead_config(server, repositories, tmp_path):
    repo = repositories[True]
    plain = _inflight(server, repo, tmp_path, "--streaming")
    assert plain.returncode == 0, plain.stdout
    ids = _ids(plain.stdout)
    prompt_ids = _prompt_ids(repo)
    assert ids[: len(prompt_ids)] == prompt_ids  # in streaming the client prepends the prompt itself
    assert _decode(repo, ids[len(prompt_ids) :]).strip() == answer(server).strip()
    # The request's own (W, N, G), within the server's (4, 3, 4): same greedy answer.
    look = _inflight(server, repo, tmp_path, "--streaming", "--lookahead_config", "[3,2,3]")
    assert look.returncode == 0, look.stdout
    assert _ids(look.stdout) == ids
    too_big = _inflight(server, repo, tmp_path, "--streaming", "--lookahead_config", "[9,3,4]")
    assert too_big.returncode != 0 and "lookahead" in too_big.stdout


def test_inflight_stop_after_ms_with_request_id_stops_early(server, repositories, tmp_path):
    done = run_client(
        INFLIGHT,
        server.grpc_url,
        "--tokenizer-dir",
        str(repositories[True] / "preprocessing" / "tokenizer"),
        "--text",
        PROMPT,
        "--request-output-len",
        "200",
        "--streaming",
        "--stop-after-ms",
        "300",
        "--request-id",
        "nvidia-stop-1",
        cwd=tmp_path,
    )
    # The client itself asserts it got fewer than --request-output-len tokens.
    assert done.returncode == 0, done.stdout + done.stderr


def test_inflight_return_perf_metrics(server, repositories, tmp_path):
    done = _inflight(server, repositories[True], tmp_path, "--streaming", "--return-perf-metrics")
    assert done.returncode == 0 and re.search(r"kv_cache_alloc_total_blocks: [1-9]", done.stdout), done.stdout


def test_a_stream_cancelled_by_the_client_does_not_hold_the_shutdown(server, caplog):
    """What NVIDIA's clients do on Ctrl-C or --stop-via-request-cancel: cancel the gRPC stream with
    the request running. Triton's own ensemble would count the request in flight for good (and the
    launcher would end the server when only such ensembles are left); the default Python ensemble
    ends it, so Triton drains and exits by itself, code 0."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    responses: list = []
    three = threading.Event()

    def callback(result, error):
        responses.append(error or result)
        if len(responses) >= 3:
            three.set()

    client.start_stream(callback=callback)
    client.async_stream_infer(
        "ensemble", build_inputs(GenerationRequest(PROMPT, max_tokens=200)), request_id="cancelled-1"
    )
    assert three.wait(120)
    client.stop_stream(cancel_requests=True)
    client.close()
    with caplog.at_level(logging.WARNING, logger="pipeline.triton.launch_cpu"):
        code = server.stop()
    assert "only cancelled ensemble requests are left in flight" not in caplog.text, server.log_tail()
    assert code == 0, server.log_tail()


def test_inflight_plain_on_the_non_decoupled_repository(offline_server, repositories, tmp_path):
    repo = repositories[False]
    done = _inflight(offline_server, repo, tmp_path, "--exclude-input-in-output")
    assert done.returncode == 0, done.stdout
    ids = _ids(done.stdout)
    assert len(ids) == TOKENS
    with TritonClient(offline_server.grpc_url) as client:
        text = client.generate(GenerationRequest(PROMPT, max_tokens=TOKENS, stream=False), timeout=300).text
    assert _decode(repo, ids).strip() == text.strip()
    e2e = run_client(
        END_TO_END, offline_server.grpc_url, "-p", PROMPT, "-o", str(TOKENS), "--exclude-input-in-output", cwd=tmp_path
    )
    assert f"0: {text}\n" in e2e.stdout, e2e.stdout


def test_inflight_stop_after_ms_on_the_non_decoupled_repository(offline_server, repositories, tmp_path):
    """Unary mode: the stop request is a second ModelInfer call; it must end the running one early
    (the client itself asserts fewer than --request-output-len tokens)."""
    done = run_client(
        INFLIGHT,
        offline_server.grpc_url,
        "--tokenizer-dir",
        str(repositories[False] / "preprocessing" / "tokenizer"),
        "--text",
        PROMPT,
        "--request-output-len",
        "200",
        "--stop-after-ms",
        "300",
        "--request-id",
        "offline-stop-1",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr


# -- Medusa and EAGLE repositories: the main flags once more ------------------------------------------

HEADS_SPEC = {
    "medusa": "heads: {{medusa: {{path: {heads}/smollm2-medusa, num_heads: 3}}}}\n"
    "speculative: {{method: medusa, medusa: {{choices: smollm2_medusa_10}}}}\n",
    "eagle": "heads: {{eagle: {{path: {heads}/smollm2-eagle}}}}\n"
    "speculative: {{method: eagle, eagle: {{choices: cpu_small_10_depth_3}}}}\n",
}


@pytest.fixture(scope="module", params=list(HEADS_SPEC))
def heads_server(request, module_tmp, offline_server):
    offline_server.stop()  # one server at a time
    method = request.param
    folder = module_tmp(method)
    spec = (
        f"name: nvidia-{method}\nmodel: {{builtin: smollm2-135m-instruct, dtype: float32}}\n"
        + HEADS_SPEC[method].format(heads=REPO_ROOT / "heads")
        + "build: {max_batch_size: 4, max_input_len: 128, max_seq_len: 256, max_num_tokens: 512}\n"
        "target: reference\n"
    )
    (folder / "spec.yaml").write_text(spec)
    plan = make_plan(
        load_spec(folder / "spec.yaml"), OutputRoots(folder / "engines", folder / "triton_repo", embedded_cache_dir())
    )
    (outcome,) = execute_plan(plan, say=lambda _: None)
    assert outcome.exit_code == 0 and outcome.stopped_at is None, outcome
    repo = plan.variants[0].stage("package").output
    running = _server(repo, folder / "tritonserver.log")
    try:
        yield method, repo, running
    finally:
        running.stop()


def test_speculative_repositories_answer_nvidias_clients(heads_server, tmp_path):
    method, repo, server = heads_server
    whole = answer(server, stream=False, exclude_input_in_output=False)
    assert f"0: {whole}\n" in _end_to_end(server, tmp_path)
    streamed = answer(server)
    out = _end_to_end(server, tmp_path, "--streaming", "--return-perf-metrics")
    assert f"\n{streamed}\n" in out and re.search(r"total_draft_tokens: [1-9]", out), out
    out = _end_to_end(
        server,
        tmp_path,
        "--model-name",
        "tensorrt_llm_bls",
        "--batch-inputs",
        prompt=json.dumps([PROMPT, OTHER_PROMPT]),
    )
    assert f"0: {whole}\n" in out and "1: " in out
    streaming = _inflight(server, repo, tmp_path, "--streaming")
    assert streaming.returncode == 0, streaming.stdout
    assert _decode(repo, _ids(streaming.stdout)[len(_prompt_ids(repo)) :]).strip() == streamed.strip()
    # Per-request Lookahead settings on a Medusa / EAGLE model: TensorRT-LLM's refusal.
    refused = _inflight(server, repo, tmp_path, "--streaming", "--lookahead_config", "[3,2,3]")
    assert refused.returncode != 0 and "lookahead" in refused.stdout, (method, refused.stdout)


def test_data_files_are_unchanged_copies():
    """The README names the source; the license header is kept (BSD-3-Clause)."""
    readme = (NVIDIA_CLIENTS / "README.md").read_text()
    for script in (END_TO_END, INFLIGHT):
        text = script.read_text()
        assert "Redistribution and use in source and binary forms" in text
        assert script.name in readme
        size = re.search(rf"`{script.name}` \| [0-9a-f]{{40}} \| ([0-9]+)", readme)
        assert size and len(text) == int(size.group(1)), f"{script.name} differs from the copy the README names"
