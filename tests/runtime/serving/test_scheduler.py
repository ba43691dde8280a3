"""In-flight batching, stop rules, sampling and errors, driven through the scheduler directly."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from pipeline.runtime.request import FinishReason, GenerationRequest, SamplingParams, StepOutput
from pipeline.runtime.serving.metrics import StepStats
from pipeline.runtime.serving.scheduler import Scheduler
from tests.runtime.drive import Collector
from tests.runtime.fixtures import PROMPTS, engine_greedy


def req(rid: str, prompt: list[int], n: int = 8, **kw) -> GenerationRequest:
    return GenerationRequest(rid, tuple(prompt), n, exclude_input_in_output=True, **kw)


def run(engine, requests: list[GenerationRequest], **kw) -> tuple[Collector, list[StepStats]]:
    stats: list[StepStats] = []
    sched = Scheduler(engine, on_step=stats.append, **kw)
    got = Collector()
    for r in requests:
        sched.submit(r, got.sink(r.request_id))
    sched.run_until_idle()
    return got, stats


@pytest.fixture(scope="module")
def greedy(engine):
    return [engine_greedy(engine, p, 8) for p in PROMPTS]


def test_four_requests_batched_equal_each_alone(engine, greedy):
    got, stats = run(engine, [req(str(i), p) for i, p in enumerate(PROMPTS)])
    assert [got.final(str(i)).tokens for i in range(4)] == greedy
    assert all(got.final(str(i)).reason is FinishReason.LENGTH for i in range(4))
    assert stats[0].batch_size == 4 and stats[0].prefill_tokens == sum(map(len, PROMPTS))
    assert len(stats) == 8  # one prefill step + 7 batched decode steps


def test_requests_join_mid_flight(engine, greedy):
    sched, got = Scheduler(engine), Collector()
    sizes: list[int] = []
    sched.on_step = lambda s: sizes.append(s.batch_size)
    for i in (0, 1):
        sched.submit(req(str(i), PROMPTS[i]), got.sink(str(i)))
    for _ in range(3):
        sched.step()
    for i in (2, 3):
        sched.submit(req(str(i), PROMPTS[i]), got.sink(str(i)))
    sched.run_until_idle()
    assert [got.final(str(i)).tokens for i in range(4)] == greedy
    assert sizes[:4] == [2, 2, 2, 4]  # the newcomers' prefill rides along with the decode steps


def test_chunked_prefill_and_batch_limit(engine, greedy):
    """max_num_tokens 5 splits the 13-token prompt; max_batch_size 2 queues the rest."""
    limits = dataclasses.replace(engine.config.limits, max_num_tokens=5, max_batch_size=2)
    got, stats = run(engine, [req(str(i), p) for i, p in enumerate(PROMPTS)], limits=limits)
    assert [got.final(str(i)).tokens for i in range(4)] == greedy
    assert max(s.batch_size for s in stats) <= 2
    assert max(s.input_tokens for s in stats) == 5


def test_max_tokens_end_id_and_stop_words(engine, greedy):
    out = greedy[0]
    end_at = next(i for i in range(1, 8) if out[i] not in out[:i])
    stop = tuple(out[2:4])
    stop_at = next(i for i in range(1, 8) if tuple(out[max(0, i - 1) : i + 1]) == stop)
    got, _ = run(
        engine,
        [
            req("len", PROMPTS[0], 3),
            req("end", PROMPTS[0], end_id=out[end_at]),
            req("stop", PROMPTS[0], stop_words=((90, 91), stop)),
        ],
    )
    assert got.final("len").tokens == out[:3] and got.final("len").reason is FinishReason.LENGTH
    assert got.final("end").tokens == out[:end_at] and got.final("end").reason is FinishReason.END_ID
    assert got.final("stop").tokens == out[: stop_at + 1] and got.final("stop").reason is FinishReason.STOP_WORDS


def test_end_id_may_be_the_first_token_unless_min_tokens_is_above_one(engine, greedy):
    """TensorRT-LLM's min_tokens default 1 bans nothing (its penalty layer skips the default): an end id
    the model says first ends the request with no tokens, as transformers' greedy search does; min_tokens
    2 skips it at the first step."""
    first = greedy[0][0]
    for sampling in (SamplingParams(), SamplingParams(min_tokens=1), SamplingParams(min_tokens=0)):
        got, _ = run(engine, [req("d", PROMPTS[0], 4, end_id=first, sampling=sampling)])
        assert got.final("d").tokens == [] and got.final("d").reason is FinishReason.END_ID, sampling
    two = req("two", PROMPTS[0], 4, end_id=first, sampling=SamplingParams(min_tokens=2))
    got, _ = run(engine, [two])
    assert got.final("two").tokens and got.final("two").tokens[0] != first


def test_input_included_unless_excluded(engine, greedy):
    full = dataclasses.replace(req("full", PROMPTS[1]), exclude_input_in_output=False)
    got, _ = run(engine, [full])
    assert got.final("full").tokens == PROMPTS[1] + greedy[1]


def test_streaming_sends_one_response_per_step(engine, greedy):
    got, _ = run(engine, [req("s", PROMPTS[0], streaming=True), req("n", PROMPTS[0])])
    streamed = got.outputs["s"]
    assert len(streamed) == 8 and [len(o.tokens) for o in streamed] == [1] * 8
    assert got.tokens("s") == got.final("n").tokens == greedy[0]
    got.final("s")


def test_seeded_sampling_is_reproducible_and_batch_independent(engine):
    hot = SamplingParams(temperature=1.5, top_k=50, top_p=0.95, seed=1234)
    alone, _ = run(engine, [req("a", PROMPTS[0], 16, sampling=hot)])
    crowd, _ = run(
        engine,
        [
            req("b", PROMPTS[2], 16, sampling=dataclasses.replace(hot, seed=1)),
            req("a", PROMPTS[0], 16, sampling=hot),
            req("c", PROMPTS[0], 16, sampling=dataclasses.replace(hot, seed=99)),
        ],
    )
    assert alone.final("a").tokens == crowd.final("a").tokens
    assert crowd.final("c").tokens != crowd.final("a").tokens  # another seed, another text


def test_top_k_1_equals_greedy(engine, greedy):
    got, _ = run(
        engine,
        [
            req("k1", PROMPTS[3], sampling=SamplingParams(temperature=2.0, top_k=1, seed=5)),
            req("p0", PROMPTS[3], sampling=SamplingParams(temperature=0.0)),
        ],
    )
    assert got.final("k1").tokens == got.final("p0").tokens == greedy[3]


def test_limit_errors_answer_only_that_request(engine, greedy):
    limits = engine.config.limits
    too_long = req("long", list(range(limits.max_input_len + 1)))
    too_much = req("much", PROMPTS[0], limits.max_seq_len)
    got, _ = run(engine, [req("ok", PROMPTS[0]), too_long, too_much, req("empty", []), req("oov", [1, 10_000])])
    assert got.final("ok").tokens == greedy[0]
    assert "the prompt has 65 tokens, more than the engine's max_input_len 64" in got.final("long").error
    assert "exceed the engine's max_seq_len 128" in got.final("much").error
    assert "empty" in got.final("empty").error and "outside the vocabulary" in got.final("oov").error
    assert all(got.final(r).reason is FinishReason.ERROR for r in ("long", "much", "empty", "oov"))


def test_cancellation_by_id_and_by_disconnect(engine, greedy):
    sched, got = Scheduler(engine, cancel_check_period_s=0.0), Collector()
    gone = threading.Event()
    sched.submit(req("stop-me", PROMPTS[0], 50), got.sink("stop-me"))
    sched.submit(req("hang-up", PROMPTS[1], 50, streaming=True), got.sink("hang-up"), gone.is_set)
    sched.submit(req("keep", PROMPTS[0]), got.sink("keep"))
    for _ in range(3):
        sched.step()
    assert sched.cancel("stop-me") and not sched.cancel("unknown")
    gone.set()
    sched.run_until_idle()
    assert got.final("stop-me").reason is FinishReason.CANCELLED
    assert got.final("stop-me").tokens == greedy[0][:3]  # what was generated before the cancel
    assert got.final("hang-up").reason is FinishReason.CANCELLED
    assert got.final("keep").tokens == greedy[0]


def test_a_stop_during_the_disconnect_check_is_not_lost(engine):
    """Triton's is_cancelled is an IPC round trip: a stop for the same request may arrive on another
    thread while the scheduler waits for it, and the check's "still connected" must not undo it."""
    sched, got = Scheduler(engine, cancel_check_period_s=0.0), Collector()

    def connected_while_stopped() -> bool:
        sched.cancel("stopped")  # the stop arrives during the check
        return False  # the client is still connected

    sched.submit(req("stopped", PROMPTS[0], 50), got.sink("stopped"), connected_while_stopped)
    sched.run_until_idle()
    assert got.final("stopped").reason is FinishReason.CANCELLED
    assert len(got.final("stopped").tokens) < 50


