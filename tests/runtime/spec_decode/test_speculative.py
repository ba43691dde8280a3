"""Medusa, EAGLE-1, EAGLE-2, Lookahead and NGram on the reference backend: lossless, measured, state kept right.

Every method's greedy output must equal plain greedy decoding of the same engine, token for token,
one request at a time and with 4 requests in flight, at tp=1, tp=2 and on FP8 engines. The heads
are fitted to be right often and still wrong often (tests/runtime/fixtures.py), and every test also
asserts draft tokens > accepted > 0: skipping verification (accepting every draft) would change
the text, and rejecting everything would fail the acceptance check.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pipeline.checkpoint.reference_forward import ReferenceModel
from pipeline.errors import InputError
from pipeline.methods.lookahead import LookaheadConfig
from pipeline.runtime.model.engine import Engine, Logits, StepInput
from pipeline.runtime.request import FinishReason, GenerationRequest, SamplingParams
from pipeline.runtime.serving.metrics import SpecDecodingStats, SpecRequestMetrics
from pipeline.runtime.serving.scheduler import Scheduler
from pipeline.runtime.spec_decode.base import DecodingMethod, PlainDecoding, Sequence
from pipeline.runtime.spec_decode.eagle.drafter import DraftInput
from pipeline.runtime.spec_decode.factory import MethodSettings, make_method
from pipeline.runtime.spec_decode.lookahead import NgramPool, trie, window_layout
from pipeline.trees import CHAIN_3
from tests.runtime.drive import METHODS, decode, method_for, plain_tokens, requests, totals
from tests.runtime.drive import SPEC_PROMPTS as PROMPTS
from tests.runtime.fixtures import TREE


def assert_lossless(engine: Engine, method: DecodingMethod) -> SpecDecodingStats:
    want = plain_tokens(engine)
    for in_flight in (1, 4):
        got = decode(engine, method, requests(), in_flight)
        assert {rid: out.tokens for rid, out in got.items()} == want, f"{method.name}, {in_flight} in flight"
        stats = totals(got)
        assert stats.draft_tokens > stats.accepted_tokens > 0, stats.summary()
        m = got["0"].metrics
        assert m.total_draft_tokens == m.spec.draft_tokens and m.acceptance_rate == m.spec.acceptance_rate
    return stats


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("name", list(METHODS))
def test_greedy_output_equals_plain_decoding(spec_engines, name, tp):
    assert_lossless(*method_for(spec_engines, name, tp))


@pytest.mark.parametrize("name", list(METHODS))
def test_fp8_engine_greedy_output_equals_plain_decoding(spec_engines, name):
    """FP8 (W8A8, and FP8 KV except with EAGLE): activation scales are static per tensor, so a row's
    quantization does not depend on the other rows of the pass; only fp32 summation order differs
    between a tree pass and single-token steps. Exactness achieved: identical on this test set."""
    assert_lossless(*method_for(spec_engines, name, fp8=True))


# Mean acceptance length, fp32 tp=1, the 8 test prompts x 24 tokens, 4 in flight; recorded from this
# suite's fitted heads. A change of more than 10% means drafting or acceptance changed (vLLM's
# test_acceptance_length does the same with a 5% tolerance on real models).
RECORDED_ACCEPTANCE_LENGTH = {"medusa": 2.10, "eagle": 1.75, "eagle2": 1.78, "lookahead": 1.41, "ngram": 1.27}


@pytest.mark.parametrize("name", list(METHODS))
def test_acceptance_length_regression(spec_engines, name):
    engine, method = method_for(spec_engines, name)
    stats = totals(decode(engine, method, requests(), in_flight=4))
    expected = RECORDED_ACCEPTANCE_LENGTH[name]
    assert stats.mean_acceptance_length == pytest.approx(expected, rel=0.10), (
        f"{name}: mean acceptance length {stats.mean_acceptance_length:.3f}, recorded {expected} ({stats.summary()})"
    )
    per_position = stats.acceptance_per_position(method.draft_positions)
    assert per_position == sorted(per_position, reverse=True)  # a deeper draft needs the shallower one
    assert stats.mean_acceptance_length == pytest.approx(1 + sum(per_position))


def test_chunked_prompt_and_stop_rules(spec_engines):
    """EAGLE reads every prompt row's feature: a prompt split over steps must give the same drafter
    state; end_id and max_new_tokens cut a multi-token step in the middle."""
    engine, method = method_for(spec_engines, "eagle")
    long_prompt = [(7 * i + 3) % 96 for i in range(30)]
    want = decode(engine, PlainDecoding(), requests([long_prompt], 30), 1)["0"].tokens
    limits = dataclasses.replace(engine.config.limits, max_num_tokens=len(TREE) + 1)  # 11-token prompt chunks
    sched, out = Scheduler(engine, method, limits=limits), {}
    sched.submit(requests([long_prompt], 30)[0], lambda o: out.__setitem__("0", o) if o.finished else None)
    sched.run_until_idle()
    assert out["0"].tokens == want and out["0"].metrics.spec.accepted_tokens > 0
    end = want[12]
    for name in METHODS:
        engine, method = method_for(spec_engines, name)
        got = decode(engine, method, requests([long_prompt], 30, end_id=end), 1)["0"]
        assert got.tokens == want[: want.index(end)] and got.reason is FinishReason.END_ID
        got = decode(engine, method, requests([long_prompt], 7), 1)["0"]
        assert got.tokens == want[:7] and got.reason is FinishReason.LENGTH


def _manual_steps(engine: Engine, method: DecodingMethod, prompt: list[int], steps: int) -> Sequence:
    """Drive one request by hand, as the scheduler does (prompt, then ``steps`` generation steps)."""
    request = GenerationRequest("m", tuple(prompt), 64)
    seq = Sequence.create(0, request, engine.new_cache(len(prompt) + 64 + method.max_draft_len), SpecRequestMetrics())
    rows = engine.forward([StepInput(seq.cache, prompt, all_hidden=getattr(method, "prompt_hidden", False))])[0]
    seq.prefilled = len(prompt)
    seq.generated += method.accept(seq, rows, after_prefill=True).tokens
    for _ in range(steps):
        rows = engine.forward([method.generation_input(seq)])[0]
        accepted = method.accept(seq, rows, after_prefill=False)
        seq.metrics.spec.observe(accepted.draft_tokens, accepted.accepted_draft_tokens)
        seq.generated += accepted.tokens
    return seq


@pytest.mark.parametrize("tp", [1, 2])
def test_eagle_drafter_cache_holds_exactly_the_committed_entries(spec_engines, tp):
    """After accepted and rejected drafts, the drafter's KV cache equals a fresh drafter pass over
    the committed tokens with their true features (drafts never leak into it)."""
    engine, method = method_for(spec_engines, "eagle", tp)
    seq = _manual_steps(engine, method, PROMPTS[0], 8)
    assert seq.metrics.spec.draft_tokens > seq.metrics.spec.accepted_tokens > 0
    method.propose([seq])  # catch up: the cache now holds entries 0..n-1, n = committed base tokens
    state = seq.state["eagle"]
    committed = seq.tokens[:-1]  # the root (last token) is not in the base cache yet
    assert state.cache.length == seq.cache.length == len(committed)
    hidden = engine.forward([StepInput(engine.new_cache(len(committed)), committed, Logits.ALL)])[0].hidden
    fresh = method.drafter.new_cache(len(committed))
    method.drafter.forward([DraftInput(fresh, seq.tokens[1:], hidden, list(range(len(committed))))])
    for rank in range(tp):
        torch.testing.assert_close(
            state.cache.keys[rank][0][:, : fresh.length], fresh.keys[rank][0][:, : fresh.length], atol=1e-4, rtol=1e-4
        )
        torch.testing.assert_close(
            state.cache.values[rank][0][:, : fresh.length],
            fresh.values[rank][0][:, : fresh.length],
            atol=1e-4,
            rtol=1e-4,
        )


def test_eagle_drafter_matches_the_checkpoint_reference_forward(spec_engines):
    """The runtime drafter computes what reference_forward.eagle_forward (the converter's reference)
    computes, logits included."""
    engine, method = method_for(spec_engines, "eagle", tp=2)
    model = ReferenceModel(engine.config.raw["pretrained_config"], engine.ranks)
    tokens = torch.tensor(PROMPTS[0] + [5, 6, 7])
    features = torch.randn(len(tokens), engine.config.model.hidden_size)
    want_logits, want_h, _ = model.eagle_forward(tokens, features)
    cache = method.drafter.new_cache(len(tokens))
    (got_h,) = method.drafter.forward([DraftInput(cache, tokens.tolist(), features, list(range(len(tokens))))])
    torch.testing.assert_close(got_h, want_h, atol=1e-4, rtol=1e-4)
    tokens, log_probs = method.drafter.candidates(got_h, 3)
    want = torch.log_softmax(want_logits, -1).topk(3, dim=-1)
    assert torch.equal(tokens, want.indices)
    torch.testing.assert_close(log_probs, want.values, atol=1e-4, rtol=1e-4)


def test_drafter_and_heads_keep_no_duplicate_weights(spec_engines):
    """The eagle_nets.* copies and the heads' copies of the base lm_head are dropped at load (hundreds
    of MB of float32 on a real model); the engine's own tensors serve instead."""
    engine, method = method_for(spec_engines, "eagle", tp=2)
    for rank in engine.ranks:
        (net,) = rank.eagle
        assert net.lm_head is rank.lm_head
    engine = Engine.load(spec_engines("medusa", 2).config.folder)
    for rank in engine.ranks:  # the fixture's heads have their own lm_heads; make them the base one
        for head in rank.medusa:
            head.lm_head = rank.lm_head.clone()
    method, _ = make_method(engine, METHODS["medusa"][1])
    assert method.heads.lm_heads is None  # shared: one GEMM for every head
    for rank in engine.ranks:
        assert all(head.lm_head is rank.lm_head for head in rank.medusa)


