"""No single request may kill the server: a real tritonserver 2.51 (CPU) with the STAND-IN backend.

tritonserver 2.51 is reported to die with SIGSEGV on an HTTP body of ~4 MB
(triton-inference-server/server#5840) and has no body-size limit to set, so specdeploy serves gRPC
only unless ``serving.http: true``, and then puts a Caddy front on the HTTP port that answers 413 to
a body over ``serving.http_max_request_bytes`` before any of it reaches Triton. Here 5 MB requests
go to the HTTP port of a default server, which must not be listening, and to one with HTTP on.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from triton_fixtures import fake_engine, start_standin_server, tiny_plan

from pipeline.client import ClientError, GenerationRequest, TritonClient
from pipeline.triton.repository import emit_repository

pytestmark = [pytest.mark.tritonserver, pytest.mark.slow]
BODY_BYTES = 5 * 1024 * 1024


def post_like_curl(port: int, path: str, size: int, *, expect: bool = True, body: bytes | None = None) -> bytes:
    """POST ``size`` bytes (``body``, else ``x`` repeated) as ``curl --data-binary @file`` does: headers with
    Expect: 100-continue, wait for the interim response, then the body (``expect=False``: at once). Returns
    the final response (what the server answered, or its refusal on the way)."""
    data = body if body is not None else b"x" * size
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            (
                f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUser-Agent: curl/8.5.0\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                + ("Expect: 100-continue\r\n" if expect else "")
                + "\r\n"
            ).encode()
        )
        if expect:
            interim = sock.recv(4096)
            if not interim.startswith(b"HTTP/1.1 100"):
                return interim
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):  # refused part-way: the answer is already there
            pass
        return read_response(sock)


def read_response(sock: socket.socket) -> bytes:
    """One final HTTP/1.1 response: its head, and its body when it comes with Content-Length or chunked;
    interim (1xx) responses before it are skipped, as clients do (a proxy may pass on Triton's own 100)."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            return data
        data += chunk
        head, blank, body = data.partition(b"\r\n\r\n")
        if blank and head.startswith(b"HTTP/1.1 1"):
            data = body
            continue
        if not chunk or (blank and _complete(head.lower(), body)):
            return data


def _complete(head: bytes, body: bytes) -> bool:
    if b"transfer-encoding: chunked" in head:
        return body.endswith(b"0\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return True


@pytest.fixture(scope="module")
def repo(module_tmp) -> Path:
    folder = module_tmp("http")
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


def test_http_bodies_over_the_limit_are_answered_413_and_never_reach_triton(repo):
    server = start(repo, http=True, http_max_request_bytes=64 * 1024)
    try:
        assert server.front is not None and server.front.is_alive()
        assert f"--http-port={server.config.http_port}" not in server.command(Path("/rt"), Path("/backends"))
        request = json.dumps({"text_input": "hello world", "max_tokens": 3}).encode()
        answer = post_like_curl(server.config.http_port, "/v2/models/ensemble/generate", 0, expect=False, body=request)
        assert answer.startswith(b"HTTP/1.1 200") and b"text_output" in answer
        answer = post_like_curl(server.config.http_port, "/v2/models/ensemble/generate", 0, body=request)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:100]  # Expect: 100-continue under the limit
        for path in ("/v2/models/ensemble/generate", "/v2/models/ensemble/generate_stream"):
            for expect in (True, False):
                answer = post_like_curl(server.config.http_port, path, BODY_BYTES, expect=expect)
                assert answer.startswith(b"HTTP/1.1 413"), (path, expect, answer[:100])
        just_over = post_like_curl(server.config.http_port, "/v2/models/ensemble/generate", 64 * 1024 + 1)
        assert just_over.startswith(b"HTTP/1.1 413")
        assert server.is_alive() and server.is_ready()
        stream = json.dumps({"text_input": "hello world", "max_tokens": 3, "stream": True}).encode()
        answer = post_like_curl(
            server.config.http_port, "/v2/models/ensemble/generate_stream", 0, expect=False, body=stream
        )
        assert answer.startswith(b"HTTP/1.1 200") and b"text/event-stream" in answer
    finally:
        server.stop()
    assert server.front is None and not server.is_alive()


def test_the_front_refuses_a_long_length_before_inviting_its_body_and_cuts_off_slow_headers(repo):
    """`Expect: 100-continue` with a 3 GB Content-Length is answered 413 at once, never "100 Continue";
    a client sending its headers a byte a second is cut off by the header timeout (2 s here, 10 s served)."""
    server = start(repo, http=True, http_max_request_bytes=64 * 1024, http_read_header_timeout_s=2.0)
    port = server.config.http_port
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(
                b"POST /v2/models/ensemble/generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 3000000000\r\nExpect: 100-continue\r\n\r\n"
            )
            answer = sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:100]
        head = b"POST /v2/models/ensemble/generate HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"y" * 200
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.settimeout(1.0)
            sent, ended = 0, False
            while sent < len(head) and not ended:  # the front's own timeout ends it, not this loop's length
                try:
                    sock.sendall(head[sent : sent + 1])
                    sent += 1
                    sock.recv(4096)  # an answer (408) or the close: the front gave up on us
                    ended = True
                except TimeoutError:
                    continue
                except OSError:
                    ended = True
        assert ended and sent < len(head), f"the front still read slow headers after {sent} bytes"
        assert server.is_alive() and server.is_ready()
    finally:
        server.stop()
