"""specdeploy tensorrt_llm_bls: the ensemble's API served by one Python model (Triton's BLS).

Copied into ``<repo>/tensorrt_llm_bls/1/model.py``; imports only numpy and Triton's utilities.
It runs the ensemble's three steps itself, as the ``specdeploy_steps`` parameter lists them (the
same wiring the ensemble's config has, generated from one table): preprocessing once, then
``tensorrt_llm``, then postprocessing on every response ``tensorrt_llm`` sends. NVIDIA's
repository ships a model of this name with the same inputs and outputs; clients select it with
``--model-name tensorrt_llm_bls``.

The same file serves the ensemble's name (``serving.ensemble: python``, the default), with the
ensemble's inputs and outputs and its steps: Triton's own ensemble scheduler never tells the
running ``tensorrt_llm`` step that the client is gone (triton-inference-server/core#263), this
model does (below). There ``specdeploy_forward_num_return_sequences`` keeps the ensemble's wiring,
which passes ``num_return_sequences`` on with beam search too. A shared LoRA fine-tune's models
carry its ``lora_task_id`` as a parameter and set it on every request that names none.

Beam search (``beam_width`` > 1) as NVIDIA's: every response carries one ``text_output`` per beam
(and the beams' ``cum_log_probs`` / ``output_log_probs`` / logits), and ``num_return_sequences`` is not
passed on, so all beam_width beams come back (NVIDIA's decoder does not forward it either).

A client that cancels or goes away stops the generation within ``cancellation_check_period_ms``
(100 ms): a watcher polls the request's cancellation while ``tensorrt_llm`` generates (streaming
or not) and then cancels the inner request, with the response iterator's ``cancel()`` where the
Python backend has it (triton-inference-server/python_backend#398, 2025) and always with
TensorRT-LLM's own cancel message, a ``stop`` request with the inner request's id (Triton 2.51
has no ``cancel()``; both backends honour ``stop``). The inner request has an id of its own (the
client's id and a unique suffix), so that stop, and the one a failed request sends, reach this
request only, never another client's that carries the same id. A client's own ``stop`` sent to this
model reaches its latest request here, as TensorRT-LLM's backend maps an id to its latest request;
one sent straight to ``tensorrt_llm`` with the client's id does not reach it. The inner stream is
always read to its final response: a send to a vanished client or a failed postprocessing cancels it
first, and nothing is left half-read in the Python backend. Finished inner streams are held a
while before they are let go (``_Kept``: a Python backend defect in Triton 2.51 otherwise frees
their arrays without the GIL).

What it does not do: draft-target speculative decoding (``num_draft_tokens``, which needs a
draft model this repository does not have: ``tensorrt_llm_draft_model_name`` is empty) and
multimodal inputs. Both get a one-line error instead of an answer that ignores them.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import deque

import numpy as np
import triton_python_backend_utils as pb_utils

UNSUPPORTED = ("image_input", "image_bytes_input", "image_url_input", "video_bytes_input")


class RequestError(ValueError):
    """A problem with one request; it becomes that request's error response."""


