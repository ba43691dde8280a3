"""Triton gRPC streaming client for the ensemble: text in, text pieces out, with timings.

Always the streaming RPC, also for non-streaming requests: Triton rejects unary ModelInfer on a
decoupled model (``UNIMPLEMENTED``), and the stream works for both kinds. Each request asks for
an empty final response so the end of a request is known even when the last real response
carried text (as NVIDIA's end_to_end_grpc_client.py does, TensorRT-LLM
triton_backend/inflight_batcher_llm/client/).

Abandoning a request (Ctrl-C, a timeout): specdeploy's own ensemble (``serving.ensemble: python``)
stops the generation when the stream is cancelled, but Triton's ensemble (``serving.ensemble:
triton``, NVIDIA's repositories) does not forward the cancellation to its composing models, so
the backend keeps generating to max_tokens, and the cancelled ensemble request then stays "in
flight" for good (a later shutdown waits out its whole exit timeout; Triton 2.51, both checked
here). Either passes the request id down, so the client first sends the TensorRT-LLM backend's own
cancel message, a request to ``tensorrt_llm`` with ``stop=true`` and the same id, and reads the
request's final response; cancelling the stream is the fallback when that fails.
"""

from __future__ import annotations

import queue
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from pipeline.errors import SpecdeployError
from pipeline.methods.lookahead import LOOKAHEAD_TRITON_KEYS, LookaheadConfig

PERF_OUTPUTS = ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens")
BACKEND_MODEL = "tensorrt_llm"  # the composing model that generates, unless the served configs name another
STOP_WAIT_SECONDS = 5.0


class ClientError(SpecdeployError):
    """The server refused or failed a request, or did not answer in time. Exit code 1."""

    exit_code = 1


@dataclass(frozen=True)
class GenerationRequest:
    prompt: str
    max_tokens: int = 64
    stream: bool = True
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop_words: tuple[str, ...] = ()
    bad_words: tuple[str, ...] = ()
    end_id: int | None = None
    return_perf_metrics: bool = False
    exclude_input_in_output: bool | None = None
    lookahead: LookaheadConfig | None = None  # per-request (w, n, g), Lookahead models only


@dataclass(frozen=True)
class Piece:
    text: str
    tokens: int
    seconds: float  # since the request was sent