def test_failing_sink_cancels_only_its_request(engine, greedy):
    sched, got = Scheduler(engine), Collector()

    def broken(_: StepOutput) -> None:
        raise ConnectionError("client gone")

    sched.submit(req("broken", PROMPTS[0], 50, streaming=True), broken)
    sched.submit(req("fine", PROMPTS[0]), got.sink("fine"))
    steps = sched.run_until_idle()
    assert got.final("fine").tokens == greedy[0] and steps < 12


def test_background_loop_serves_concurrent_submitters(engine, greedy):
    sched, got = Scheduler(engine), Collector()
    done = {str(i): threading.Event() for i in range(4)}
    sinks = {rid: got.sink(rid) for rid in done}

    def sink_for(rid: str):
        def sink(out: StepOutput) -> None:
            sinks[rid](out)
            if out.finished:
                done[rid].set()

        return sink

    sched.start()
    try:
        threads = [
            threading.Thread(target=sched.submit, args=(req(str(i), p), sink_for(str(i))))
            for i, p in enumerate(PROMPTS)
        ]
        for t in threads:
            t.start()
        assert all(event.wait(30) for event in done.values())
    finally:
        sched.stop()
    assert [got.final(str(i)).tokens for i in range(4)] == greedy


def test_perf_metrics_for_plain_decoding(engine):
    got, _ = run(engine, [req("m", PROMPTS[0], 5, return_perf_metrics=True)])
    m = got.final("m").metrics
    assert (m.total_draft_tokens, m.total_accepted_draft_tokens, m.acceptance_rate, m.forward_steps) == (0, 0, 0.0, 5)
    assert m.arrival_time_ns <= m.first_scheduled_time_ns <= m.first_token_time_ns <= m.last_token_time_ns