def parameter(config: dict, key: str, default: str = "") -> str:
    value = config.get("parameters", {}).get(key, {}).get("string_value")
    return default if value is None or value.startswith("${") else value


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        self.decoupled = bool(config.get("model_transaction_policy", {}).get("decoupled", False))
        self.steps = json.loads(parameter(config, "specdeploy_steps", "[]"))
        if [step["model"] for step in self.steps][1:2] != [parameter(config, "tensorrt_llm_model_name")]:
            raise ValueError(
                "tensorrt_llm_bls: specdeploy_steps must be preprocessing, tensorrt_llm_model_name, postprocessing"
            )
        self.name = config.get("name", "tensorrt_llm_bls")
        self.outputs = [output["name"] for output in config.get("output", [])]
        self.forward_sequences = parameter(config, "specdeploy_forward_num_return_sequences") == "true"
        task = parameter(config, "lora_task_id")
        self.lora_task_id = int(task) if task else None
        self.cancel_period_s = int(parameter(config, "cancellation_check_period_ms", "100") or 100) / 1000
        self.threads: list[threading.Thread] = []
        self.kept = _Kept()
        # The client's request id -> the inner id of its latest request still running here, so that a
        # client's own stop reaches that one, as TensorRT-LLM's backend maps an id to its latest request.
        self.inner_ids: dict[str, str] = {}
        self.inner_lock = threading.Lock()

    def execute(self, requests: list) -> list | None:
        if not self.decoupled:
            return [self._single(request) for request in requests]
        for request in requests:
            thread = threading.Thread(target=self._stream, args=(request, request.get_response_sender()), daemon=True)
            thread.start()
            self.threads = [t for t in self.threads if t.is_alive()] + [thread]
        return None

    def finalize(self) -> None:
        for thread in self.threads:
            thread.join(timeout=5)

    # -- one request --------------------------------------------------------------------------------------

    def _single(self, request):
        cancelled = getattr(request, "is_cancelled", lambda: False)
        try:
            responses = list(self._run(request, cancelled=cancelled))
        except RequestError as exc:
            return _error(str(exc))
        if not responses and cancelled():
            return _error("the request was cancelled")
        if len(responses) != 1:
            return _error(f"tensorrt_llm sent {len(responses)} responses to a non-decoupled request")
        return responses[0]

    def _stream(self, request, sender) -> None:
        """Answer a decoupled request through its sender. A send that fails means the client is gone:
        nothing more is sent to it, and the inner request is cancelled as for a client that cancels
        (``_run`` still reads the inner stream to its end). The final flag is always attempted, so
        Triton ends the request."""
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        gone = threading.Event()

        def send(response=None, flags: int = 0) -> None:
            if gone.is_set() and not flags:
                return
            try:
                if response is None:
                    sender.send(flags=flags)
                else:
                    sender.send(response, flags=flags)
            except Exception as exc:  # noqa: BLE001 - a vanished client must not end the inner stream early
                if not gone.is_set():
                    pb_utils.Logger.log_warn(f"{self.name}: sending a response failed, cancelling the request: {exc}")
                gone.set()

        try:
            for response in self._run(request, cancelled=lambda: gone.is_set() or sender.is_cancelled()):
                send(response)
        except RequestError as exc:
            send(_error(str(exc)))
        except Exception as exc:  # noqa: BLE001 - a failed request must still end its stream
            send(_error(f"{self.name}: {type(exc).__name__}: {exc}"))
        send(flags=final)

    def _run(self, request, cancelled=lambda: False):
        """The request's responses: one per ``tensorrt_llm`` response, post-processed."""
        tensors = {tensor.name(): _batched(tensor.as_numpy()) for tensor in request.inputs()}
        if _flag(tensors.get("stop")):  # TensorRT-LLM's cancel message, for the client's latest request
            if not request.request_id():
                raise RequestError("Trying to stop a request but request ID is not provided")
            with self.inner_lock:
                inner = self.inner_ids.get(request.request_id())
            if inner is not None:
                _stop(self.steps[1]["model"], inner, decoupled=self.decoupled, keep=self.kept.keep)
            if not self.decoupled:  # a non-decoupled request gets exactly one response
                yield pb_utils.InferenceResponse(output_tensors=[])
            return
        self._refuse(tensors)
        if self.lora_task_id is not None and tensors.get("lora_task_id", np.zeros(0)).size == 0:
            batch = tensors["text_input"].shape[0] if "text_input" in tensors else 1
            tensors["lora_task_id"] = np.full((batch, 1), self.lora_task_id, dtype=np.uint64)
        pre, llm, post = self.steps
        tensors.update(_call(pre, tensors))
        stream = _flag(tensors.get("stream"))
        if stream and not self.decoupled:
            raise RequestError("Streaming is only supported if model is deployed using decoupled mode.")
        if _beams(tensors) > 1 and not self.forward_sequences:
            # NVIDIA's BLS (lib/triton_decoder.py) never forwards num_return_sequences: with beam search
            # every beam comes back, one text_output per beam, whatever num_return_sequences says.
            tensors.pop("num_return_sequences", None)
        # Its own id, whatever the client sent: the stop it sends when its client goes or its request
        # fails must reach this request only, not another client's with the same id.
        client_id = request.request_id() or ""
        inner_id = f"{client_id or 'bls'}-{uuid.uuid4().hex}"
        if client_id:
            with self.inner_lock:
                self.inner_ids[client_id] = inner_id
        try:
            yield from self._generate(tensors, llm, post, inner_id, cancelled)
        finally:
            with self.inner_lock:
                if client_id and self.inner_ids.get(client_id) == inner_id:
                    del self.inner_ids[client_id]

    def _generate(self, tensors: dict, llm: dict, post: dict, inner_id: str, cancelled):
        """The ``tensorrt_llm`` request under ``inner_id``, its responses post-processed."""
        inference = _request(llm, tensors, inner_id)
        with _Watch(cancelled, self.cancel_period_s, self.name) as watch:
            replies = self._start(inference, watch, llm["model"], inner_id)
            stream, ended = iter(replies), False
            try:
                for reply in stream:
                    watch.read_here()  # from the first response on, the stop goes out from here (_stop)
                    watch.run_pending()
                    if watch.fired:
                        continue  # drain: the backend ends the cancelled request with a final response
                    response = self._reply(reply, llm, post, tensors)
                    if response is not None:
                        yield response
                ended = True
            finally:
                if not ended:  # an error, or the consumer left: cancel the inner request, read it out
                    watch.fire()
                    for _ in stream:
                        pass
                if self.decoupled:
                    self.kept.keep(replies)

    def _start(self, inference, watch: _Watch, model: str, inner_id: str):
        """Run the ``tensorrt_llm`` request; once the client is gone, cancel it there: from the
        watcher's thread until its first response (it may wait in the queue for a slot, with no
        response to cancel it between), from the reading thread between responses once it streams
        (``_Watch.read_here``; why in ``_stop``)."""
        if not self.decoupled:
            watch.start(lambda: _stop(model, inner_id, decoupled=False))
            return [inference.exec()]
        replies = None

        def cancel() -> None:
            cancel_iterator = getattr(replies, "cancel", None)  # python_backend#398; not in Triton 2.51
            if cancel_iterator is not None:
                cancel_iterator()
            _stop(model, inner_id, decoupled=True, keep=self.kept.keep)

        watch.start(cancel)
        replies = inference.exec(decoupled=True)
        return replies

    def _reply(self, reply, llm: dict, post: dict, tensors: dict):
        if reply.has_error():
            raise RequestError(reply.error().message())
        produced = {tensor.name(): tensor.as_numpy() for tensor in reply.output_tensors()}
        if not produced:  # the empty final response of a decoupled model
            return None
        step = {llm["outputs"][name]: value for name, value in produced.items() if name in llm["outputs"]}
        step.update(_call(post, {**tensors, **step}))
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(name, step[name]) for name in self.outputs if name in step]
        )

    @staticmethod
    def _refuse(tensors: dict) -> None:
        for name in UNSUPPORTED:
            if name in tensors and tensors[name].size:
                raise RequestError(f"input {name}: multimodal requests are not supported by this repository")
        drafts = tensors.get("num_draft_tokens")
        if drafts is not None and drafts.size and int(drafts.reshape(-1)[0]) > 0:
            raise RequestError(
                "num_draft_tokens: draft-target speculative decoding needs a draft model "
                "(tensorrt_llm_draft_model_name), and this repository has none"
            )


