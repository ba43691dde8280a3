"""A Triton client written for the conformance test, from NVIDIA's documented request format.

The format (TensorRT-LLM's ``triton_backend`` README and its ``all_models/inflight_batcher_llm`` configs):
a request sends each input tensor with a leading batch dimension of 1 (``max_batch_size`` > 0), its other
dims as the config declares them (``-1`` free); inputs declared with ``reshape: { shape: [ ] }`` are sent
as ``[1, 1]``; decoupled models are called over a gRPC stream, until the response flagged
``triton_final_response``; others with one ModelInfer call. Every tensor comes from
:data:`pipeline.triton.contract.CONTRACT`, so a tensor added to the table is sent and checked too.

:func:`default_value` is what a request sends for an input when it asks for nothing special: TensorRT-LLM's
own default for the inputs in :data:`DEFAULTS`, else zeros / false of the declared shape with every free
(``-1``) dim empty, which for every tensor of TensorRT-LLM 1.2 means "not set".
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from pipeline.triton import contract
from pipeline.triton.contract import Tensor

NUMPY = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "INT32": np.int32,
    "INT64": np.int64,
    "UINT64": np.uint64,
    "FP16": np.float16,
    "FP32": np.float32,
    "STRING": np.object_,
}

OMIT = None  # a default that is "do not send": the tensor has no "not set" value
# The conformance repositories' engines are float32: they declare lora_weights FP32 (the engine's dtype).
VARIABLES = {contract.LORA_WEIGHTS: "FP32"}


def _lookahead(index: int) -> Callable[[dict], object]:
    """A request's own (w, n, g): the server's on a Lookahead model (no change); elsewhere refused, so omitted."""
    return lambda ctx: ctx["lookahead"][index] if ctx.get("lookahead") else OMIT


# TensorRT-LLM's defaults where "zero" is not the default (executor SamplingConfig / Request).
DEFAULTS: dict[str, Callable[[dict], object]] = {
    "lookahead_window_size": _lookahead(0),
    "lookahead_ngram_size": _lookahead(1),
    "lookahead_verification_set_size": _lookahead(2),
    "lora_task_id": lambda ctx: OMIT,  # 0 is a task id
    "guided_decoding_guide": lambda ctx: OMIT,  # any string (even "") is a guide
    "image_url_input": lambda ctx: OMIT,  # any string is a URL (multimodal)
    "IMAGE_URL": lambda ctx: OMIT,
    "temperature": lambda ctx: 1.0,
    "repetition_penalty": lambda ctx: 1.0,
    "runtime_top_p_decay": lambda ctx: 1.0,
    "runtime_top_p_min": lambda ctx: 1.0e-6,
    "runtime_top_p_reset_ids": lambda ctx: -1,
    "early_stopping": lambda ctx: True,
    "min_tokens": lambda ctx: 1,
    "beam_width": lambda ctx: 1,
    "num_return_sequences": lambda ctx: 1,
    "end_id": lambda ctx: ctx["end_id"],
    "END_ID": lambda ctx: ctx["end_id"],
    "pad_id": lambda ctx: ctx["pad_id"],
    "PAD_ID": lambda ctx: ctx["pad_id"],
    "streaming": lambda ctx: ctx["stream"],
    "stream": lambda ctx: ctx["stream"],
    "embedding_bias": lambda ctx: np.zeros(ctx["vocab"], np.float32),
}


def shape_of(tensor: Tensor, free: int = 0) -> tuple[int, ...]:
    """The declared dims with every free (-1) one ``free`` long."""
    return tuple(free if d < 0 else d for d in tensor.dims)


def default_value(tensor: Tensor, ctx: dict) -> np.ndarray | None:
    """The value (without the batch dim) a request sends for ``tensor`` when it asks for nothing:
    TensorRT-LLM's default, else zeros / false of the declared shape with every free dim empty."""
    kind = NUMPY[contract.data_type(tensor, VARIABLES)]
    if tensor.name in DEFAULTS:
        given = DEFAULTS[tensor.name](ctx)
        if given is OMIT:
            return None
        value = np.asarray(given, dtype=kind)
        return value if value.ndim == len(tensor.dims) else value.reshape(shape_of(tensor, 1))
    if kind is np.object_:
        return np.full(shape_of(tensor), b"", dtype=object)
    return np.zeros(shape_of(tensor), dtype=kind)


def as_request_array(tensor: Tensor, value: object) -> np.ndarray:
    """A value (declared dims, no batch) as the request carries it: [1, *dims]."""
    array = np.asarray(value, dtype=NUMPY[contract.data_type(tensor, VARIABLES)])
    if tensor.reshape == () or array.ndim == 0:
        return array.reshape(1, 1)
    if array.ndim < len(tensor.dims):
        array = array.reshape((1,) * (len(tensor.dims) - array.ndim) + array.shape)
    return array[None]


@dataclass
class Reply:
    """A request's responses (outputs by name, per response) or its error."""

    responses: list[dict[str, np.ndarray]] = field(default_factory=list)
    error: str | None = None

    @property
    def last(self) -> dict[str, np.ndarray]:
        return self.responses[-1]


def tensors(model: str) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(inputs, outputs) of ``model`` by name, from the contract table."""
    inputs, outputs = contract.CONTRACT[model]
    return {t.name: t for t in inputs}, {t.name: t for t in outputs}


def infer(
    url: str,
    model: str,
    values: Mapping[str, object],
    outputs: list[str],
    decoupled: bool,
    request_id: str = "conformance",
    extra_inputs: Mapping[str, tuple[str, np.ndarray]] | None = None,
    timeout: float = 120.0,
) -> Reply:
    """One request to ``model`` with these inputs (by contract name) and requested outputs."""
    import tritonclient.grpc as grpcclient

    declared, _ = tensors(model)
    sent = []
    for name, value in values.items():
        array = as_request_array(declared[name], value)
        wire = contract.data_type(declared[name], VARIABLES)  # a config's TYPE_STRING is BYTES on the wire
        tensor = grpcclient.InferInput(name, list(array.shape), "BYTES" if wire == "STRING" else wire)
        tensor.set_data_from_numpy(array)
        sent.append(tensor)
    for name, (dtype, array) in (extra_inputs or {}).items():
        tensor = grpcclient.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        sent.append(tensor)
    wanted = [grpcclient.InferRequestedOutput(name) for name in outputs]
    client = grpcclient.InferenceServerClient(url)
    reply = Reply()
    try:
        if not decoupled:
            try:
                result = client.infer(model, sent, outputs=wanted, request_id=request_id, client_timeout=timeout)
            except Exception as exc:  # InferenceServerException: the request's error
                reply.error = str(exc)
                return reply
            reply.responses.append(_outputs(result))
            return reply
        results: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer(model, sent, outputs=wanted, request_id=request_id, enable_empty_final_response=True)
        while True:
            result, error = results.get(timeout=timeout)
            if error is not None:
                reply.error = str(error)
                break
            response = result.get_response()
            if response.outputs:
                reply.responses.append(_outputs(result))
            if response.parameters["triton_final_response"].bool_param:
                break
        client.stop_stream()
        return reply
    finally:
        client.close()


def _outputs(result) -> dict[str, np.ndarray]:
    return {out.name: result.as_numpy(out.name) for out in result.get_response().outputs}
