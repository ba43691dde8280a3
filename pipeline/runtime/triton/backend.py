"""``TritonPythonModel`` of the Python-based ``tensorrtllm`` backend: the CPU stand-in for TensorRT-LLM.

Triton loads it for every model whose config says ``backend: "tensorrtllm"``
(``<backend-dir>/tensorrtllm/model.py`` re-exports this class; pipeline/triton/launch_cpu.py
installs that shim). The model config is the one shipped to GPUs, unchanged.

``execute`` only parses and enqueues, and returns None; a background thread runs the scheduler
and answers through each request's response sender: one response per step when ``streaming``
is true, else one response with all tokens, the last one flagged
TRITONSERVER_RESPONSE_COMPLETE_FINAL. Non-decoupled configs are answered the same way (the Python
backend lets a non-decoupled model send its one response later through the sender), so
``execute`` never blocks: a ``stop`` request reaches the scheduler while the request it stops is
still generating, and cancels it mid-generation, as the C++ backend does. Streaming needs the
decoupled policy (TensorRT-LLM's rule).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.errors import InputError, SpecdeployError
from pipeline.lora.rules import HOST_CACHE_DEFAULT_BYTES
from pipeline.runtime.model.engine import Engine
from pipeline.runtime.model.lora import LoraCache, prefetch
from pipeline.runtime.request import FinishReason, StepOutput
from pipeline.runtime.serving.metrics import BackendMetrics
from pipeline.runtime.serving.scheduler import Scheduler
from pipeline.runtime.spec_decode.factory import make_method
from pipeline.runtime.triton.io import BackendParams, Part, StopRequest, parse_parameters, parse_parts, response_arrays

try:  # present inside the Python backend's stub process only
    import triton_python_backend_utils as pb_utils
except ImportError:  # tests and tooling import this module without Triton
    pb_utils = None

log = logging.getLogger(__name__)


def _log(level: str, message: str) -> None:
    logger = getattr(pb_utils, "Logger", None)
    if logger is not None:
        getattr(logger, f"log_{level}")(message)
    else:
        getattr(log, {"warn": "warning"}.get(level, level))(message)


def default_threads() -> int:
    """All CPUs we may use but one: the server, the tokenizer models and the clients share the
    machine, and an oversubscribed OpenMP pool is catastrophic (SmolLM2 decode: 0.16 s/step with
    1 thread, 1.45 s/step with 2 on a busy 2-core host). ``reference_num_threads`` overrides it."""
    return max(1, len(os.sched_getaffinity(0)) - 1)


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        self.params: BackendParams = parse_parameters(config, Path(args.get("model_repository") or "."))
        for warning in self.params.warnings:
            _log("warn", f"tensorrt_llm reference backend: {warning}")
        torch.set_num_threads(self.params.num_threads or default_threads())
        engine = Engine.load(self.params.engine_dir)
        method, warnings = make_method(engine, self.params.method)
        for warning in warnings:
            _log("warn", f"tensorrt_llm reference backend: {warning}")
        limits = engine.config.limits
        if self.params.max_beam_width > limits.max_beam_width:
            raise InputError(
                f"parameter max_beam_width {self.params.max_beam_width} is larger than the engine's "
                f"max_beam_width {limits.max_beam_width} ({self.params.engine_dir / 'config.json'}); "
                "rebuild the engine with build.max_beam_width or lower the parameter"
            )
        name = args.get("model_name", "tensorrt_llm")
        self.metrics = BackendMetrics(
            pb_utils,
            {"model": name, "version": str(args.get("model_version", ""))},
            draft_positions=getattr(method, "draft_positions", 0),
        )
        lora_cache = None
        if engine.lora is not None:
            lora_cache = LoraCache(
                self.params.lora_cache_host_memory_bytes or HOST_CACHE_DEFAULT_BYTES,
                client_adapters=self.params.lora_client_adapters,
            )
            if self.params.lora_prefetch_dir is not None:
                loaded, warnings = prefetch(lora_cache, self.params.lora_prefetch_dir, engine.config.model, engine.lora)
                for warning in warnings:
                    _log("warn", f"tensorrt_llm reference backend: {warning}")
                _log("info", f"tensorrt_llm reference backend: prefetched LoRA tasks {loaded}")
        self.scheduler = Scheduler(
            engine,
            method,
            lora_cache=lora_cache,
            on_step=self.metrics.on_step,
            limits=replace(limits, max_beam_width=self.params.max_beam_width),
            cancel_check_period_s=self.params.cancellation_check_period_ms / 1000,
            on_active=self.metrics.on_active,
        )
        self.scheduler.start()
        # Requests are keyed by more than the client's id: one submission's sequences share a key of
        # their own. A ``stop`` with an id cancels the latest submission that carried it, as the C++
        # backend does (model_instance_state.cc: mTritonRequestIdToRequestIds[tritonRequestId] is
        # overwritten by each new request with that id, and erased when its requests finish), never
        # another client's earlier request with the same id.
        self._latest: dict[str, str] = {}  # client's request id -> the key of its latest submission
        self._keys = itertools.count()
        self._keys_lock = threading.Lock()
        _log(
            "info",
            f"tensorrt_llm reference backend: {self.params.engine_dir} tp={engine.tp} pp={engine.pp} "
            f"max_batch_size={limits.max_batch_size} max_num_tokens={limits.max_num_tokens} "
            f"decoding={method.name} threads={torch.get_num_threads()}",
        )

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            self._submit(request, request.get_response_sender())
        return None

    def finalize(self) -> None:
        self.scheduler.stop()

    def _submit(self, request: Any, sender: Any) -> None:
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        get = _getter(request)
        try:
            parsed = parse_parts(get, request.request_id(), self.params, self.scheduler.limits.max_batch_size)
        except SpecdeployError as exc:
            sender.send(_error(str(exc)), flags=final)
            return
        if isinstance(parsed, StopRequest):
            if not parsed.request_id:
                sender.send(_error("stop=true needs the request id of the request to cancel"), flags=final)
                return
            with self._keys_lock:
                key = self._latest.get(parsed.request_id)
            if key is not None:
                self.scheduler.cancel(key)
            self._release(sender)
            return
        counts = (bool(_flag(get, "return_num_input_tokens")), bool(_flag(get, "return_num_output_tokens")))
        client_id = request.request_id() or ""
        with self._keys_lock:
            key = f"{client_id}#{next(self._keys)}"
            if client_id:
                self._latest[client_id] = key
        # A request of several sequences shares one sender: only its last finished sequence is final.
        remaining = _Countdown(len(parsed), on_done=lambda: self._forget(client_id, key))
        for part in parsed:
            part = replace(part, request=replace(part.request, request_id=key))
            self.scheduler.submit(
                part.request, self._sink(part, sender, counts, remaining), getattr(sender, "is_cancelled", None)
            )

    def _forget(self, client_id: str, key: str) -> None:
        """A submission has finished: its client id no longer reaches it (unless a later one took the id)."""
        with self._keys_lock:
            if self._latest.get(client_id) == key:
                del self._latest[client_id]

    def _sink(
        self, part: Part, sender: Any, counts: tuple[bool, bool], remaining: _Countdown
    ) -> Callable[[StepOutput], None]:
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

        def sink(out: StepOutput) -> None:
            last = False
            if out.finished:
                self.metrics.on_finished()
                last = remaining.done_one()
            flags = final if last else 0
            if out.reason is FinishReason.CANCELLED and getattr(sender, "is_cancelled", lambda: False)():
                if last:
                    self._release(sender)  # the client is gone: only end the request
                return
            sender.send(self._response(out, part, counts), flags=flags)

        return sink

    def _release(self, sender: Any) -> None:
        """End a request with no result: a bare final flag, or (non-decoupled, which must send
        exactly one response) an empty response."""
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if self.params.decoupled:
            sender.send(flags=final)
        else:
            sender.send(pb_utils.InferenceResponse(output_tensors=[]), flags=final)

    def _response(self, out: StepOutput, part: Part, counts: tuple[bool, bool]) -> Any:
        if out.error is not None:
            return _error(out.error)
        arrays = response_arrays(out, part.request, self.params.outputs, *counts, part=part)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in arrays.items()])


class _Countdown:
    """Sequences of one request still running (their sinks run on the scheduler's thread)."""

    def __init__(self, count: int, on_done: Callable[[], None] = lambda: None) -> None:
        self.count, self._lock, self._on_done = count, threading.Lock(), on_done

    def done_one(self) -> bool:
        """Count one finished sequence; True for the last (``on_done`` has run then)."""
        with self._lock:
            self.count -= 1
            last = self.count == 0
        if last:
            self._on_done()
        return last


def _getter(request: Any) -> Callable[[str], np.ndarray | None]:
    def get(name: str) -> np.ndarray | None:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        return None if tensor is None else tensor.as_numpy()

    return get


def _flag(get: Callable[[str], np.ndarray | None], name: str) -> bool:
    value = get(name)
    return bool(value is not None and value.size and value.reshape(-1)[0])


def _error(message: str) -> Any:
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message))
