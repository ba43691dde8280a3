"""The Triton adapter with a fake ``triton_python_backend_utils`` (no server): parsing, responses, errors.

The model config is the project's real ``tensorrt_llm`` config (pipeline/triton/configs.py) in
the JSON form Triton hands to ``initialize``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from pipeline.errors import InputError
from pipeline.runtime.triton import backend as triton_backend
from pipeline.runtime.triton.io import StopRequest, parse_parameters, parse_parts, parse_request
from tests.runtime.fixtures import PROMPTS
from tests.runtime.triton.fakes import FINAL, FakeFamily, FakeRequest, fake_pb_utils, inputs, model_config


@pytest.fixture
def backend(monkeypatch, engine_dir):
    monkeypatch.setattr(triton_backend, "pb_utils", fake_pb_utils())
    FakeFamily.made = {}
    model = triton_backend.TritonPythonModel()
    model.initialize(
        {
            "model_config": json.dumps(model_config(engine_dir)),
            "model_name": "tensorrt_llm",
            "model_version": "1",
            "model_repository": str(engine_dir.parent),
        }
    )
    yield model
    model.finalize()


def test_streaming_and_final_responses(backend, engine):
    from tests.runtime.fixtures import engine_greedy

    want = engine_greedy(engine, PROMPTS[0], 4)
    stream = FakeRequest("s", **inputs(PROMPTS[0], 4, streaming=np.array([True]), return_perf_metrics=np.array([True])))
    whole = FakeRequest("w", **inputs(PROMPTS[0], 4, exclude_input_in_output=np.array([False])))
    assert backend.execute([stream, whole]) is None
    pieces = stream.sender.responses()
    assert [r.tensors["output_ids"].shape for r in pieces] == [(1, 1, 1)] * 4
    assert [int(r.tensors["output_ids"][0, 0, 0]) for r in pieces] == want
    last = pieces[-1].tensors
    assert last["sequence_length"].tolist() == [[1]] and last["output_ids"].dtype == np.int32
    assert last["acceptance_rate"].dtype == np.float32 and last["acceptance_rate"].shape == (1, 1)
    assert last["total_draft_tokens"].tolist() == [[0]] and last["total_accepted_draft_tokens"].tolist() == [[0]]
    (full,) = whole.sender.responses()
    assert full.tensors["output_ids"][0, 0].tolist() == PROMPTS[0] + want
    assert full.tensors["sequence_length"].tolist() == [[len(PROMPTS[0]) + 4]]
    assert "acceptance_rate" not in full.tensors
    assert FakeFamily.made["specdeploy_reference_generated_tokens_total"].value == 8
    assert FakeFamily.made["specdeploy_reference_requests_total"].value == 2


def test_bad_request_gets_an_error_and_others_continue(backend):
    long = FakeRequest("long", **inputs(list(range(70)), 4))
    penalty = FakeRequest("pen", **inputs(PROMPTS[0], 4, return_context_logits=np.array([True])))
    beam = FakeRequest("beam", **inputs(PROMPTS[0], 4, beam_width=np.array([2], np.int32)))
    fine = FakeRequest("ok", **inputs(PROMPTS[1], 3))
    backend.execute([long, penalty, beam, fine])
    assert "max_input_len 64" in long.sender.responses()[0].error
    assert penalty.sender.responses()[0].error.startswith(
        "return_context_logits needs an engine built with gather_context_logits"
    )
    assert beam.sender.responses()[0].error == "Requested beam width 2 is larger than configured max beam width 1"
    assert fine.sender.responses()[0].tensors["output_ids"].shape == (1, 1, 3)


def test_batch_and_num_return_sequences_split_into_tagged_sequences(backend, engine):
    """TensorRT-LLM's split: B rows x N sequences, each response tagged; one final flag for all."""
    from tests.runtime.fixtures import engine_greedy

    prompts = [PROMPTS[0], PROMPTS[3]]  # 6 and 3 tokens: one [2, 6] input_ids tensor, padded
    padded = [PROMPTS[0], PROMPTS[3] + [0, 0, 0]]
    request = FakeRequest(
        "b",
        input_ids=np.array(padded, np.int32),
        input_lengths=np.array([[6], [3]], np.int32),
        request_output_len=np.array([[3], [3]], np.int32),
        num_return_sequences=np.array([[2], [2]], np.int32),
        return_perf_metrics=np.array([[True], [True]]),
    )
    backend.execute([request])
    responses = request.sender.responses()
    got = {
        (int(r.tensors["batch_index"][0, 0]), int(r.tensors["sequence_index"][0, 0])): r.tensors["output_ids"][
            0, 0
        ].tolist()
        for r in responses
    }
    assert set(got) == {(0, 0), (0, 1), (1, 0), (1, 1)}
    for (row, _), tokens in got.items():  # greedy: every sequence of a row is the same
        assert tokens == engine_greedy(engine, prompts[row], 3)
    blocks = [int(r.tensors["kv_cache_alloc_new_blocks"][0, 0]) for r in responses]
    tokens_per_block = engine.config.limits.tokens_per_block
    # The cache holds the prompt and every generated token but the last (never fed back), in blocks.
    rows = [int(r.tensors["batch_index"][0, 0]) for r in responses]
    assert blocks == [-(-(len(prompts[row]) + 3 - 1) // tokens_per_block) for row in rows]
    assert all(int(r.tensors["kv_cache_alloc_total_blocks"][0, 0]) == b for r, b in zip(responses, blocks))
    assert all(int(r.tensors["kv_cache_reused_blocks"][0, 0]) == 0 for r in responses)


def test_values_beyond_the_engine_are_refused_naming_what_the_client_sent(backend, engine):
    """num_return_sequences beyond max_batch_size would hold the server for all of them, queued;
    end_id outside [-1, vocab) is TensorRT-LLM's own refusal; pad_id and stop words outside the
    vocabulary or longer than max_seq_len are mistakes. Each gets one line; -1 stays "no end id"."""
    limits, vocab = engine.config.limits, engine.config.model.vocab_size
    long_word = np.array([[[3] * 5000, [5000] + [-1] * 4999]], np.int32)  # [batch, 2, L]: one 5000-token word
    cases = {
        "many": (
            {"num_return_sequences": np.array([1000], np.int32)},
            f"num_return_sequences=1000 asks for 1000 sequences at once, more than the engine's max_batch_size "
            f"{limits.max_batch_size}; ask for at most {limits.max_batch_size}",
        ),
        "end-big": (
            {"end_id": np.array([10**6], np.int32)},
            f"end_id 1000000 is not within acceptable range [-1, {vocab}) (the vocabulary)",
        ),
        "end-neg": ({"end_id": np.array([-3], np.int32)}, f"end_id -3 is not within acceptable range [-1, {vocab})"),
        "pad": ({"pad_id": np.array([10**7], np.int32)}, f"pad_id 10000000 is outside the vocabulary [0, {vocab})"),
        "stop": (
            {"stop_words_list": long_word},
            f"stop_words_list: word 0 has 5000 tokens, more than the engine's max_seq_len {limits.max_seq_len}",
        ),
        "bad": (
            {"bad_words_list": np.array([[[4, vocab + 7], [2, -1]]], np.int32)},
            f"bad_words_list: word 0 has token id {vocab + 7}, outside the vocabulary [0, {vocab})",
        ),
    }
    requests = {name: FakeRequest(name, **inputs(PROMPTS[0], 3, **extra)) for name, (extra, _) in cases.items()}
    no_end = FakeRequest("no-end", **inputs(PROMPTS[0], 3, end_id=np.array([-1], np.int32)))
    backend.execute([*requests.values(), no_end])
    for name, (_, message) in cases.items():
        (response,) = requests[name].sender.responses()
        assert response.error.startswith(message), (name, response.error)
    assert no_end.sender.responses()[-1].tensors["output_ids"].shape == (1, 1, 3)


def test_generation_logits_and_log_probs_come_with_their_tokens(backend, engine):
    import torch

    stream = FakeRequest(
        "s",
        **inputs(
            PROMPTS[0],
            3,
            streaming=np.array([True]),
            return_generation_logits=np.array([True]),
            return_log_probs=np.array([True]),
        ),
    )
    whole = FakeRequest(
        "w", **inputs(PROMPTS[0], 3, return_generation_logits=np.array([True]), return_log_probs=np.array([True]))
    )
    backend.execute([stream, whole])
    (full,) = whole.sender.responses()
    logits = full.tensors["generation_logits"]
    tokens = full.tensors["output_ids"][0, 0].tolist()
    assert logits.shape == (1, 1, 3, engine.config.model.vocab_size) and logits.dtype == np.float32
    assert logits[0, 0].argmax(-1).tolist() == tokens  # greedy: each token is its row's argmax
    want = torch.log_softmax(torch.from_numpy(logits[0, 0]), -1)[range(3), tokens]
    assert full.tensors["output_log_probs"][0, 0] == pytest.approx(want.tolist(), abs=1e-5)
    assert full.tensors["cum_log_probs"][0, 0] == pytest.approx(float(want.sum()), abs=1e-4)
    pieces = stream.sender.responses()
    assert np.concatenate([p.tensors["generation_logits"] for p in pieces], axis=2) == pytest.approx(logits)


def test_stop_input_cancels_the_request_with_that_id(backend):
    slow = FakeRequest("job-7", **inputs(PROMPTS[0], 50, streaming=np.array([True])))
    backend.execute([slow])
    while not slow.sender.sent:
        time.sleep(0.001)
    stop = FakeRequest("job-7", **inputs(PROMPTS[0], 1, stop=np.array([True])))
    backend.execute([stop])
    assert stop.sender.responses() == []
    got = slow.sender.responses()
    assert len(got) < 50 and got[-1].tensors["output_ids"].shape[-1] == 0  # the final piece is empty


def test_client_disconnect_releases_the_request(backend):
    slow = FakeRequest("gone", **inputs(PROMPTS[0], 50, streaming=np.array([True])))
    backend.execute([slow])
    slow.sender.cancelled = True
    assert slow.sender.done.wait(30)
    assert slow.sender.sent[-1] == (None, FINAL)


def test_non_decoupled_config_answers_once_and_stop_cancels_mid_generation(monkeypatch, engine_dir):
    """One response per request, through the sender; execute does not block, so a stop request
    reaches a generation still running (the C++ backend's behaviour)."""
    monkeypatch.setattr(triton_backend, "pb_utils", fake_pb_utils())
    model = triton_backend.TritonPythonModel()
    model.initialize({"model_config": json.dumps(model_config(engine_dir, decoupled=False))})
    try:
        two_rows = {
            "input_ids": np.array([PROMPTS[0][:2], PROMPTS[2][:2]], np.int32),
            "input_lengths": np.array([[2], [2]], np.int32),
            "request_output_len": np.array([[2], [2]], np.int32),
        }
        requests = [
            FakeRequest("a", **inputs(PROMPTS[0], 3)),
            FakeRequest("b", **inputs(PROMPTS[1], 2)),
            FakeRequest("c", **inputs(PROMPTS[1], 2, streaming=np.array([True]))),
            FakeRequest("d", **two_rows),
            FakeRequest("long", **inputs(PROMPTS[0], 55)),
        ]
        stop = FakeRequest("long", **inputs([0], 1, stop=np.array([True])))
        assert model.execute(requests + [stop]) is None  # the stop is read while "long" runs
        out = [r.sender.responses() for r in requests]
        (stopped,) = stop.sender.responses()
    finally:
        model.finalize()
    assert [len(r) for r in out] == [1] * 5
    assert [r[0].tensors["output_ids"].shape for r in out[:2]] == [(1, 1, 3), (1, 1, 2)]
    assert "decoupled mode" in out[2][0].error
    assert out[3][0].error.startswith("Batch size > 1 requires the tensorrt_llm backend to be using decoupled")
    assert out[4][0].error is None and out[4][0].tensors["output_ids"].shape[-1] < 55
    assert stopped.error is None and stopped.tensors == {}  # the stop request's own (empty) response


def test_parameters(tmp_path):
    params = parse_parameters(
        model_config(
            Path("engine"),
            max_beam_width="${max_beam_width}",
            enable_chunked_context="maybe",
            cancellation_check_period_ms="20",
            eagle_choices="{0}, {0, 0}, {1}",
        ),
        tmp_path,
    )
    assert params.engine_dir == tmp_path / "engine" and params.max_beam_width == 1
    assert params.exclude_input_in_output and params.cancellation_check_period_ms == 20
    assert params.method.eagle_choices == ((0,), (0, 0), (1,)) and params.method.medusa_choices is None
    assert params.decoupled and {"output_ids", "acceptance_rate"} <= params.outputs
    with pytest.raises(InputError, match="lookahead_window_size, lookahead_ngram_size and"):
        parse_parameters(model_config(Path("e"), decoding_mode="lookahead", lookahead_window_size="4"))
    with pytest.raises(InputError, match="gpt_model_path"):
        parse_parameters({"parameters": {"gpt_model_path": {"string_value": "${engine_dir}"}}})


def test_request_parsing(tmp_path):
    params = parse_parameters(model_config(tmp_path))
    stop_words = np.array([[[5, 6, 7, 0], [2, 3, -1, -1]]], np.int32)  # [batch, 2, L]
    got = parse_request(
        lambda n: inputs(
            [1, 2, 3, 0, 0],
            9,
            stop_words_list=stop_words,
            input_lengths=np.array([3], np.int32),
            runtime_top_k=np.array([4]),
            seed=np.array([2**63 + 5], np.uint64),
            end_id=np.array([2]),
        ).get(n),
        "r",
        params,
    )
    assert got.input_ids == (1, 2, 3) and got.max_new_tokens == 9 and got.end_id == 2
    assert got.stop_words == ((5, 6), (7,)) and got.sampling.top_k == 4 and got.sampling.seed == 2**63 + 5
    assert got.exclude_input_in_output and not got.streaming
    assert parse_request(lambda n: {"stop": np.array([True])}.get(n), "x", params) == StopRequest("x")


def test_beam_search_num_return_sequences_is_one_sequence_of_that_many_beams(tmp_path):
    """TensorRT-LLM's executor: with beam search num_return_sequences picks the beams of ONE response
    (SamplingConfig::getNumReturnBeams); no split, so a non-decoupled model may ask for it too."""
    from dataclasses import replace

    params = parse_parameters(model_config(tmp_path))
    sent = inputs([1, 2, 3], 4, beam_width=np.array([3], np.int32), num_return_sequences=np.array([2], np.int32))
    for decoupled in (True, False):
        beams = replace(params, decoupled=decoupled)
        (part,) = parse_parts(sent.get, "r", beams)
        assert part.request.num_return_beams == 2 and part.sequence_index == 0
    unset = inputs([1, 2, 3], 4, beam_width=np.array([3], np.int32))
    (part,) = parse_parts(unset.get, "r", params)
    assert part.request.num_return_beams is None  # every beam
    sampled = inputs([1, 2, 3], 4, num_return_sequences=np.array([2], np.int32))
    assert len(parse_parts(sampled.get, "r", params)) == 2  # beam width 1: still split


def test_decoding_modes_fall_back_with_a_warning(engine):
    from pipeline.runtime.spec_decode.base import PlainDecoding
    from pipeline.runtime.spec_decode.factory import MethodSettings, make_method

    assert make_method(engine, MethodSettings("top_k_top_p"))[1] == [] and make_method(engine)[1] == []
    assert make_method(engine, MethodSettings("beam_search"))[1] == []  # beam_width > 1 requests get beams
    for mode, words in (
        ("redrafter", "not served by the reference backend"),
        ("fast", "not valid"),
    ):
        method, warnings = make_method(engine, MethodSettings(mode))
        assert isinstance(method, PlainDecoding) and words in warnings[0]
    # A speculative mode on an engine built without it is a load error, as on the GPU.
    with pytest.raises(InputError, match="built without medusa"):
        make_method(engine, MethodSettings("medusa"))


def test_max_beam_width_parameter_beyond_the_engine_is_a_load_error(monkeypatch, engine_dir):
    monkeypatch.setattr(triton_backend, "pb_utils", fake_pb_utils())
    model = triton_backend.TritonPythonModel()
    config = model_config(engine_dir, max_beam_width="2")  # the session engine is built with max_beam_width 1
    with pytest.raises(InputError, match="max_beam_width 2 is larger than the engine's max_beam_width 1"):
        model.initialize({"model_config": json.dumps(config), "model_repository": str(engine_dir.parent)})