class _Watch:
    """Polls ``cancelled`` every ``period_s`` from a thread of its own (the request's thread is
    blocked in ``tensorrt_llm``) and runs ``on_cancel`` once when it turns true, or when the
    request's thread calls ``fire`` (a failed request). Once a thread has said it reads the inner
    stream (``read_here``), a cancellation the watcher notices is left for that thread, which runs it
    between two responses (``run_pending``)."""

    def __init__(self, cancelled, period_s: float, model: str = "tensorrt_llm_bls") -> None:
        self.cancelled, self.period_s, self.model = cancelled, period_s, model
        self.fired = False
        self._on_cancel = None
        self._reader: threading.Thread | None = None
        self._pending = False
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, on_cancel) -> None:
        self._on_cancel = on_cancel

        def watch() -> None:
            while not self._done.wait(self.period_s):
                try:
                    gone = bool(self.cancelled())
                except Exception:  # noqa: BLE001 - a request whose state cannot be read is gone
                    gone = True
                if gone:
                    self.fire()
                    return

        self._thread = threading.Thread(target=watch, name="bls-cancel-watch", daemon=True)
        self._thread.start()

    def read_here(self) -> None:
        with self._lock:
            self._reader = threading.current_thread()

    def fire(self) -> None:
        """Cancel the inner request (once; a no-op before ``start``): now, or, called from another
        thread than the reader, at the reader's next ``run_pending``."""
        with self._lock:
            if self.fired or self._on_cancel is None:
                return
            self.fired = True
            if self._reader not in (None, threading.current_thread()):
                self._pending = True
                return
        self._cancel()

    def run_pending(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, False
        if pending:
            self._cancel()

    def _cancel(self) -> None:
        assert self._on_cancel is not None  # fire() runs it only after start()
        try:
            self._on_cancel()
        except Exception as exc:  # noqa: BLE001 - log and let the request run out
            pb_utils.Logger.log_warn(f"{self.model}: cancelling the request failed: {exc}")

    def __enter__(self) -> _Watch:
        return self

    def __exit__(self, *exc) -> None:
        """Stop watching, and wait for a check under way: Triton frees the request (and its response
        sender) once it is answered, and a check that reaches it after that crashes the server (in
        ``TRITONBACKEND_ResponseFactoryIsCancelled``)."""
        self._done.set()
        if self._thread is not None:
            self._thread.join()


class _Kept:
    """Finished decoupled response iterators, held ``grace_s`` before they are let go.

    The Python backend keeps a reference of its own to every decoupled response iterator, with all
    of its responses, and drops it from a thread of its own that does not hold the GIL once the
    stream has ended. Where that is the last reference, the responses' numpy arrays are freed
    without the GIL, which now and then corrupts the stub's allocator and crashes it (fixed upstream
    after Triton 2.51: ``PbTensor::~PbTensor`` takes the GIL since triton-inference-server/python_backend#390).
    Holding ours a while makes the backend's reference go first, so the last one is dropped here,
    by Python, with the GIL held."""

    def __init__(self, grace_s: float = 10.0) -> None:
        self.grace_s = grace_s
        self._held: deque[tuple[float, object]] = deque()
        self._lock = threading.Lock()

    def keep(self, replies) -> None:
        now = time.monotonic()
        expired = []
        with self._lock:
            self._held.append((now + self.grace_s, replies))
            while self._held[0][0] <= now:
                expired.append(self._held.popleft())
        expired.clear()  # dropped outside the lock: freeing an iterator may take a while


def _stop(model: str, request_id: str, decoupled: bool, keep=lambda replies: None) -> None:
    """TensorRT-LLM's cancel message: ``stop=true`` with the id of the request to cancel (and the
    required inputs, empty, as NVIDIA's inflight_batcher_llm_client sends them). A decoupled
    model takes only decoupled requests; their replies are read to the end and handed to ``keep``.

    A decoupled request that returns while another thread of the stub is woken in a stream it reads
    can deadlock Triton 2.51's Python backend: ``exec`` returns into ``Stub::GetResponseIterator``
    with the GIL held and waits for the stub's iterator map, which the stub's response thread holds
    while it waits for the reading thread's iterator lock, which that thread holds while it waits for
    the GIL (``ProcessBLSResponseDecoupled``, ``ResponseIterator::Next``). A stop sent from the watcher
    while the stopped stream's own responses arrive is the likeliest moment for it, so once a stream
    is read, its stop goes out from the reading thread, between two responses."""
    inputs = [
        pb_utils.Tensor("input_ids", np.zeros((1, 0), dtype=np.int32)),
        pb_utils.Tensor("input_lengths", np.zeros((1, 1), dtype=np.int32)),
        pb_utils.Tensor("request_output_len", np.zeros((1, 1), dtype=np.int32)),
        pb_utils.Tensor("stop", np.ones((1, 1), dtype=bool)),
    ]
    stop = pb_utils.InferenceRequest(model_name=model, inputs=inputs, request_id=request_id, requested_output_names=[])
    replies = stop.exec(decoupled=True) if decoupled else [stop.exec()]
    errors = [reply.error().message() for reply in replies if reply.has_error()]
    keep(replies)
    if errors:
        raise RuntimeError(errors[0])


def _batched(array: np.ndarray) -> np.ndarray:
    """Inputs with ``reshape: []`` arrive as [batch]; the other models take them as [batch, 1]."""
    return array.reshape(-1, 1) if array.ndim == 1 else array


def _beams(tensors: dict) -> int:
    width = tensors.get("beam_width")
    return int(width.reshape(-1)[0]) if width is not None and width.size else 1


def _flag(array) -> bool:
    return bool(array is not None and array.size and array.reshape(-1)[0])


def _request(step: dict, tensors: dict, request_id: str = ""):
    inputs = [pb_utils.Tensor(inner, tensors[outer]) for inner, outer in step["inputs"].items() if outer in tensors]
    return pb_utils.InferenceRequest(
        model_name=step["model"], inputs=inputs, request_id=request_id, requested_output_names=list(step["outputs"])
    )


def _call(step: dict, tensors: dict) -> dict:
    """Run a non-decoupled step; its outputs by their ensemble names."""
    reply = _request(step, tensors).exec()
    if reply.has_error():
        raise RequestError(reply.error().message())
    return {step["outputs"][t.name()]: t.as_numpy() for t in reply.output_tensors() if t.name() in step["outputs"]}


def _error(message: str):
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message))