def test_eagle_copies_that_differ_are_refused(spec_engines):
    """TensorRT-LLM runs eagle_nets.i at draft level i; the reference drafter runs one copy at every
    level, which is only right when the copies are equal."""
    engine = Engine.load(spec_engines("eagle").config.folder)
    engine.ranks[0].eagle[1].fc.weight[0, 0] += 1.0
    with pytest.raises(InputError, match="eagle_nets.* copies differ"):
        make_method(engine, METHODS["eagle"][1])


def test_medusa_heads_read_the_last_committed_token(spec_engines):
    engine, method = method_for(spec_engines, "medusa", tp=2)
    seq = _manual_steps(engine, method, PROMPTS[1], 6)
    committed = seq.tokens[:-1]
    hidden = engine.forward([StepInput(engine.new_cache(len(committed)), committed, Logits.LAST)])[0].hidden[-1]
    torch.testing.assert_close(seq.state["medusa"].hidden, hidden, atol=1e-4, rtol=1e-4)
    model = ReferenceModel(engine.config.raw["pretrained_config"], engine.ranks)
    torch.testing.assert_close(
        method.heads.logits(hidden[None], 3), model.medusa_logits(hidden[None]), atol=1e-4, rtol=1e-4
    )


def test_eagle2_dynamic_tree_size_rule(spec_engines):
    """TensorRT-LLM: top_k + top_k^2 (num_eagle_layers - 1) nodes, capped at max_draft_len (16 here)."""
    engine = spec_engines("eagle")
    for top_k, size in ((1, 3), (2, 10), (3, 16)):
        method, _ = make_method(
            engine, MethodSettings("eagle", eagle_dynamic_tree=True, eagle_dynamic_tree_max_top_k=top_k)
        )
        assert method.max_draft_len == size
        seq = _manual_steps(engine, method, PROMPTS[2], 1)
        method.propose([seq])
        tree = seq.state["eagle"].proposal.tree
        assert len(tree) == size and max(tree.depths()) <= 3
        assert assert_lossless(engine, method).verification_steps > 0


