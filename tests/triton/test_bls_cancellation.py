"""The tensorrt_llm_bls model's cancellation pieces, with a fake ``triton_python_backend_utils`` (no server):
the watcher that notices a client has gone, TensorRT-LLM's cancel message it sends, and one streaming
request end to end over fake models (a vanished client, a failed postprocessing).
tests/triton/test_server_cancellation.py runs them in a real tritonserver."""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
import time
import types
import weakref
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


def test_no_cancellation_check_outlives_its_request(bls):
    """Triton frees a request's sender once it is answered: a check still under way when the
    request ends is waited for, and none starts after."""
    checking, release, checks = threading.Event(), threading.Event(), []

    def slow_check() -> bool:  # an IPC round trip that takes a while
        checks.append("started")
        checking.set()
        release.wait(5)
        checks.append("returned")
        return False

    with bls._Watch(slow_check, period_s=0.01) as watch:
        watch.start(lambda: None)
        assert checking.wait(5)
        threading.Timer(0.1, release.set).start()
    checks.append("request ended")
    time.sleep(0.05)
    assert checks == ["started", "returned", "request ended"]


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
    kept = []
    bls._stop("first-tensorrt_llm", "client-7", decoupled=decoupled, keep=kept.append)
    (stop,) = Sent.requests
    assert (stop.model_name, stop.request_id, stop.decoupled) == ("first-tensorrt_llm", "client-7", decoupled)
    assert stop.inputs["stop"].tolist() == [[True]] and stop.inputs["input_ids"].shape == (1, 0)
    assert stop.inputs["input_lengths"].dtype == np.int32 and stop.inputs["request_output_len"].tolist() == [[0]]
    assert len(kept) == 1  # its replies, read out, go to the keeper


# -- one streaming request end to end, with fake models: preprocessing, an inner stream, postprocessing --

STEPS = [
    {"model": "pre", "inputs": {"QUERY": "text_input"}, "outputs": {"INPUT_ID": "_INPUT_ID"}},
    {"model": "llm", "inputs": {"input_ids": "_INPUT_ID"}, "outputs": {"output_ids": "_TOKENS"}},
    {"model": "post", "inputs": {"TOKENS": "_TOKENS"}, "outputs": {"OUTPUT": "text_output"}},
]


class Out:
    """A response tensor as the Python backend hands it over (``name()``, ``as_numpy()``)."""

    def __init__(self, name, array):
        self._name, self._array = name, np.asarray(array)

    def name(self):
        return self._name

    def as_numpy(self):
        return self._array


def reply(**tensors):
    outputs = [Out(name, array) for name, array in tensors.items()]
    return types.SimpleNamespace(has_error=lambda: False, output_tensors=lambda: outputs)


class InnerStream:
    """The inner request's responses: ``tokens`` one-token responses, then the empty final one; a
    ``stop`` for its id ends it early (as the backend does). Records how far it was read."""

    def __init__(self, tokens):
        self.tokens, self.read, self.stopped, self.ended = tokens, 0, False, False

    def __iter__(self):
        return self

    def __next__(self):
        if self.ended:
            raise StopIteration
        if self.stopped or self.read == self.tokens:
            self.ended = True
            return reply()
        self.read += 1
        return reply(output_ids=[[self.read]])


@pytest.fixture
def bls_model(bls, monkeypatch):
    """A decoupled model over the fake steps; ``stream`` is the inner request's stream, ``stops`` the
    ids of the stop requests it got, and ``post`` fails on the token it names."""
    state = types.SimpleNamespace(stream=InnerStream(5), stops=[], stop_threads=[], post_fails_on=None)

    class Request(Sent):
        def exec(self, decoupled=False):
            self.decoupled = decoupled
            if self.model_name == "pre":
                return reply(INPUT_ID=[[1, 2]])
            if self.model_name == "post":
                token = int(self.inputs["TOKENS"].reshape(-1)[0])
                if token == state.post_fails_on:
                    return types.SimpleNamespace(
                        has_error=lambda: True, error=lambda: types.SimpleNamespace(message=lambda: "post broke")
                    )
                return reply(OUTPUT=[[f"t{token}"]])
            if "stop" in self.inputs:
                state.stops.append(self.request_id)
                state.stop_threads.append(threading.current_thread())
                state.stream.stopped = True
                return [types.SimpleNamespace(has_error=lambda: False)]
            return state.stream

    fake = sys.modules["triton_python_backend_utils"]
    fake.InferenceRequest = Request
    fake.InferenceResponse = lambda output_tensors, error=None: types.SimpleNamespace(
        outputs={t.name: t.array for t in output_tensors}, error=error
    )
    fake.TritonError = lambda message: message
    model = bls.TritonPythonModel()
    parameters = {
        "specdeploy_steps": {"string_value": json.dumps(STEPS)},
        "tensorrt_llm_model_name": {"string_value": "llm"},
        "cancellation_check_period_ms": {"string_value": "10"},
    }
    config = {"name": "ensemble", "model_transaction_policy": {"decoupled": True}, "parameters": parameters}
    config["output"] = [{"name": "text_output"}]
    model.initialize({"model_config": json.dumps(config)})
    state.model = model
    return state


