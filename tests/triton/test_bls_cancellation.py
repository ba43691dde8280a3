"""The tensorrt_llm_bls model's cancellation pieces, with a fake ``triton_python_backend_utils`` (no server):
the watcher that notices a client has gone, and TensorRT-LLM's cancel message it sends.
tests/triton/test_server_cancellation.py runs them in a real tritonserver."""

from __future__ import annotations

import importlib.util
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np
import pytest

MODEL = Path(__file__).resolve().parents[2] / "pipeline" / "triton" / "models" / "tensorrt_llm_bls.py"


class Sent:
    """What the fake InferenceRequest was built with and how it was run."""

    requests: list[Sent] = []

    def __init__(self, model_name, inputs, request_id, requested_output_names):
        self.model_name, self.request_id = model_name, request_id
        self.inputs = {tensor.name: tensor.array for tensor in inputs}
        self.outputs, self.decoupled = requested_output_names, None
        Sent.requests.append(self)

    def exec(self, decoupled=False):
        self.decoupled = decoupled
        reply = types.SimpleNamespace(has_error=lambda: False)
        return [reply] if decoupled else reply


@pytest.fixture
def bls(monkeypatch):
    tensor = type("Tensor", (), {"__init__": lambda self, name, array: self.__dict__.update(name=name, array=array)})
    fake = types.SimpleNamespace(
        Tensor=tensor,
        InferenceRequest=Sent,
        Logger=types.SimpleNamespace(log_warn=lambda message: None),
        TRITONSERVER_RESPONSE_COMPLETE_FINAL=1,
    )
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake)
    spec = importlib.util.spec_from_file_location("bls_model_under_test", MODEL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    Sent.requests = []
    return module


def test_the_watcher_cancels_once_when_the_client_goes(bls):
    gone, cancelled = threading.Event(), []
    with bls._Watch(gone.is_set, period_s=0.01) as watch:
        watch.start(lambda: cancelled.append(time.monotonic()))
        time.sleep(0.05)
        assert not cancelled and not watch.fired
        gone.set()
        deadline = time.monotonic() + 5
        while not cancelled and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)
    assert len(cancelled) == 1 and watch.fired


def test_the_watcher_stops_with_its_request(bls):
    cancelled = []
    with bls._Watch(lambda: False, period_s=0.01) as watch:
        watch.start(lambda: cancelled.append(1))
    time.sleep(0.05)
    assert not cancelled and not watch.fired
    assert not watch._thread.is_alive()


def test_a_broken_cancellation_check_counts_as_gone(bls):
    def broken() -> bool:
        raise RuntimeError("the request is gone")

    cancelled = []
    with bls._Watch(broken, period_s=0.01) as watch:
        watch.start(lambda: cancelled.append(1))
        watch._thread.join(5)
    assert cancelled == [1]


@pytest.mark.parametrize("decoupled", [True, False])
def test_stop_is_tensorrt_llms_cancel_message(bls, decoupled):
    bls._stop("first-tensorrt_llm", "client-7", decoupled=decoupled)
    (stop,) = Sent.requests
    assert (stop.model_name, stop.request_id, stop.decoupled) == ("first-tensorrt_llm", "client-7", decoupled)
    assert stop.inputs["stop"].tolist() == [[True]] and stop.inputs["input_ids"].shape == (1, 0)
    assert stop.inputs["input_lengths"].dtype == np.int32 and stop.inputs["request_output_len"].tolist() == [[0]]