@pytest.mark.parametrize("per_request", [(2, 2, 1), (3, 3, 2), (4, 2, 4), (1, 3, 0), (1, 1, 0)])
def test_lookahead_per_request_configs(spec_engines, per_request):
    engine, method = method_for(spec_engines, "lookahead")
    got = decode(engine, method, requests(lookahead=LookaheadConfig(*per_request)), in_flight=4)
    assert {rid: out.tokens for rid, out in got.items()} == plain_tokens(engine)
    stats = totals(got)
    if per_request[1] == 1 or per_request[2] == 0:  # (1, 1, 0) is plain decoding; g = 0 verifies nothing
        assert stats.draft_tokens == 0 and stats.mean_acceptance_length == 1.0
    else:
        assert stats.draft_tokens > stats.accepted_tokens > 0
        assert max(len(p) for p in [stats.accepted_per_position]) <= per_request[1] - 1


@pytest.mark.parametrize(
    "per_request,words",
    [((5, 3, 4), "exceeds the server's"), ((4, 4, 4), "exceeds"), ((4, 3, 5), "exceeds"), ((2, 1, 1), "not legal")],
)
def test_lookahead_per_request_config_beyond_the_server_is_an_error(spec_engines, per_request, words):
    engine, method = method_for(spec_engines, "lookahead")
    bad = GenerationRequest("bad", (1, 2, 3), 4, lookahead=LookaheadConfig(*per_request))
    got = decode(engine, method, [bad, *requests(PROMPTS[:1], 4)], in_flight=4)
    assert got["bad"].reason is FinishReason.ERROR and words in got["bad"].error
    assert got["0"].tokens == plain_tokens(engine)["0"][:4]


