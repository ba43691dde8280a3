"""End to end on CPU: a tiny random Llama through the pipeline's stages (convert, build, package), served
by a real tritonserver with the REAL reference backend (pipeline/runtime/triton/backend.py), after both
output roots moved to another folder (the repository `specdeploy serve --engines-dir` serves).

Greedy decoding is deterministic, so streaming, non-streaming and eight concurrent requests
(batched in flight by the backend) must all give each prompt the same text.
"""

from __future__ import annotations

import json
import re
import shutil
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from triton_fixtures import build_with_stages, plan_spec, serve_repository, tiny_llama, wait_until_idle

from pipeline.client import ClientError, GenerationRequest, TritonClient
from pipeline.triton.launch_cpu import reference_backend_available
from pipeline.triton.relocate import served_repository

pytestmark = [
    pytest.mark.tritonserver,
    pytest.mark.slow,
    pytest.mark.skipif(
        not reference_backend_available(),
        reason="pipeline/runtime/triton/backend.py (the reference backend) is not in this checkout",
    ),
]
REPO_ROOT = Path(__file__).resolve().parents[2]
SPEC = """
name: tiny-ref
model: {path: model, dtype: float32}
speculative:
  method: lookahead
  lookahead: {window: 3, ngram: 2, verification_set: 2}
build: {max_batch_size: 8, max_input_len: 32, max_seq_len: 96, max_num_tokens: 256}
target: reference
"""
PROMPTS = [
    "hello world",
    "the quick brown fox",
    "lazy dog jumps over",
    "w1 w2 w3",
    "a fox",
    "w10 w20",
    "stop the dog",
    "over the w5",
]


@pytest.fixture(scope="module")
def server(module_tmp):
    folder = module_tmp("reference")
    tiny_llama(folder / "model")
    (folder / "spec.yaml").write_text(textwrap.dedent(SPEC).lstrip())
    variant = plan_spec(folder / "spec.yaml", folder).variants[0]
    built = build_with_stages(variant)
    # Built here, served from elsewhere: both output roots move, as to another machine's volume,
    # and the server gets the repository `specdeploy serve --engines-dir` gives it.
    moved = folder / "elsewhere"
    moved.mkdir()
    for root in ("engines", "triton_repo"):
        shutil.move(folder / root, moved / root)
    assert not built.exists()
    repo = served_repository(moved / "triton_repo" / built.name, moved / "engines", folder / "serving")
    running = serve_repository(repo, folder / "tritonserver.log")
    try:
        yield running
        idle = wait_until_idle(running)  # the cancelled request leaves at its next step (later when loaded)
    finally:
        running.stop()
    # Every abandoned request was ended, not left "in flight" (a shutdown would wait for it).
    assert not any(idle.values()), f"still in flight: {idle}"
    assert not re.search(r"has [1-9][0-9]* in-flight inferences", running.log_file.read_text()), running.log_tail()


def _ask(server, prompt: str, **options) -> str:
    with TritonClient(server.grpc_url, timeout=120) as client:
        return client.generate(GenerationRequest(prompt, **options)).text


def test_streaming_and_non_streaming_agree_and_report_perf(server):
    pieces = []
    with TritonClient(server.grpc_url, timeout=120) as client:
        streamed = client.generate(
            GenerationRequest(PROMPTS[0], max_tokens=12, return_perf_metrics=True), on_piece=pieces.append
        )
        whole = client.generate(GenerationRequest(PROMPTS[0], max_tokens=12, stream=False))
    assert streamed.text == whole.text and streamed.text.strip()
    assert len(pieces) > 1 and streamed.tokens == whole.tokens <= 12
    assert {"acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens"} <= set(streamed.perf)


def test_eight_concurrent_requests_match_their_solo_answers(server):
    solo = [_ask(server, prompt, max_tokens=10) for prompt in PROMPTS]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda prompt: _ask(server, prompt, max_tokens=10), PROMPTS))
    assert together == solo


def test_cancelled_request_stops_and_the_server_stays_healthy(server):
    with TritonClient(server.grpc_url, timeout=120) as client:

        def interrupt(piece):
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            client.generate(GenerationRequest(PROMPTS[1], max_tokens=60), on_piece=interrupt)
        assert client.server_ready()
        with pytest.raises(ClientError, match="prompt too long"):
            client.generate(GenerationRequest(" ".join(["w3"] * 40), max_tokens=4))
    assert _ask(server, PROMPTS[2], max_tokens=4).strip()


def test_repository_manifest_names_the_engine(server):
    repo = Path(server.config.repositories[0])
    manifest = json.loads((repo / "specdeploy-repository.json").read_text())
    # Where the deployment mounts it (deploy.mount_path), not where it was built.
    assert manifest["engine_dir"] == "/models/engines/tiny-ref/engine"
    assert manifest["engines_root"] == "/models/engines"


def test_the_moved_repository_serves_from_its_new_place(server):
    served = Path(server.config.repositories[0])
    moved = served.parent.parent / "elsewhere"
    config = (served / "tensorrt_llm" / "config.pbtxt").read_text()
    assert str(moved / "engines" / "tiny-ref" / "engine") in config
    assert str(moved.parent / "engines") not in config and str(moved.parent / "triton_repo") not in config
    assert _ask(server, PROMPTS[3], max_tokens=4).strip()


def test_grpc_health_answers_serving_with_http_off(server):
    """What the Kubernetes probes ask (grpc.health.v1.Health/Check, service ""): tritonserver answers on
    its gRPC port, with HTTP off."""
    import grpc

    assert not server.config.http
    with grpc.insecure_channel(server.grpc_url) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=None, response_deserializer=None)
        reply = check(b"", timeout=30)  # an empty HealthCheckRequest: the server as a whole
    assert reply == b"\x08\x01"  # HealthCheckResponse{status: SERVING (1)}
