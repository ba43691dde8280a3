"""No single request may kill the server: a real tritonserver 2.51 (CPU) with the STAND-IN backend.

tritonserver 2.51 dies with SIGSEGV on an HTTP body of ~4 MB sent the way curl sends it
(``Expect: 100-continue``; triton-inference-server/server#5840) and has no body-size limit to set,
so specdeploy serves gRPC only unless ``serving.http: true``. Here the 5 MB request goes to the
HTTP port of a default server, which must not be listening, and the server keeps serving.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from triton_fixtures import fake_engine, start_standin_server, tiny_plan

from pipeline.client import ClientError, GenerationRequest, TritonClient
from pipeline.triton.repository import emit_repository

pytestmark = [pytest.mark.tritonserver, pytest.mark.slow]
BODY_BYTES = 5 * 1024 * 1024


def post_like_curl(port: int, path: str, size: int) -> bytes:
    """POST ``size`` bytes as ``curl --data-binary @file`` does: headers with Expect: 100-continue, wait for
    the interim response, then the body. Returns what the server answered."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            (
                f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUser-Agent: curl/8.5.0\r\n"
                f"Content-Type: application/json\r\nContent-Length: {size}\r\n"
                "Expect: 100-continue\r\n\r\n"
            ).encode()
        )
        interim = sock.recv(4096)
        if interim.startswith(b"HTTP/1.1 100"):
            chunk = b"x" * (1 << 20)
            for start in range(0, size, len(chunk)):
                sock.sendall(chunk[: size - start])
            return sock.recv(4096)
        return interim


def wait_for_port(port: int, seconds: float = 15.0) -> None:
    """Readiness is checked over gRPC; Triton's HTTP endpoint may start accepting a moment later."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("http")
    variant = tiny_plan(folder)
    repo = folder / "repo"
    emit_repository(variant, repo, engine_dir=fake_engine(variant), tokenizer_dir=variant.model_dir)
    return repo


def start(repo: Path, **options):
    return start_standin_server(repo, repo.parent / f"tritonserver-{len(options)}.log", **options)


def test_a_5_mb_curl_style_post_cannot_reach_a_default_server(repo):
    server = start(repo)
    try:
        assert "--allow-http=false" in server.command(Path("/rt"), Path("/backends"))
        for path in (
            "/v2/models/ensemble/generate",
            "/v2/models/ensemble/generate_stream",
            "/v2/models/ensemble/infer",
        ):
            with pytest.raises(ConnectionRefusedError):
                post_like_curl(server.config.http_port, path, BODY_BYTES)
        assert server.is_alive() and server.is_ready()
        with TritonClient(server.grpc_url) as client:  # gRPC serves, a 5 MB prompt included
            assert client.generate(GenerationRequest("hello world", max_tokens=3)).tokens == 3
            try:
                client.generate(GenerationRequest("hello " * (BODY_BYTES // 6), max_tokens=1), timeout=120)
            except ClientError:
                pass  # refused as too long for the engine: a per-request error, not a dead server
            assert client.generate(GenerationRequest("hello world", max_tokens=2)).tokens == 2
        assert server.is_alive()
    finally:
        server.stop()


def test_http_is_served_when_the_spec_turns_it_on(repo):
    server = start(repo, http=True)
    try:
        wait_for_port(server.config.http_port)
        answer = post_like_curl(server.config.http_port, "/v2/models/ensemble/generate", 64)
        assert answer.startswith(b"HTTP/1.1 ") and server.is_alive()  # small bodies work (and are refused as JSON)
    finally:
        server.stop()