def test_lookahead_window_mask_trie_and_pool():
    mask, offsets = window_layout(3, 3)  # levels 0 ([root, a, b]) and 1 ([c, d, e])
    assert offsets == (0, 1, 2, 1, 2, 3)
    assert mask.int().tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 0, 0, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],
        [1, 1, 1, 0, 0, 1],
    ]
    tree = trie([(5, 6), (5, 7), (8, 6)])
    assert tree.tokens == (5, 6, 7, 8, 6) and tree.parents == (-1, 0, 0, -1, 3)
    pool = NgramPool(3, capacity=2)
    pool.add([1, 2, 3, 1, 4, 5, 1, 2, 3, 1, 9, 9])
    assert pool.guess(1, 5) == [(9, 9), (2, 3)]  # (4, 5) evicted; (2, 3) re-inserted as recent
    assert pool.guess(7, 5) == []


def test_load_time_errors(spec_engines):
    plain, medusa, look = spec_engines(None), spec_engines("medusa"), spec_engines("lookahead")
    with pytest.raises(InputError, match="built without medusa"):
        make_method(plain, MethodSettings("medusa"))
    with pytest.raises(InputError, match="depth 4 exceeds the engine's 3 Medusa heads"):
        make_method(medusa, MethodSettings("medusa"))  # the default mc_sim_7b_63
    with pytest.raises(InputError, match="12 tree nodes exceed the engine's max_draft_len 10"):
        make_method(medusa, MethodSettings("medusa", medusa_choices=tuple((k,) for k in range(12))))
    with pytest.raises(InputError, match="needs max_draft_len 5 but the engine was built with 15"):
        make_method(look, MethodSettings("lookahead", lookahead=LookaheadConfig(2, 2, 4)))
    with pytest.raises(InputError, match="are not set"):
        make_method(look, MethodSettings("lookahead"))
    with pytest.raises(InputError, match="mutually exclusive"):
        make_method(spec_engines("eagle"), MethodSettings("eagle", eagle_choices=CHAIN_3, eagle_dynamic_tree=True))
    method, warnings = make_method(medusa, MethodSettings("top_k_top_p", medusa_choices=CHAIN_3))
    assert method.name == "medusa" and "overwriting decoding_mode to medusa" in warnings[0]
    assert make_method(plain, MethodSettings("top_k_top_p"))[0].name == "plain"


PENALTIES = {
    "repetition_penalty": 1.3,
    "presence_penalty": 0.4,
    "frequency_penalty": 0.2,
    "min_tokens": 6,
    "bad_words": ((5,), (7, 9)),
}


@pytest.mark.parametrize("name", list(METHODS))
def test_penalties_and_bans_apply_to_the_target_and_stay_lossless(spec_engines, name):
    """TensorRT-LLM applies penalties, bans and bias to the target's logits before acceptance, so the
    speculative output equals plain decoding with the same adjustments (and differs from none)."""
    engine, method = method_for(spec_engines, name)
    sampling = SamplingParams(**PENALTIES, embedding_bias=tuple(0.5 * (i % 3) for i in range(40)))
    adjusted = requests(sampling=sampling, end_id=3, return_log_probs=True, return_generation_logits=True)
    want = decode(engine, PlainDecoding(), adjusted, in_flight=1)
    got = decode(engine, method, adjusted, in_flight=4)
    assert {r: o.tokens for r, o in got.items()} == {r: o.tokens for r, o in want.items()}
    assert {r: o.tokens for r, o in want.items()} != plain_tokens(engine)
    for rid, out in got.items():
        assert not any(t == 5 for t in out.tokens)
        assert out.log_probs == pytest.approx(want[rid].log_probs, abs=1e-4)
        assert len(out.log_probs) == len(out.tokens) and all(lp <= 0 for lp in out.log_probs)
        assert out.cum_log_prob == pytest.approx(sum(out.log_probs), abs=1e-4)
        # The target's own rows, from the verified positions: the same as plain decoding's.
        assert len(out.generation_logits) == len(out.tokens)
        assert all(
            torch.allclose(torch.from_numpy(a), torch.from_numpy(b), atol=1e-4)
            for a, b in zip(out.generation_logits, want[rid].generation_logits)
        )
    stats = totals(got)
    assert stats.draft_tokens > stats.accepted_tokens > 0, stats.summary()
