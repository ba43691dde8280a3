"""A fake ``triton_python_backend_utils`` and the project's real ``tensorrt_llm`` config, to run the
reference backend's Triton model without a server."""

from __future__ import annotations

import threading
import types
from pathlib import Path

import numpy as np
from google.protobuf import json_format

from pipeline.triton.configs import RepositorySettings, tensorrt_llm_config

FINAL = 1


class FakeTensor:
    def __init__(self, name: str, array: np.ndarray):
        self.name, self.array = name, array

    def as_numpy(self) -> np.ndarray:
        return self.array


class FakeResponse:
    def __init__(self, output_tensors=(), error=None):
        self.tensors = {t.name: t.array for t in output_tensors}
        self.error = error


class FakeSender:
    def __init__(self) -> None:
        self.sent: list[tuple[FakeResponse | None, int]] = []
        self.cancelled = False
        self.done = threading.Event()

    def send(self, response=None, flags=0):
        self.sent.append((response, flags))
        if flags & FINAL:
            self.done.set()

    def is_cancelled(self) -> bool:
        return self.cancelled

    def responses(self) -> list[FakeResponse]:
        assert self.done.wait(30), "no final response"
        assert [f for _, f in self.sent].count(FINAL) == 1 and self.sent[-1][1] == FINAL
        return [r for r, _ in self.sent if r is not None]


class FakeRequest:
    def __init__(self, rid: str, **inputs: np.ndarray):
        self.rid, self.inputs, self.sender = rid, inputs, FakeSender()

    def request_id(self) -> str:
        return self.rid

    def get_response_sender(self) -> FakeSender:
        return self.sender


class FakeMetric:
    def __init__(self) -> None:
        self.value = 0.0

    def increment(self, n):
        self.value += n

    def set(self, v):
        self.value = v


class FakeFamily:
    COUNTER, GAUGE = "counter", "gauge"
    made: dict[str, FakeMetric] = {}

    def __init__(self, name, description, kind):
        self.name = name

    def Metric(self, labels):
        return FakeFamily.made.setdefault(self.name, FakeMetric())


def fake_pb_utils() -> types.SimpleNamespace:
    def get_input(request, name):
        return FakeTensor(name, request.inputs[name]) if name in request.inputs else None

    logger = types.SimpleNamespace(log_info=lambda m: None, log_warn=lambda m: None, log_error=lambda m: None)
    return types.SimpleNamespace(
        Tensor=FakeTensor,
        InferenceResponse=FakeResponse,
        TritonError=str,
        TRITONSERVER_RESPONSE_COMPLETE_FINAL=FINAL,
        get_input_tensor_by_name=get_input,
        Logger=logger,
        MetricFamily=FakeFamily,
    )


def model_config(engine_dir: Path, decoupled: bool = True, **params: str) -> dict:
    parameters = {
        "gpt_model_path": str(engine_dir),
        "exclude_input_in_output": "true",
        "decoding_mode": "top_k_top_p",
        "kv_cache_free_gpu_mem_fraction": "0.9",
        "medusa_choices": "${medusa_choices}",
        "reference_num_threads": "1",
        **params,
    }
    settings = RepositorySettings("ensemble", 8, decoupled, False, 1, 1, 0, {}, {}, parameters)
    return json_format.MessageToDict(tensorrt_llm_config(settings), preserving_proto_field_name=True)


def inputs(prompt: list[int], n: int, **extra) -> dict[str, np.ndarray]:
    """Shapes as Triton delivers them with max_batch_size > 0 (scalars reshaped to [1])."""
    base = {
        "input_ids": np.array([prompt], dtype=np.int32),
        "input_lengths": np.array([len(prompt)], np.int32),
        "request_output_len": np.array([n], np.int32),
    }
    return {**base, **extra}