def test_in_flight_count_follows_submissions_and_cancellations(engine):
    """The backend's in-flight gauge: told on every submit and at the end of every step, so a request
    the client abandoned leaves it at the step that drops it."""
    counts: list[int] = []
    sched, got = Scheduler(engine, cancel_check_period_s=0.0, on_active=counts.append), Collector()
    gone = threading.Event()
    sched.submit(req("abandoned", PROMPTS[0], 50, streaming=True), got.sink("abandoned"), gone.is_set)
    sched.submit(req("short", PROMPTS[1], 2), got.sink("short"))
    assert counts == [1, 2]
    sched.step()
    sched.step()  # "short" is done: prefill, then its second token
    assert counts[-1] == 1
    gone.set()
    sched.step()
    assert counts[-1] == 0 and got.final("abandoned").reason is FinishReason.CANCELLED


def test_values_outside_the_vocabulary_are_refused(engine):
    vocab, longest = engine.config.model.vocab_size, engine.config.limits.max_seq_len
    got, _ = run(
        engine,
        [
            req("end", PROMPTS[0], end_id=vocab),
            req("pad", PROMPTS[0], pad_id=-1),
            req("stop", PROMPTS[0], stop_words=((1,) * (longest + 1),)),
            req("no-end", PROMPTS[0], end_id=-1),
        ],
    )
    assert got.final("end").error == f"end_id {vocab} is not within acceptable range [-1, {vocab}) (the vocabulary)"
    assert got.final("pad").error == f"pad_id -1 is outside the vocabulary [0, {vocab})"
    assert got.final("stop").error.startswith(f"stop_words_list: word 0 has {longest + 1} tokens")
    assert got.final("no-end").reason is FinishReason.LENGTH