class Client:
    """A response sender whose client vanishes after ``lasts`` responses (later sends raise), or
    cancels after ``cancels_after`` (Triton then reports the request cancelled)."""

    def __init__(self, lasts=1_000, cancels_after=1_000):
        self.lasts, self.cancels_after, self.sent, self.final = lasts, cancels_after, [], False

    def send(self, response=None, flags=0):
        if flags:
            self.final = True
        if len(self.sent) >= self.lasts:
            raise RuntimeError("Unable to send response: the client is gone")
        if response is not None:
            self.sent.append(response)

    def is_cancelled(self):
        return len(self.sent) >= self.cancels_after


def request(text="hi", request_id="client-1"):
    inputs = [Out("text_input", np.array([[text]], dtype=object))]
    return types.SimpleNamespace(inputs=lambda: inputs, request_id=lambda: request_id)


def test_a_stream_is_post_processed_response_by_response(bls_model):
    client = Client()
    bls_model.model._stream(request(), client)
    assert [r.outputs["text_output"].tolist() for r in client.sent] == [[[f"t{i}"]] for i in range(1, 6)]
    assert client.final and bls_model.stream.ended and bls_model.stops == []


def own_id(stops: list[str]) -> bool:
    """One stop, with the inner request's own id: the client's id and a unique suffix, never the client's
    id alone (another client's request may carry it)."""
    return len(stops) == 1 and stops[0].startswith("client-1-") and len(stops[0]) > len("client-1-")


def test_a_vanished_client_cancels_the_inner_stream_which_is_still_read_to_its_end(bls_model):
    bls_model.stream = InnerStream(10_000)
    client = Client(lasts=2)  # the third send raises
    bls_model.model._stream(request(), client)
    assert len(client.sent) == 2 and client.final  # the final flag is still tried
    assert own_id(bls_model.stops)  # TensorRT-LLM's cancel, with the inner request's id
    assert bls_model.stream.ended and bls_model.stream.read < 10_000  # stopped early, read out


def test_a_cancelled_stream_is_stopped_from_its_reading_thread(bls_model):
    bls_model.stream = InnerStream(10_000)
    client = Client(cancels_after=3)
    bls_model.model._stream(request(), client)
    assert own_id(bls_model.stops) and bls_model.stream.ended and client.final
    # Not from the watcher's thread while the stream's responses arrive: see _stop.
    assert bls_model.stop_threads == [threading.current_thread()]


def test_a_failed_postprocessing_ends_the_request_and_cancels_the_inner_one(bls_model):
    bls_model.stream, bls_model.post_fails_on = InnerStream(10_000), 3
    client = Client()
    bls_model.model._stream(request(), client)
    assert [getattr(r, "error", None) for r in client.sent] == [None, None, "post broke"] and client.final
    assert own_id(bls_model.stops) and bls_model.stream.ended


def test_finished_streams_are_held_for_the_grace_period_then_let_go(bls):
    class Replies:
        pass

    kept = bls._Kept(grace_s=0.05)
    first = Replies()
    gone = weakref.ref(first)
    kept.keep(first)
    del first
    assert gone() is not None  # held: the Python backend's own reference goes first
    time.sleep(0.1)
    kept.keep(Replies())  # the next stream lets the expired ones go
    assert gone() is None
