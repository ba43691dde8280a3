"""Beam search and context logits on a tiny engine built with max_beam_width 4 and gather_context_logits.

The reference is Hugging Face's own beam search (``generate(num_beams=...)``) on the model the engine
was converted from: an independent implementation of the same algorithm (TensorRT-LLM's kernels follow
it), so the beams, their order and their scores must agree; each beam's cumulative log-probability is
also recomputed from one full forward of the whole sequence.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from pipeline.runtime.model.engine import Engine, Logits, StepInput
from pipeline.runtime.request import GenerationRequest, SamplingParams
from pipeline.runtime.serving.beam_search import BeamSearch
from pipeline.runtime.serving.scheduler import Scheduler
from pipeline.runtime.triton.io import response_arrays
from tests.runtime.drive import Collector
from tests.runtime.fixtures import engine_greedy, write_engine

PROMPT = [1, 5, 9, 13, 2, 7]
N = 10


@pytest.fixture(scope="module")
def beam_engine(hf_model, module_tmp) -> Engine:
    folder = module_tmp("beam") / "engine"
    return Engine.load(write_engine(hf_model, folder, max_beam_width=4, gather_context_logits=True))


@pytest.fixture(scope="module")
def hf(hf_model):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(hf_model).eval()


def request(width: int, end_id: int | None = None, prompt=PROMPT, rid: str = "b", **sampling) -> GenerationRequest:
    return GenerationRequest(
        rid,
        tuple(prompt),
        N,
        end_id=end_id,
        exclude_input_in_output=True,
        return_log_probs=True,
        sampling=SamplingParams(beam_width=width, **sampling),
    )


def serve(engine: Engine, *requests: GenerationRequest, **kw) -> Collector:
    sched, got = Scheduler(engine, **kw), Collector()
    for r in requests:
        sched.submit(r, got.sink(r.request_id))
    sched.run_until_idle()
    return got


def hf_beams(hf, prompt, width, end_id, length_penalty=0.0, early_stopping=True) -> list[list[int]]:
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            num_beams=width,
            num_return_sequences=width,
            do_sample=False,
            max_new_tokens=N,
            length_penalty=length_penalty,
            early_stopping=early_stopping,
            eos_token_id=end_id,
            pad_token_id=end_id,
        )
    beams = []
    for row in out.tolist():
        generated = row[len(prompt) :]
        beams.append(generated[: generated.index(end_id)] if end_id in generated else generated)
    return beams


def full_log_probs(engine: Engine, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """log p(token_i | prefix) of every generated token (and one row past it), from one forward."""
    seq = prompt + tokens
    logits = engine.forward([StepInput(engine.new_cache(len(seq)), seq, Logits.ALL)])[0].logits
    return torch.log_softmax(logits[len(prompt) - 1 :].double(), dim=-1)


def end_candidates(engine: Engine) -> list[int]:
    """Tokens the beams produce without an end id: as end ids they end beams mid-way."""
    (out,) = [serve(engine, request(3)).final("b")]
    assert out.beams is not None
    return sorted({t for beam in out.beams for t in beam.tokens[1:6]})[:3]


def test_beam_width_1_is_greedy(beam_engine):
    search = BeamSearch(request(1), beam_engine.config.limits.max_seq_len, 0)
    cache = beam_engine.new_cache(len(PROMPT) + N)
    search.start(cache, beam_engine.forward([StepInput(cache, PROMPT)])[0].logits[-1])
    while not search.done:
        search.advance(beam_engine.forward(search.inputs()))
    (beam,) = search.results()
    assert list(beam.tokens) == engine_greedy(beam_engine, PROMPT, N)


def test_two_beams_distinct_ordered_and_scored(beam_engine, hf):
    out = serve(beam_engine, request(2)).final("b")
    assert out.beams is not None and len(out.beams) == 2
    first, second = out.beams
    assert first.tokens != second.tokens and first.cum_log_prob >= second.cum_log_prob
    assert [list(b.tokens) for b in out.beams] == hf_beams(hf, PROMPT, 2, end_id=10**6)
    assert list(first.tokens) != engine_greedy(beam_engine, PROMPT, N) or first.cum_log_prob >= second.cum_log_prob
    for beam in out.beams:
        want = full_log_probs(beam_engine, PROMPT, list(beam.tokens))
        per_token = [float(want[i, t]) for i, t in enumerate(beam.tokens)]
        assert np.allclose(beam.log_probs, per_token, atol=1e-4)
        assert beam.cum_log_prob == pytest.approx(sum(per_token), abs=1e-3)


@pytest.mark.parametrize(
    "width, length_penalty, early_stopping",
    [(2, 0.0, 1), (3, 0.0, 1), (3, 1.0, 1), (2, 2.0, 1), (3, 0.0, 0), (3, -1.0, 2)],
)
def test_end_id_ends_beams_as_hugging_face_does(beam_engine, hf, width, length_penalty, early_stopping):
    ended = 0
    for end_id in end_candidates(beam_engine):
        r = request(width, end_id, length_penalty=length_penalty, early_stopping=early_stopping)
        out = serve(beam_engine, r).final("b")
        assert out.beams is not None
        hf_stop = {1: True, 0: False}.get(early_stopping, "never")
        assert [list(b.tokens) for b in out.beams] == hf_beams(hf, PROMPT, width, end_id, length_penalty, hf_stop)
        for beam in out.beams:
            assert end_id not in beam.tokens
            want = full_log_probs(beam_engine, PROMPT, list(beam.tokens))
            total = sum(float(want[i, t]) for i, t in enumerate(beam.tokens))
            if len(beam.tokens) < N:  # ended by the end id: its log-probability is in the sum
                ended += 1
                total += float(want[len(beam.tokens), end_id])
            assert beam.cum_log_prob == pytest.approx(total, abs=1e-3)
    assert ended or length_penalty > 1  # some beam really ended on the end id (a strong penalty prefers long ones)


def test_diversity_rate_penalises_later_beams(beam_engine):
    """diversity_rate x the parent beam's index joins each candidate's value: at -100 every step's
    winners continue beam 0, so the beams share all but their last token, and no penalty is in a sum."""
    out = serve(beam_engine, request(3, beam_search_diversity_rate=-100.0)).final("b")
    assert out.beams is not None and len({b.tokens[:-1] for b in out.beams}) == 1
    assert len({b.tokens for b in out.beams}) == 3
    for beam in out.beams:
        assert beam.cum_log_prob == pytest.approx(sum(beam.log_probs), abs=1e-4)
    plain = serve(beam_engine, request(3)).final("b")
    assert plain.beams is not None and len({b.tokens[:-1] for b in plain.beams}) > 1  # else this test proves nothing


def test_beams_batched_with_other_requests_and_streamed(beam_engine):
    alone = serve(beam_engine, request(3)).final("b")
    greedy = GenerationRequest("g", (3, 4, 5), N, exclude_input_in_output=True)
    streamed = dataclasses.replace(request(3), request_id="s", streaming=True)
    got = serve(beam_engine, request(3), greedy, streamed, request(2, prompt=[8, 8, 8], rid="b2"))
    assert same_beams(got.final("b").beams, alone.beams)  # batched matmuls round differently: scores approx
    assert got.final("g").tokens == engine_greedy(beam_engine, [3, 4, 5], N)
    responses = got.outputs["s"]
    assert len(responses) == N and all(r.beams is not None and len(r.beams) == 3 for r in responses)
    assert same_beams(responses[-1].beams, alone.beams)  # every response carries whole beams; the last the final ones
    assert [len(r.beams[0].tokens) for r in responses] == list(range(1, N + 1))  # type: ignore[index]


def same_beams(got, want) -> bool:
    return [b.tokens for b in got] == [b.tokens for b in want] and np.allclose(
        [b.cum_log_prob for b in got], [b.cum_log_prob for b in want], atol=1e-4
    )


def test_kv_cache_per_beam_and_block_accounting(beam_engine):
    search = BeamSearch(request(3), beam_engine.config.limits.max_seq_len, len(PROMPT) // 32)
    cache = beam_engine.new_cache(len(PROMPT) + N)
    search.start(cache, beam_engine.forward([StepInput(cache, PROMPT)])[0].logits[-1])
    caches = [beam.cache for beam in search.beams]
    assert len({id(c) for c in caches}) == 3 and any(c is cache for c in caches)
    assert all(c.length == len(PROMPT) for c in caches)
    keys = [c.keys[0][0][:, : len(PROMPT)] for c in caches]
    assert all(torch.equal(keys[0], k) for k in keys)  # forks copy the prompt's keys
    search.advance(beam_engine.forward(search.inputs()))
    assert all(beam.cache.length == len(PROMPT) + 1 for beam in search.beams)
    assert search.blocks == 3  # one (partial) block per beam: nothing shared for a 6-token prompt
    out = serve(beam_engine, dataclasses.replace(request(3), return_perf_metrics=True)).final("b")
    assert out.metrics.kv_cache_alloc_new_blocks == 3


def test_refusals(beam_engine, spec_engines):
    from pipeline.runtime.spec_decode.factory import MethodSettings, make_method
    from tests.runtime.fixtures import LOOKAHEAD

    too_wide = serve(beam_engine, request(8)).final("b")
    assert too_wide.error == "Requested beam width 8 is larger than configured max beam width 4"
    engine = spec_engines("lookahead")
    method, _ = make_method(engine, MethodSettings("lookahead", lookahead=LOOKAHEAD))
    refused = serve(engine, request(2), method=method).final("b")
    assert refused.error == "Decoding mode is Lookahead, but beamWidth != 1 (2 != 1)"
    too_many = dataclasses.replace(request(2), num_return_beams=3)
    assert serve(beam_engine, too_many).final("b").error == (
        "num_return_sequences 3 must be between 1 and beam_width 2 with beam search"
    )


def test_beam_response_arrays(beam_engine):
    r = dataclasses.replace(request(2), exclude_input_in_output=False)
    out = serve(beam_engine, r).final("b")
    arrays = response_arrays(out, r, frozenset())
    lengths = arrays["sequence_length"]
    assert arrays["output_ids"].shape == (1, 2, int(lengths.max())) and lengths.tolist() == [[len(PROMPT) + N] * 2]
    assert arrays["output_ids"][0, 1, len(PROMPT) :].tolist() == list(out.beams[1].tokens)  # type: ignore[index]
    assert arrays["cum_log_probs"].shape == (1, 2) and arrays["output_log_probs"].shape == (1, 2, N)


# -- beam search with stop words, generation logits, num_return_sequences ------------------------------


def test_stop_word_finishes_the_beams_that_end_with_it(beam_engine):
    plain = serve(beam_engine, request(3)).final("b")
    assert plain.beams is not None
    word = plain.beams[0].tokens[3]  # a token the best beam produces mid-way
    r = dataclasses.replace(request(3), stop_words=((word,),))
    out = serve(beam_engine, r).final("b")
    assert out.beams is not None and len(out.beams) == 3
    stopped = [b for b in out.beams if b.tokens[-1] == word]
    assert stopped and all(len(b.tokens) < N for b in stopped)  # the stop word ended them, and stays in them
    for beam in out.beams:
        assert word not in beam.tokens[:-1]  # no beam goes on past a stop word
        want = full_log_probs(beam_engine, PROMPT, list(beam.tokens))
        per_token = [float(want[i, t]) for i, t in enumerate(beam.tokens)]
        assert np.allclose(beam.log_probs, per_token, atol=1e-4)
        assert beam.cum_log_prob == pytest.approx(sum(per_token), abs=1e-3)  # the end id that ended it: log p 0
    assert out.beams != plain.beams


def test_stop_word_starting_in_the_prompt_ends_the_best_beam_at_once(beam_engine):
    """(last prompt token, the best first token) is a stop word: that one-token beam finishes at the next
    step with its cumulative log-probability, which no longer beam can beat (length_penalty 0)."""
    plain = serve(beam_engine, request(2)).final("b")
    assert plain.beams is not None
    first = plain.beams[0].tokens[0]
    out = serve(beam_engine, dataclasses.replace(request(2), stop_words=((PROMPT[-1], first),))).final("b")
    assert out.beams is not None and out.beams[0].tokens == (first,)
    assert len(out.beams[1].tokens) > 1 and out.beams[1].tokens[0] != first


def test_generation_logits_follow_each_beams_own_history(beam_engine):
    r = dataclasses.replace(request(3), return_generation_logits=True, exclude_input_in_output=False)
    out = serve(beam_engine, r).final("b")
    assert out.beams is not None and len({b.tokens[:3] for b in out.beams}) > 1  # the beams were reselected
    for beam in out.beams:
        seq = PROMPT + list(beam.tokens)
        full = beam_engine.forward([StepInput(beam_engine.new_cache(len(seq)), seq, Logits.ALL)])[0].logits
        want = full[len(PROMPT) - 1 : len(seq) - 1].float().numpy()
        assert len(beam.generation_logits) == len(beam.tokens)
        assert np.allclose(np.stack(beam.generation_logits), want, atol=1e-4)
    arrays = response_arrays(out, r, frozenset())
    vocab = beam_engine.config.model.vocab_size
    assert arrays["generation_logits"].shape == (1, 3, N, vocab)
    assert np.array_equal(arrays["generation_logits"][0, 1], np.stack(out.beams[1].generation_logits))


def test_generation_logits_of_beams_of_different_lengths_are_padded(beam_engine):
    for end_id in end_candidates(beam_engine):
        r = dataclasses.replace(request(3, end_id), return_generation_logits=True)
        out = serve(beam_engine, r).final("b")
        assert out.beams is not None
        lengths = [len(b.tokens) for b in out.beams]
        if len(set(lengths)) > 1:
            logits = response_arrays(out, r, frozenset())["generation_logits"]
            assert logits.shape[:3] == (1, 3, max(lengths))
            short = lengths.index(min(lengths))
            assert not logits[0, short, min(lengths) :].any()  # zeros past a beam's end
            return
    pytest.fail("no end id gave beams of different lengths")


def test_num_return_beams_returns_the_best_ones(beam_engine):
    full = serve(beam_engine, request(3)).final("b")
    two = serve(beam_engine, dataclasses.replace(request(3), num_return_beams=2)).final("b")
    assert full.beams is not None and two.beams == full.beams[:2]
    streamed = dataclasses.replace(request(3), num_return_beams=1, streaming=True, request_id="s")
    responses = serve(beam_engine, streamed).outputs["s"]
    assert all(r.beams is not None and len(r.beams) == 1 for r in responses)
    assert responses[-1].beams == full.beams[:1]


# -- context logits -----------------------------------------------------------------------------------


def test_context_logits_equal_the_full_prompt_forward(beam_engine, engine):
    prompt = list(range(3, 16))
    want = beam_engine.forward([StepInput(beam_engine.new_cache(len(prompt)), prompt, Logits.ALL)])[0].logits
    r = GenerationRequest("c", tuple(prompt), 4, exclude_input_in_output=True, return_context_logits=True)
    limits = dataclasses.replace(beam_engine.config.limits, max_num_tokens=5)  # chunked prefill: 5 + 5 + 3
    beams = dataclasses.replace(r, sampling=SamplingParams(beam_width=2))
    streams = (dataclasses.replace(r, streaming=True), dataclasses.replace(beams, streaming=True))
    for req in (r, beams, *streams):
        every = serve(beam_engine, req, limits=limits).outputs["c"]
        assert len(every) == (4 if req.streaming else 1)
        for got in every:  # every response carries them, streaming ones too (as TensorRT-LLM's results)
            assert got.context_logits is not None and got.context_logits.shape == (len(prompt), want.shape[1])
            assert np.allclose(got.context_logits, want.numpy(), atol=1e-5)
            assert response_arrays(got, req, frozenset())["context_logits"].shape == (1, len(prompt), want.shape[1])
    assert serve(beam_engine, r).final("c").tokens == engine_greedy(beam_engine, prompt, 4)
    refused = serve(engine, r).final("c")  # the session engine is built without gather_context_logits
    assert refused.error is not None and "gather_context_logits" in refused.error