@dataclass
class GenerationResult:
    pieces: list[Piece] = field(default_factory=list)
    perf: dict[str, float] = field(default_factory=dict)
    total_seconds: float = 0.0

    @property
    def text(self) -> str:
        return "".join(piece.text for piece in self.pieces)

    @property
    def tokens(self) -> int:
        return sum(piece.tokens for piece in self.pieces)

    @property
    def first_token_seconds(self) -> float | None:
        return next((piece.seconds for piece in self.pieces if piece.tokens), None)

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens per generation step. The context step yields one token; every later step one plus
        the drafts it accepted, so steps = tokens - 1 - accepted."""
        accepted = self.perf.get("total_accepted_draft_tokens")
        if accepted is None or self.tokens < 2:
            return None
        steps = self.tokens - 1 - accepted
        return (self.tokens - 1) / steps if steps > 0 else None


def _tensor(name: str, value: np.ndarray, dtype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(value.shape), dtype)
    tensor.set_data_from_numpy(value)
    return tensor


def build_inputs(request: GenerationRequest) -> list[grpcclient.InferInput]:
    """Shapes [1, 1] (batch of one): the ensemble has max_batch_size > 0."""
    inputs = [
        _tensor("text_input", np.array([[request.prompt.encode("utf-8")]], dtype=object), "BYTES"),
        _tensor("max_tokens", np.array([[request.max_tokens]], dtype=np.int32), "INT32"),
        _tensor("stream", np.array([[request.stream]], dtype=bool), "BOOL"),
    ]
    optional: list[tuple[str, object, type, str]] = [
        ("temperature", request.temperature, np.float32, "FP32"),
        ("top_k", request.top_k, np.int32, "INT32"),
        ("top_p", request.top_p, np.float32, "FP32"),
        ("seed", request.seed, np.uint64, "UINT64"),
        ("end_id", request.end_id, np.int32, "INT32"),
        ("exclude_input_in_output", request.exclude_input_in_output, bool, "BOOL"),
    ]
    if request.return_perf_metrics:
        optional.append(("return_perf_metrics", True, bool, "BOOL"))
    if request.lookahead is not None:
        optional.extend(
            (name, value, np.int32, "INT32") for name, value in zip(LOOKAHEAD_TRITON_KEYS, request.lookahead)
        )
    for name, value, np_type, dtype in optional:
        if value is not None:
            inputs.append(_tensor(name, np.array([[value]], dtype=np_type), dtype))
    for name, words in (("stop_words", request.stop_words), ("bad_words", request.bad_words)):
        if words:
            inputs.append(_tensor(name, np.array([[w.encode("utf-8") for w in words]], dtype=object), "BYTES"))
    return inputs


def _first(result: grpcclient.InferResult, name: str) -> np.ndarray | None:
    value = result.as_numpy(name)
    return None if value is None or value.size == 0 else value.reshape(-1)


def grpc_client(url: str) -> grpcclient.InferenceServerClient:
    """A client whose loopback connections never go through an http_proxy/grpc_proxy from the environment."""
    host = url.rsplit(":", 1)[0].strip("[]")
    if host not in ("127.0.0.1", "localhost", "::1"):
        return grpcclient.InferenceServerClient(url)
    size = 2**31 - 1  # tritonclient's own default limits, which channel_args would otherwise drop
    return grpcclient.InferenceServerClient(
        url,
        channel_args=[
            ("grpc.max_send_message_length", size),
            ("grpc.max_receive_message_length", size),
            ("grpc.enable_http_proxy", 0),
        ],
    )


def one_line(error: object) -> str:
    text = error.message() if isinstance(error, InferenceServerException) else str(error)
    return " ".join(str(text).split())


class TritonClient:
    """One gRPC channel; ``generate`` runs one request at a time on a fresh stream."""

    def __init__(self, url: str = "127.0.0.1:8001", model: str = "ensemble", timeout: float = 300.0) -> None:
        self.url, self.model, self.timeout = url, model, timeout
        self._client = grpc_client(url)

    def server_ready(self) -> bool:
        try:
            return self._client.is_server_ready()
        except InferenceServerException:
            return False

    def generate(
        self, request: GenerationRequest, on_piece: Callable[[Piece], None] | None = None, timeout: float | None = None
    ) -> GenerationResult:
        return self.generate_raw(build_inputs(request), on_piece, timeout)

    def generate_raw(
        self,
        inputs: list[grpcclient.InferInput],
        on_piece: Callable[[Piece], None] | None = None,
        timeout: float | None = None,
    ) -> GenerationResult:
        """Send prepared inputs (tests use this for malformed requests)."""
        events: queue.Queue = queue.Queue()
        deadline = time.monotonic() + (timeout or self.timeout)
        result = GenerationResult()
        try:
            self._client.start_stream(callback=lambda result, error: events.put((result, error)))
        except InferenceServerException as exc:
            raise ClientError(f"{self.url}: cannot open a stream ({one_line(exc)}); is the server running?") from None
        start = time.perf_counter()
        done = False
        request_id = uuid.uuid4().hex
        try:
            self._client.async_stream_infer(self.model, inputs, request_id=request_id, enable_empty_final_response=True)
            while not done:
                try:
                    response, error = events.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    raise ClientError(
                        f"{self.url}: no answer from {self.model} within {timeout or self.timeout:.0f} s"
                    ) from None
                if error is not None:
                    done = True  # an error ends the request on the server too
                    raise ClientError(f"{self.model}: {one_line(error)}{self._served_hint(self.model)}")
                done = self._take(response, result, start, on_piece)
        except InferenceServerException as exc:
            raise ClientError(f"{self.url}: {one_line(exc)}") from None
        except BaseException:  # timeout, Ctrl-C, a failing on_piece: end the request on the server
            if not done:
                done = self._stop_and_drain(request_id, events)
            raise
        finally:
            # Only when the graceful stop failed: Triton 2.51 then keeps the cancelled ensemble
            # request "in flight" for good (a shutdown waits out its exit timeout).
            self._client.stop_stream(cancel_requests=not done)
        result.total_seconds = time.perf_counter() - start
        return result

    def _take(
        self,
        response: grpcclient.InferResult,
        result: GenerationResult,
        start: float,
        on_piece: Callable[[Piece], None] | None,
    ) -> bool:
        """Record one response; True when it was the request's last."""
        text = _first(response, "text_output")
        if text is not None:
            counts = _first(response, "text_output_tokens")
            piece = Piece(
                text[0].decode("utf-8", errors="replace"),
                int(counts[0]) if counts is not None else 0,
                time.perf_counter() - start,
            )
            result.pieces.append(piece)
            if on_piece is not None:
                on_piece(piece)
        for name in PERF_OUTPUTS:
            value = _first(response, name)
            if value is not None:
                result.perf[name] = float(value[0])
        final = response.get_response().parameters.get("triton_final_response")
        return final is not None and final.bool_param

    def _stop_and_drain(self, request_id: str, events: queue.Queue) -> bool:
        """Stop the request in the backend, then wait for its final response; True once it came.

        A model that runs the BLS code (specdeploy's Python ensembles, ``tensorrt_llm_bls``) sends its
        ``tensorrt_llm`` request under an id of its own and stops it when its client cancels: False
        at once, and the caller cancels the stream."""
        if self._runs_bls_code() or not self.stop_in_backend(request_id):
            return False
        deadline = time.monotonic() + STOP_WAIT_SECONDS
        while True:
            try:
                response, error = events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return False
            if error is not None:
                return True
            final = response.get_response().parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                return True

    def stop_in_backend(self, request_id: str) -> bool:
        """Send ``stop`` for ``request_id`` to the tensorrt_llm model; True if it answered without error.

        A second channel: this client's own stream may still be busy with the request."""
        answers: queue.Queue = queue.Queue()
        one = np.array([[1]], dtype=np.int32)
        inputs = [
            _tensor("input_ids", one, "INT32"),
            _tensor("input_lengths", one, "INT32"),
            _tensor("request_output_len", one, "INT32"),
            _tensor("stop", np.array([[True]]), "BOOL"),
        ]
        client = grpc_client(self.url)
        try:
            backend = self.backend_model()
            client.start_stream(callback=lambda result, error: answers.put(error))
            client.async_stream_infer(backend, inputs, request_id=request_id, enable_empty_final_response=True)
            return answers.get(timeout=STOP_WAIT_SECONDS) is None
        except (InferenceServerException, queue.Empty):
            return False  # best effort: a server without the model or the input just ignores it
        finally:
            client.stop_stream(cancel_requests=True)
            client.close()

    def _runs_bls_code(self) -> bool:
        try:
            config = self.model_config(self.model)
        except ClientError:
            return False
        return config.get("backend") == "python" and "tensorrt_llm_model_name" in (config.get("parameters") or {})

    def backend_model(self) -> str:
        """The tensorrt_llm model behind this client's model: an ensemble's generating step, the BLS
        model's ``tensorrt_llm_model_name`` (``<variant>-tensorrt_llm`` on a whole-spec server)."""
        try:
            config = self.model_config(self.model)
        except ClientError:
            return BACKEND_MODEL
        if config.get("backend") == "tensorrtllm":
            return self.model
        steps = (config.get("ensemble_scheduling") or {}).get("step") or []
        if len(steps) == 3:  # preprocessing, tensorrt_llm, postprocessing
            return steps[1]["model_name"]
        named = (config.get("parameters") or {}).get("tensorrt_llm_model_name", {}).get("string_value")
        return named or BACKEND_MODEL

    def model_config(self, name: str) -> dict:
        """The config the server serves for ``name`` (JSON form, as Triton returns it)."""
        try:
            return self._client.get_model_config(name, as_json=True).get("config", {})
        except InferenceServerException as exc:
            raise ClientError(f"{self.url}: {one_line(exc)}{self._served_hint(name)}") from None

    def _served_hint(self, name: str) -> str:
        """'; served: a, b' (the ensembles and BLS models there are) when ``name`` is not one of them."""
        try:
            index = self._client.get_model_repository_index(as_json=True).get("models", [])
        except InferenceServerException:
            return ""
        served = sorted(
            m["name"]
            for m in index
            if m.get("state") == "READY" and not m["name"].endswith(("preprocessing", "postprocessing", "tensorrt_llm"))
        )
        return (
            f"; served models: {', '.join(served)} (choose one with --model)" if served and name not in served else ""
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> TritonClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
